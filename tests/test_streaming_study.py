"""The streaming study: a task's long validation sequence, the per-arm table of what dropping the
first tokens costs (its sentence chosen by the measurements), and claim 16 checked against it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.studies.report import streaming
from attnlab.studies.repro.streaming import checks_16, claim_16, streaming_measurements
from attnlab.studies.repro.verdict import AGREES, DEPENDS, DIFFERS, UNTESTED, verdict_of

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
    return next(a for a in streaming.summarise(records, SINKS) if a["arm"] == name)


def test_the_drop_sentence_follows_the_measurements():
    same = [_record("slot", s, 1.7, 1.7, 0.0) for s in range(3)]
    steady = [_record("softmax", s, 1.7 * (1.05 + 0.001 * s), 1.7, 0.99) for s in range(3)]
    uneven = [_record("uneven", s, p, 1.7, 0.99) for s, p in enumerate((1.71, 2.9, 1.72))]
    mixed = [_record("mixed", s, p, 1.7, 0.5) for s, p in enumerate((1.8, 1.6, 1.75))]
    records = same + steady + uneven + mixed
    a = _arm(records, "slot")
    assert a["drop_cost"]["changed"] == 0 and "less than 0.1 %" in streaming.drop_sentence(a)
    a = _arm(records, "softmax")
    assert a["drop_cost"]["beyond_noise"] and a["drop_cost"]["mean"] == pytest.approx(math.log(1.051), abs=1e-3)
    assert " raises perplexity by +5.1 %" in streaming.drop_sentence(a)
    a = _arm(records, "uneven")
    assert not a["drop_cost"]["beyond_noise"] and a["drop_cost"]["raised"] == 3
    assert "raises perplexity in 3 of 3 seeds" in streaming.drop_sentence(a)
    a = _arm(records, "mixed")
    assert a["drop_cost"]["raised"] == 2 and "no difference beyond seed noise" in streaming.drop_sentence(a)
    # Holm over the four arms: the p values are adjusted upwards, never below the raw ones
    for arm in streaming.summarise(records, SINKS):
        c = arm["drop_cost"]
        assert c["p"] is None or c["p_holm"] >= c["p"]


def _report(tmp_path: Path, study: str, records: list[dict], cache: int = 32) -> Path:
    report = {"setup": {"cache": cache, "sinks": SINKS}, "arms": streaming.summarise(records, SINKS)}
    (tmp_path / study).mkdir(parents=True, exist_ok=True)
    (tmp_path / study / "stream.json").write_text(json.dumps(report))
    return tmp_path


def test_claim_16_turns_with_the_measurements(tmp_path):
    free = [_record(n, s, 1.7, 1.7, 0.0) for n in ("slot", "sigmoid") for s in range(3)]
    costs = [_record("softmax", s, 1.8 + 0.01 * s, 1.7, 0.2, dormant=0.99) for s in range(3)]
    no_cost = [_record("softmax", s, 1.7, 1.7, 0.2, dormant=0.99) for s in range(3)]
    uneven = [_record("softmax", s, p, 1.7, 0.2, dormant=0.99) for s, p in enumerate((1.71, 2.9, 1.72))]
    no_sink = [_record("softmax", s, 1.7, 1.7, 0.05, dormant=0.1) for s in range(3)]

    agrees = claim_16(_report(tmp_path / "a", "streaming_bb", costs + free))
    assert agrees.verdict == AGREES  # the missing text study leaves only that setting untested
    assert [k.passed for k in agrees.checks] == [True, True, True, None]
    assert verdict_of(checks_16(streaming_measurements(tmp_path / "a"))) == AGREES

    assert claim_16(_report(tmp_path / "d", "streaming_bb", no_cost + free)).verdict == DIFFERS
    # every seed rose, but one seed carries the mean: its interval spans 0, so the data do not decide
    spread = claim_16(_report(tmp_path / "s", "streaming_bb", uneven + free))
    assert spread.verdict == UNTESTED and spread.checks[0].measured["seeds raised"] == "3 of 3"
    assert claim_16(_report(tmp_path / "u", "streaming_bb", no_sink + free)).verdict == UNTESTED

    both = _report(tmp_path / "b", "streaming_bb", costs + free)
    _report(both, "streaming", [_record("text softmax", s, 1.7, 1.7, 0.9) for s in range(3)], cache=128)
    assert claim_16(both).verdict == DEPENDS

    nothing = claim_16(tmp_path / "empty")
    assert nothing.verdict == UNTESTED and all(k.passed is None for k in nothing.checks)


def test_stream_study_evaluates_every_run_of_a_sweep(make_cfg, tmp_path, capsys):
    """Two short testbed runs as a sweep's jobs: each record is stream_report on the run's own
    checkpoint and its long validation sequence, and the files land in --out."""
    from attnlab.checkpointing import load_model
    from attnlab.stream import run_tokens, stream_report
    from attnlab.train import train

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
    streaming.main([str(sweep), "--cache", "8", "--sinks", "0,1", "--tokens", "40", "--out", str(out)])
    report = json.loads((out / "stream.json").read_text())
    assert (out / "stream.md").is_file() and (out / "stream.png").is_file()
    assert [a["arm"] for a in report["arms"]] == ["baseline (softmax)", "softmax_one (softmax + zero_logit escape)"]
    run = report["runs"][0]
    module = load_model(Path(run["run"]) / "checkpoints" / "last.ckpt")[0].eval()
    ids, _ = run_tokens(Path(run["run"]), module, Path(run["run"]) / "checkpoints" / "last.ckpt", None, 40)
    torch.manual_seed(0)
    direct = stream_report(module.model, ids, 8, [0, 1])
    assert [r["ppl"] for r in run["stream"]["rolling"]] == pytest.approx([r["ppl"] for r in direct["rolling"]])
    assert "bigram_backcopy" in report["setup"]["source"] and report["setup"]["tokens"] == 40


def test_stream_study_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        streaming.main([str(tmp_path / "nope"), "--cache", "8"])
    assert err.value.code == 2 and "SWEEP_DIR=" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        streaming.main([str(tmp_path), "--cache", "8", "--sinks", "0,9"])
    assert err.value.code == 2 and "--sinks" in capsys.readouterr().err
