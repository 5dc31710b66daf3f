"""The streaming study: a task's long validation sequence, the per-arm eviction measure (PPL(0 kept) /
PPL(4 kept) over seeds) and its verdict turning with the data, the committed stream.json's derived fields equal to what its
measured values give, and claim 16 judged on the verdict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.repro.streaming_claims import checks_16, claim_16, streaming_measurements
from attnlab.repro.verdict import verdict_of
from attnlab.studies import stream_study
from attnlab.util.files import json_safe
from attnlab.writing.pages import AGREES, DEPENDS, DIFFERS, PARTLY, UNTESTED

SINKS = [0, 1, 2, 4]


def test_the_testbed_streams_one_long_validation_sequence_the_same_for_every_seed():
    from attnlab.data.tasks import BigramBackcopyDataModule

    a, b = (BigramBackcopyDataModule(block_size=16, seed=s) for s in (0, 7))
    ids = a.stream_ids(300)
    assert len(ids) == 300 and ids[0] == a.n_tokens and (ids[1:] < a.n_tokens).all()
    np.testing.assert_array_equal(ids, b.stream_ids(300))
    for j in range(2, 300):  # the task's rule past the block: a trigger is followed by the token before it
        if a.is_trigger[ids[j - 1]] and j - 1 >= 1:
            assert ids[j] == ids[j - 2]


def _record(arm: str, seed: int, ppl0: float, ppl_kept: float, weight: float, dormant: float | None = None) -> dict:
    rolling = [{"sinks": k, "ppl": ppl0 if k == 0 else ppl_kept, "ppl_oracle_positions": 1.0} for k in SINKS]
    return {
        "arm": arm,
        "seed": seed,
        "run": f"/runs/{arm}/{seed}",
        "val_loss": 1.0,
        "first_token_weight": {"max_layer": weight, "dormant": dormant},
        "stream": {"rolling": rolling, "oracle": {"ppl": ppl0}, "dense": {"ppl": 2.0}},
    }


def _arm(records, name):
    return next(a for a in stream_study.summarise(records, SINKS) if a["arm"] == name)


def _ratios(name: str, ratios, weight: float = 0.99, dormant: float | None = None) -> list[dict]:
    return [_record(name, s, 1.7 * r, 1.7, weight, dormant) for s, r in enumerate(ratios)]


STREAMING_BB_BASELINE = (1.008, 1.707, 1.011, 1.240, 1.110, 1.010, 1.002, 1.003, 1.055, 1.001)


@pytest.mark.parametrize(
    "ratios, verdict",
    [
        ((3, 4, 5), stream_study.COLLAPSE),
        ((1.001, 1.0, 1.002), stream_study.NO_COST),
        ((1.0, 1.7, 1.01), stream_study.UNTESTED),
        ((1.0, 1.0, 1.0), stream_study.NO_COST),  # seeds that agree exactly: the interval is the point
        ((5.0,), stream_study.UNTESTED),  # one seed has no interval
        ((1.5, 1.6, 1.55), stream_study.UNTESTED),  # a steady cost below the doubling, at 3 seeds: sign p 0.25
        (STREAMING_BB_BASELINE, stream_study.COST),  # every seed above 1, one far out: sign p 2/1024
        (tuple(1 / r for r in STREAMING_BB_BASELINE), stream_study.GAIN),
    ],
)
def test_the_eviction_verdict_follows_the_per_seed_ratios(ratios, verdict):
    e = _arm(_ratios("arm", ratios), "arm")["eviction"]
    assert e["ratio"] == pytest.approx(list(ratios)) and e["n"] == len(ratios) and e["kept"] == max(SINKS)
    assert e["median"] == pytest.approx(float(np.median(ratios)))
    assert e["verdict"] == verdict
    if len(ratios) == 3:  # a median of 3 resampled values is the smallest or largest with chance 7/27 each
        assert e["ci"] == pytest.approx([min(ratios), max(ratios)], rel=1e-6)
    if len(ratios) == 10 and verdict == stream_study.COST:
        assert e["p_sign"] == pytest.approx(2 / 1024) and e["above"] == 10
        assert 1 < e["ci"][0] < e["median"] < e["ci"][1] < stream_study.COLLAPSE_RATIO


def test_the_eviction_interval_decides_at_its_bounds():
    assert _arm(_ratios("arm", (3, 4, 5)), "arm")["eviction"]["ci"][0] >= stream_study.COLLAPSE_RATIO
    lo, hi = _arm(_ratios("arm", (1.001, 1.0, 1.002)), "arm")["eviction"]["ci"]
    assert 1 / stream_study.NO_COST_RATIO <= lo <= 1 < hi <= stream_study.NO_COST_RATIO
    # the same cost over fewer, more uneven seeds: the lower bound falls below 2
    assert _arm(_ratios("arm", (2.5, 6.0)), "arm")["eviction"]["verdict"] == stream_study.UNTESTED


@pytest.mark.parametrize("study", ["streaming", "streaming_bb"])
def test_the_committed_stream_json_holds_what_its_measured_values_give(study):
    out = Path(__file__).resolve().parents[1] / "reports" / study
    report = json.loads((out / "stream.json").read_text())
    # every derived field is what the measured per-seed values give
    assert json_safe(stream_study.rerender(report), digits=6) == report
    for arm in report["arms"]:
        e = arm["eviction"]
        assert e["ratio"] == pytest.approx([math.exp(d) for d in arm["drop_cost"]["per_seed"]], rel=1e-5)
        assert e["ratio"] == pytest.approx([a / b for a, b in zip(arm["ppl"]["0"], arm["ppl"]["4"])], rel=1e-5)


def test_render_rebuilds_the_pages_from_stream_json_and_turns_with_its_data(tmp_path, capsys):
    records = _ratios("softmax", (1.0, 1.7, 1.01), dormant=0.99) + _ratios("sigmoid", (1.0, 1.0, 1.0), weight=0.0)
    report = {
        "study": "s",
        "sweep_dirs": ["logs/x"],
        "axes": ["variant"],
        "setup": {"cache": 8, "sinks": SINKS, "tokens": 40, "source": "t", "block_size": 16, "oracle_positions": 8},
        "arms": stream_study.summarise(records, SINKS),
        "runs": records,
    }
    report["setup"]["command"] = "attnlab stream-study"
    (tmp_path / "stream.json").write_text(json.dumps(report))
    stream_study.main(["--render", str(tmp_path)])
    rendered = json.loads((tmp_path / "stream.json").read_text())
    assert [a["eviction"]["verdict"] for a in rendered["arms"]] == [stream_study.UNTESTED, stream_study.NO_COST]
    assert (tmp_path / "stream.md").read_text() == stream_study.markdown(rendered)
    assert (tmp_path / "stream.png").is_file()
    # the uneven seed replaced by a third steady collapse: the stored log ratios alone turn the verdict
    rendered["arms"][0]["drop_cost"]["per_seed"] = [math.log(r) for r in (3, 4, 5)]
    (tmp_path / "stream.json").write_text(json.dumps(rendered))
    stream_study.main(["--render", str(tmp_path)])
    again = json.loads((tmp_path / "stream.json").read_text())
    assert again["arms"][0]["eviction"]["verdict"] == stream_study.COLLAPSE
    assert again["arms"][1] == rendered["arms"][1]


def _report(tmp_path: Path, study: str, records: list[dict], cache: int = 32) -> Path:
    report = {"setup": {"cache": cache, "sinks": SINKS}, "arms": stream_study.summarise(records, SINKS)}
    (tmp_path / study).mkdir(parents=True, exist_ok=True)
    (tmp_path / study / "stream.json").write_text(json.dumps(report))
    return tmp_path


def test_claim_16_turns_with_the_eviction_verdict(tmp_path):
    free = [r for n in ("slot", "sigmoid") for r in _ratios(n, (1.0, 1.0, 1.0), weight=0.0)]
    collapse = _ratios("softmax", (3, 4, 5), weight=0.2, dormant=0.99)
    no_cost = _ratios("softmax", (1.001, 1.0, 1.002), weight=0.2, dormant=0.99)
    uneven = _ratios("softmax", (1.0, 1.7, 1.01), weight=0.2, dormant=0.99)
    two_seeds = _ratios("softmax", (30, 40), weight=0.2, dormant=0.99)
    no_sink = _ratios("softmax", (3, 4, 5), weight=0.05, dormant=0.1)

    agrees = claim_16(_report(tmp_path / "a", "streaming_bb", collapse + free))
    assert agrees.verdict == AGREES  # the missing text study leaves only that setting untested
    assert [(k.id, k.passed) for k in agrees.checks] == [
        ("sink-eviction-costs", True),
        ("sink-eviction-collapses", True),
        ("no-sink-no-cost", True),
        ("no-sink-no-cost", True),
        ("sink-eviction-costs", None),
    ]
    assert verdict_of(checks_16(streaming_measurements(tmp_path / "a"))) == AGREES

    # a sink whose eviction costs nothing refutes the claim
    assert claim_16(_report(tmp_path / "d", "streaming_bb", no_cost + free)).verdict == DIFFERS
    # every seed rose, but one seed carries it: the interval spans both bounds, so the data do not decide
    spread = claim_16(_report(tmp_path / "s", "streaming_bb", uneven + free))
    costs_check = lambda claim: next(k for k in claim.checks if k.id == "sink-eviction-costs")  # noqa: E731
    collapses = lambda claim: next(k for k in claim.checks if k.id == "sink-eviction-collapses")  # noqa: E731
    assert spread.verdict == UNTESTED and costs_check(spread).measured["verdict"] == stream_study.UNTESTED
    # a doubling, but over two seeds: no verdict from two ratios, the claim untested
    short = claim_16(_report(tmp_path / "t", "streaming_bb", two_seeds + free))
    assert costs_check(short).measured["verdict"] == stream_study.UNTESTED and short.verdict == UNTESTED
    # a consistent cost far below a doubling (every seed above 1, the interval under 2): the claim holds,
    # StreamingLLM's magnitude (a detail) does not, so it reads partly
    steady = _ratios("softmax", STREAMING_BB_BASELINE, weight=0.2, dormant=0.99)
    costs = claim_16(_report(tmp_path / "c", "streaming_bb", steady + free))
    assert costs_check(costs).measured["verdict"] == stream_study.COST and costs_check(costs).passed is True
    assert collapses(costs).passed is False and costs.verdict == PARTLY
    # no sink formed: a collapse there does not test the sink's role
    assert claim_16(_report(tmp_path / "u", "streaming_bb", no_sink + free)).verdict == UNTESTED

    both = _report(tmp_path / "b", "streaming_bb", collapse + free)
    _report(both, "streaming", _ratios("text softmax", (1.0, 1.0, 1.0), weight=0.9), cache=128)
    assert claim_16(both).verdict == DEPENDS

    nothing = claim_16(tmp_path / "empty")
    assert nothing.verdict == UNTESTED and all(k.passed is None for k in nothing.checks)


def test_stream_study_evaluates_every_run_of_a_sweep(make_cfg, tmp_path, capsys):
    """Two short testbed runs as a sweep's jobs: each record is stream_report on the run's own
    checkpoint and its long validation sequence, and the files land in --out."""
    from attnlab.inference.stream import run_tokens, stream_report
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import train

    sweep = tmp_path / "sweep"
    for i, variant in enumerate(("baseline", "softmax_one")):
        cfg = make_cfg("experiment=streaming_bb", f"variant={variant}", "trainer.max_steps=4", "model.d_model=16")
        cfg.paths.output_dir = str(sweep / str(i))
        train(cfg)
        results = sweep / str(i) / "results.json"
        data = json.loads(results.read_text())
        data["overrides"] = [f"variant={variant}", "experiment=streaming_bb", "seed=0"]
        results.write_text(json.dumps(data))
    out = tmp_path / "out"
    stream_study.main([str(sweep), "--cache", "8", "--sinks", "0,1", "--tokens", "40", "--out", str(out)])
    report = json.loads((out / "stream.json").read_text())
    assert (out / "stream.md").is_file() and (out / "stream.png").is_file()
    assert [a["arm"] for a in report["arms"]] == ["baseline (softmax)", "softmax_one (softmax + zero_logit escape)"]
    run = report["runs"][0]
    module = load_model(Path(run["run"]) / "checkpoints" / "last.ckpt")[0].eval()
    ids, _ = run_tokens(Path(run["run"]), module, Path(run["run"]) / "checkpoints" / "last.ckpt", None, 40)
    torch.manual_seed(0)
    direct = stream_report(module.model, ids, 8, [0, 1])
    assert ids.shape == (1, 40) and report["setup"]["sequences"] == 1
    assert [r["ppl"] for r in run["stream"]["rolling"]] == pytest.approx([r["ppl"] for r in direct["rolling"]])
    assert "bigram_backcopy" in report["setup"]["source"] and report["setup"]["tokens"] == 40
    # the testbed's dormant and active queries split the positions past the first eviction between them
    for row in run["stream"]["rolling"]:
        assert set(row["classes"]) == {"dormant", "active"}
        assert sum(c["positions"] for c in row["classes"].values()) == run["stream"]["evicting_positions"]
    by_class = report["arms"][0]["eviction"]["by_class"]
    assert set(by_class) == {"dormant", "active"} and all(len(c["write_ratio"]) == 1 for c in by_class.values())
    # --sequences 3: three validation draws, the same for every run, the first of them the one above
    many = tmp_path / "many"
    args = ["--cache", "8", "--sinks", "0,1", "--tokens", "40", "--sequences", "3", "--out", str(many)]
    stream_study.main([str(sweep), *args])
    pooled = json.loads((many / "stream.json").read_text())
    three, _ = run_tokens(Path(run["run"]), module, Path(run["run"]) / "checkpoints" / "last.ckpt", None, 40, 3)
    assert torch.equal(three[0], ids[0]) and not torch.equal(three[1], three[0])
    assert pooled["setup"]["sequences"] == 3 and "3 validation sequences" in pooled["setup"]["source"]
    direct = stream_report(module.model, three, 8, [0, 1])
    assert [r["ppl"] for r in pooled["runs"][0]["stream"]["rolling"]] == pytest.approx(
        [r["ppl"] for r in direct["rolling"]],
        rel=1e-5,  # stream.json keeps 6 significant digits
    )
    assert pooled["runs"][0]["stream"]["evicting_positions"] == 3 * (39 - 8)


def test_the_eviction_cost_per_query_class_follows_its_own_seeds():
    """The dormant queries double their perplexity in every seed while the active ones pay nothing: the per
    class verdicts say so, and the write ratio is the geometric mean over seeds of 0 kept over 4 kept."""
    records = _ratios("arm", (1.5, 1.6, 1.55))
    for seed, rec in enumerate(records):
        for row in rec["stream"]["rolling"]:
            lost = row["sinks"] == 0
            row["classes"] = {
                "dormant": {
                    "positions": 90,
                    "ppl": 3.0 + 0.1 * seed if lost else 1.4,
                    "write_norm": [4.0 if lost else 1.0 + seed],
                },
                "active": {"positions": 10, "ppl": 2.0, "write_norm": [2.0]},
            }
    c = _arm(records, "arm")["eviction"]["by_class"]
    assert c["dormant"]["verdict"] == stream_study.COLLAPSE and c["active"]["verdict"] == stream_study.NO_COST
    assert c["dormant"]["positions"] == 90
    assert c["dormant"]["write_ratio"] == pytest.approx([(4.0 * 2.0 * (4 / 3)) ** (1 / 3)])
    assert c["active"]["write_ratio"] == pytest.approx([1.0])


def test_stream_study_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        stream_study.main([str(tmp_path / "nope"), "--cache", "8"])
    assert err.value.code == 2 and "SWEEP_DIR=" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        stream_study.main([str(tmp_path), "--cache", "8", "--sinks", "0,9"])
    assert err.value.code == 2 and "--sinks" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        stream_study.main([str(tmp_path)])
    assert err.value.code == 2 and "--cache" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # a report dir without its stream.json: nothing is written
        stream_study.main(["--render", str(tmp_path)])
    assert err.value.code == 2 and "--render=" in capsys.readouterr().err and not any(tmp_path.iterdir())
