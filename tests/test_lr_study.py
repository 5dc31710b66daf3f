"""The LR-sensitivity report: per-seed sensitivities over the grid, the critical rate, qk-norm's difference
judged against the seed-to-seed spread, the sentences' choices and the Fig. 1 plot, on fabricated runs."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from attnlab.studies.report import build_report
from attnlab.studies.report.aggregate import group_cells, load_runs, swept_axes
from attnlab.studies.report.lr import (
    arms,
    critical_sentences,
    qk_norm_findings,
    qk_sentence,
    size_trend,
    trend_sentence,
)

LRS = ["1e-3", "1e-2", "1e-1"]
VOCAB = 50  # initial loss ln 50 = 3.91


def fake(root, size, qk, lr, seed, loss, logit):
    run = root / f"{size}_{qk}_{lr}_{seed}"
    run.mkdir(parents=True)
    results = {
        "status": "ok" if loss is not None else "failed",
        "overrides": [f"model={size}", f"model.attention.qk_norm={qk}", f"optim.lr={lr}", f"seed={seed}"],
        "config": {"study": "lrfake", "seed": seed, "model": {"n_layer": 2, "d_model": 64 if size == "big" else 16}},
        "metrics": {"val/loss": loss, "attn/L0/max_logit": logit, "attn/L1/max_logit": logit / 2}
        if loss is not None
        else {},
    }
    (run / "results.json").write_text(json.dumps(results))
    (run / "vocab.json").write_text(json.dumps({"chars": [chr(65 + i) for i in range(VOCAB)]}))


def losses(size, qk, lr, seed):
    """Without qk-norm the large model comes apart at 1e-1 (diverges for seed 2); everything else is flat."""
    base = {"1e-3": 2.5, "1e-2": 2.0, "1e-1": 2.2}[lr] + 0.01 * seed
    if size == "big" and qk == "false" and lr == "1e-1":
        return None if seed == 2 else 3.6 + 0.01 * seed
    return base


@pytest.fixture
def study(tmp_path):
    for size in ("small", "big"):
        for qk in ("false", "true"):
            for lr in LRS:
                for seed in range(3):
                    logit = 500.0 if qk == "false" and lr == "1e-1" else 8.0
                    fake(tmp_path / "sweep", size, qk, lr, seed, losses(size, qk, lr, seed), logit)
    runs = load_runs(tmp_path / "sweep")
    axes = swept_axes(runs)
    return tmp_path, arms(group_cells(runs, axes), axes)


def test_per_seed_sensitivity_and_critical_rate(study):
    _, found = study
    big_off = next(a for a in found if a.size == "model=big" and a.arm == "qk_norm=false")
    init = math.log(VOCAB)
    expected = [
        statistics.fmean([2.5 + 0.01 * s, 2.0 + 0.01 * s, init if s == 2 else 3.6 + 0.01 * s]) - (2.0 + 0.01 * s)
        for s in range(3)
    ]
    assert big_off.per_seed() == pytest.approx(expected)
    assert big_off.critical_lr() == 1e-1 and big_off.failed[1e-1] == 1
    small_on = next(a for a in found if a.size == "model=small" and a.arm == "qk_norm=true")
    assert small_on.critical_lr() is None and small_on.best_lr == 1e-2
    assert big_off.ceiling == pytest.approx(init)  # no unigram level known: the initial loss
    assert big_off.logits[1e-1] == [pytest.approx(500.0), pytest.approx(250.0)]  # the failed seed has none


def test_the_critical_rate_is_measured_towards_the_unigram_level(tmp_path):
    """A loss that comes apart falls back to the unigram level: halfway there is the critical rate, even when
    it is far from halfway back to the initial loss."""
    for lr, loss in {"1e-3": 2.0, "1e-2": 2.2, "1e-1": 2.7}.items():
        fake(tmp_path / "s", "m", "false", lr, 0, loss, 8.0)
    runs = load_runs(tmp_path / "s")
    cells = group_cells(runs, ["optim.lr"])
    (plain_arm,) = arms(cells, ["optim.lr"])
    (arm,) = arms(cells, ["optim.lr"], context_free=2.75)
    assert plain_arm.critical_lr() is None  # 2.7 < 2.0 + 0.5 (ln 50 - 2.0) = 2.96
    assert arm.critical_lr() == 1e-1  # 2.7 >= 2.0 + 0.5 (2.75 - 2.0)
    assert "1 of 1 arms end within" in critical_sentences([arm])[1]


def test_qk_norm_and_size_are_judged_against_the_seed_spread(study):
    _, found = study
    qk = {f["size"]: f for f in qk_norm_findings(found)}
    assert qk["model=big"]["beyond_spread"] and qk["model=big"]["difference"] > 0.4
    assert not qk["model=small"]["beyond_spread"]  # identical per-seed values: nothing to tell apart
    trend = {t["arm"]: t for t in size_trend(found)}
    assert trend["qk_norm=false"]["beyond_spread"] and trend["qk_norm=false"]["large"] > trend["qk_norm=false"]["small"]
    assert not trend["qk_norm=true"]["beyond_spread"]
    said = qk_sentence(found)
    assert "lowers the LR sensitivity in 1 of 2" in said and "raises" not in said
    said = trend_sentence(found)
    assert "grows for qk_norm=false" in said and "the other 1" in said
    upper = {f["size"]: f for f in qk_norm_findings(found, upper=True)}
    assert upper["model=big"]["beyond_spread"] and not upper["model=small"]["beyond_spread"]
    flat = [a for a in found if a.arm == "qk_norm=true"]  # 2.0 at the best rate, 2.2 above it
    assert all(v == pytest.approx(0.1) for a in flat for v in a.per_seed(upper=True))


def test_the_report_carries_the_section_and_the_plot(study):
    root, _ = study
    summary = build_report(root / "sweep", reports=root / "reports")
    lr = summary["lr_sensitivity"]
    assert {(a["size"], a["arm"]) for a in lr["arms"]} == {
        (s, f"qk_norm={q}") for s in ("model=small", "model=big") for q in ("false", "true")
    }
    assert (root / "reports" / "lrfake" / "lr_sensitivity.png").stat().st_size > 0
    md = (root / "reports" / "lrfake" / "ablation.md").read_text()
    assert "LR sensitivity (Wortsman et al. 2023)" in md


def test_token_corpus_levels(tmp_path):
    """A corpus that cycles 0, 1, 2: the unigram level is ln 3, the bigram one near 0 with the smallest add-k
    (chosen on the train split's tail); a directory without the files has no level."""
    import numpy as np

    from attnlab.studies.report.baseline import SMOOTHING, token_levels

    ids = np.tile(np.arange(3, dtype=np.uint16), 400)
    ids.tofile(tmp_path / "train.bin")
    ids[:300].tofile(tmp_path / "val.bin")
    level = token_levels(tmp_path, vocab=3)
    assert level["unigram"] == pytest.approx(math.log(3), abs=1e-3)
    assert level["bigram_add_k"] == min(SMOOTHING) and level["bigram"] < 0.01
    assert token_levels(tmp_path / "missing", vocab=3) is None


def test_one_seed_is_untested_not_no_difference(tmp_path):
    for size in ("small", "big"):
        for qk in ("false", "true"):
            for lr in LRS:
                fake(tmp_path / "one", size, qk, lr, 0, losses(size, qk, lr, 0), 8.0)
    runs = load_runs(tmp_path / "one")
    axes = swept_axes(runs)
    found = arms(group_cells(runs, axes), axes)
    assert "untested" in qk_sentence(found) and "untested" in trend_sentence(found)
