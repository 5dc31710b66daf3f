"""A study's report from its runs: runs.csv holds one row per run and seed (the committed pages' render from it
is tests/test_committed_pages.py); verdicts follow the data (a shifted arm flips one); a sweep adds to a committed study
without duplicating a seed, other budgets are kept apart; no report names a machine path."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats as scipy_stats

from attnlab.config.compose import CONF_DIR, compose_config
from attnlab.config.schema import Schema
from attnlab.studies.report import build_report, write_report
from attnlab.studies.report.analysis import cells_from_runs, contrasts, question_of
from attnlab.studies.report.data import read_runs, write_runs
from attnlab.studies.report.provenance import one_experiment
from attnlab.training.results import PROVENANCE
from attnlab.util import significance

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
STUDIES = sorted(p.parent.name for p in REPORTS.glob("*/ablation.md"))
WITH_RUNS = sorted(p.parent.name for p in REPORTS.glob("*/runs.csv"))


def fake_run(root, name, overrides, metrics, status="ok", study="fake", n_layer=2, steps=1000):
    run = root / name
    run.mkdir(parents=True)
    config = {"study": study, "model": {"n_layer": n_layer}, "trainer": {"max_steps": steps}}
    (run / "results.json").write_text(
        json.dumps(
            {
                "status": status,
                "error": None if status == "ok" else "boom",
                "overrides": overrides,
                "config": config,
                "metrics": metrics,
            }
        )
    )


LOSSES = {  # six seeds a side: beyond the exact test's few, where Welch's t decides
    ("16", "none"): [2.00, 2.02, 2.04, 2.01, 2.03, 2.025],
    ("16", "inv_sqrt_d"): [1.80, 1.81, 1.83, 1.805, 1.82, 1.815],
    ("32", "none"): [2.40, 2.42, 2.45, 2.41, 2.43, 2.44],
    ("32", "inv_sqrt_d"): [2.41, 2.44, 2.43, 2.42, 2.445, 2.425],
}


def sweep(root, losses=LOSSES, seeds=None, extra=(), steps=1000):
    for (dk, sc), values in losses.items():
        for seed, loss in zip(seeds or range(len(values)), values):
            metrics = {"val/loss": loss, "val/acc": 0.5 - loss / 10, "train/loss": 9.0}
            metrics |= {f"attn/L{i}/entropy_norm": 0.3 + 0.1 * i + 0.01 * seed for i in range(2)}
            overrides = [f"model.d_k={dk}", f"model.attention.scaling={sc}", f"seed={seed}", *extra]
            fake_run(root, f"{dk}-{sc}-{seed}", overrides, metrics, steps=steps)
    return root


def verdicts(summary: dict, metric: str = "val/loss") -> dict:
    return {c["where"]: c["verdict"] for c in summary["contrasts"][metric]}


def test_runs_csv_has_one_row_per_run_and_seed(tmp_path):
    sweep(tmp_path / "s")
    fake_run(tmp_path / "s", "bad", ["model.d_k=64", "model.attention.scaling=none", "seed=0"], {}, status="failed")
    build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    runs = read_runs(tmp_path / "r" / "fake" / "runs.csv")
    assert list(runs.columns[:14]) == [
        "model.d_k",
        "model.attention.scaling",
        "seed",
        "budget",
        "status",
        "error",
        *PROVENANCE,  # what made each row: its fingerprint, code and machine
        "run",
    ]
    assert len(runs) == 25 and (runs["status"] == "failed").sum() == 1
    assert "attn/L1/entropy_norm" in runs and "train/loss" not in runs  # final metrics, not per-step ones
    cell = runs[(runs["model.d_k"] == "16") & (runs["model.attention.scaling"] == "none")]
    assert sorted(cell["seed"]) == list(range(6)) and sorted(cell["val/loss"]) == sorted(LOSSES[("16", "none")])


def test_contrasts_are_scipy_welch_with_holm_and_the_detectable_difference(tmp_path):
    sweep(tmp_path / "s")
    summary = build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    family = {c["where"]: c for c in summary["contrasts"]["val/loss"]}
    raw = {}
    for dk in ("16", "32"):
        ref, lvl = LOSSES[(dk, "none")], LOSSES[(dk, "inv_sqrt_d")]
        res = scipy_stats.ttest_ind(lvl, ref, equal_var=False)
        raw[dk] = res.pvalue
        c = family[f"d_k={dk}"]
        assert c["p"] == pytest.approx(res.pvalue) and c["ci95"] == pytest.approx(list(res.confidence_interval()))
        sd = [pd.Series(v).std() for v in (ref, lvl)]
        assert c["detectable"] == pytest.approx(significance.detectable_difference(sd[0], 6, sd[1], 6))
    holm = significance.holm([raw["16"], raw["32"]])
    assert [family["d_k=16"]["p_holm"], family["d_k=32"]["p_holm"]] == pytest.approx(holm)
    assert verdicts(summary) == {"d_k=16": "lower", "d_k=32": "none"}


def test_a_verdict_flips_when_its_data_does(tmp_path):
    sweep(tmp_path / "s")
    build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    out = tmp_path / "r" / "fake"
    runs = read_runs(out / "runs.csv")
    arm = (runs["model.d_k"] == "32") & (runs["model.attention.scaling"] == "inv_sqrt_d")
    runs.loc[arm, "val/loss"] += 0.3  # the scaled arm at d_k=32 now clearly worse
    write_runs(runs, out / "runs.csv")
    assert verdicts(write_report(out, draw=False)) == {"d_k=16": "lower", "d_k=32": "higher"}
    runs.loc[arm, "val/loss"] -= 0.3 + 0.6
    write_runs(runs, out / "runs.csv")
    assert verdicts(write_report(out, draw=False))["d_k=32"] == "lower"


def test_the_question_is_untested_where_the_reference_arm_is_not_below_the_attention_free_level(tmp_path):
    sweep(tmp_path / "s")
    build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    out = tmp_path / "r" / "fake"
    meta = json.loads((out / "summary.json").read_text())
    meta["attention_free_level"] = {"bigram": 2.2}  # between the d_k=16 arms (2.0) and the d_k=32 ones (2.4)
    family = {c["where"]: c for c in write_report(out, meta, draw=False)["contrasts"]["val/loss"]}
    reference = sum(LOSSES[("16", "none")]) / 6
    assert family["d_k=16"]["verdict"] == "lower" and family["d_k=16"]["below_attention_free"] == pytest.approx(
        2.2 - reference
    )
    assert family["d_k=32"]["verdict"] == "untested" and family["d_k=32"]["below_attention_free"] < 0


def test_a_sweep_adds_to_the_committed_runs_without_duplicating_a_seed(tmp_path, capsys):
    sweep(tmp_path / "a", {k: v[:5] for k, v in LOSSES.items()})  # seeds 0 to 4
    build_report(tmp_path / "a", reports=tmp_path / "r", draw=False)
    sweep(tmp_path / "b", {k: [9.0, v[5]] for k, v in LOSSES.items()}, seeds=[4, 5])  # seed 4 again, then seed 5
    summary = build_report(tmp_path / "b", reports=tmp_path / "r", draw=False)
    runs = read_runs(tmp_path / "r" / "fake" / "runs.csv")
    assert len(runs) == 24 and not runs.duplicated(["model.d_k", "model.attention.scaling", "seed"]).any()
    assert 9.0 not in set(runs["val/loss"])  # the committed seed 4 is kept as it was
    assert summary["seeds_per_cell"] == "6" and verdicts(summary)["d_k=16"] == "lower"
    assert capsys.readouterr().out.count("already in") == 4
    sweep(tmp_path / "c", {("16", "none"): [5.0]})
    build_report(tmp_path / "c", reports=tmp_path / "r", replace=True, draw=False)
    assert len(read_runs(tmp_path / "r" / "fake" / "runs.csv")) == 1  # --replace: these sweeps alone


def test_runs_trained_with_other_settings_are_refused_not_merged(tmp_path, capsys):
    """The study's experiment file changed between two sweeps (here its step budget): adding the new runs to
    the committed table would pool two trainings as seeds of one cell, so it is one line, exit and no write."""
    sweep(tmp_path / "a", {k: v[:2] for k, v in LOSSES.items()})
    build_report(tmp_path / "a", reports=tmp_path / "r", draw=False)
    committed = (tmp_path / "r" / "fake" / "runs.csv").read_text()
    assert read_runs(tmp_path / "r" / "fake" / "runs.csv")["config"].nunique() == 1
    sweep(tmp_path / "b", {k: v[2:] for k, v in LOSSES.items()}, seeds=[2], steps=2000)
    with pytest.raises(SystemExit, match="other settings") as refused:
        build_report(tmp_path / "b", reports=tmp_path / "r", draw=False)
    assert "\n" not in str(refused.value) and "--replace" in str(refused.value)
    assert (tmp_path / "r" / "fake" / "runs.csv").read_text() == committed
    build_report(tmp_path / "b", reports=tmp_path / "r", replace=True, draw=False)
    assert len(read_runs(tmp_path / "r" / "fake" / "runs.csv")) == 4


def test_runs_of_another_budget_are_kept_apart(tmp_path):
    sweep(tmp_path / "a")
    build_report(tmp_path / "a", reports=tmp_path / "r", draw=False)
    sweep(tmp_path / "b", {k: [v[0] + 1] for k, v in LOSSES.items()}, seeds=[7], extra=["debug=smoke"])
    build_report(tmp_path / "b", reports=tmp_path / "r", draw=False)
    assert len(read_runs(tmp_path / "r" / "fake" / "runs.csv")) == 24
    smoke = read_runs(tmp_path / "r" / "fake" / "debug=smoke" / "runs.csv")
    assert len(smoke) == 4 and set(smoke["budget"]) == {"debug=smoke"} and set(smoke["seed"]) == {7}


def test_a_study_without_per_seed_values_is_tested_from_its_cells_summaries(tmp_path):
    """ttest_ind_from_stats on each cell's mean, std and count gives the test the seeds would."""
    sweep(tmp_path / "s")
    summary = build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    out = tmp_path / "r" / "fake"
    (out / "runs.csv").unlink()
    again = write_report(out, draw=False)
    for a, b in zip(summary["contrasts"]["val/loss"], again["contrasts"]["val/loss"]):
        assert (
            b["p"] == pytest.approx(a["p"]) and b["ci95"] == pytest.approx(a["ci95"]) and b["verdict"] == a["verdict"]
        )
    assert "per_seed_note" in again


@pytest.mark.parametrize("study", WITH_RUNS)
def test_committed_runs_hold_one_row_per_cell_and_seed(study):
    runs = read_runs(REPORTS / study / "runs.csv")
    axes = list(runs.columns[: list(runs.columns).index("seed")])
    assert not runs.duplicated([*axes, "seed", "budget"]).any() and runs["val/loss"].notna().all()
    summary = json.loads((REPORTS / study / "summary.json").read_text())
    pooled, _ = one_experiment(runs, axes, study)  # the rows the report pools
    assert summary["runs"] == len(pooled) and summary["cells"] == len(cells_from_runs(pooled))


def test_no_report_names_a_machine_path():
    machine = re.compile(r"(?<![\w.])/(work|home|tmp|Users|root|scratch|mnt)/")
    for study in STUDIES:
        for name in ("ablation.md", "index.html", "summary.json", "runs.csv", "ablation.csv"):
            path = REPORTS / study / name
            if path.is_file():
                assert not machine.search(path.read_text()), path


def swept(experiment: str) -> list[str]:
    """The axes an experiment file sweeps, with those of the experiments it extends."""
    cfg = yaml.safe_load((CONF_DIR / "experiment" / f"{experiment}.yaml").read_text())
    parents = [d for d in cfg.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    own = list(((cfg.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    return own + [a for p in parents for a in swept(p)]


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_a_declared_question_names_a_swept_axis_and_training_ignores_it(experiment):
    Schema.from_cfg(compose_config([f"experiment={experiment}"]))
    question = question_of(experiment, swept(experiment))
    if experiment != "smoke":  # smoke extends dk_scaling with one cell
        assert question.declared and question.compare[0][0] in swept(experiment) and question.metrics


def test_the_declared_reference_is_the_one_compared_against(tmp_path):
    sweep(tmp_path / "s")
    build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    cells = cells_from_runs(read_runs(tmp_path / "r" / "fake" / "runs.csv"))
    question = question_of("dk_scaling", ["model.d_k", "model.attention.scaling"])
    question.compare = [("model.attention.scaling", "inv_sqrt_d")]  # the scaled arm as the reference
    family = contrasts(cells, ["model.d_k", "model.attention.scaling"], question, "val/loss")
    assert {(c.level, c.reference) for c in family} == {("none", "inv_sqrt_d")}
    mean = lambda key: sum(LOSSES[key]) / len(LOSSES[key])  # noqa: E731
    assert family[0].diff == pytest.approx(mean(("16", "none")) - mean(("16", "inv_sqrt_d")), abs=1e-6)
    assert not math.isnan(family[0].test.p)


def test_render_gives_a_report_built_without_it_its_experiments_attention_free_level(tmp_path):
    """A committed report whose runs are gone and whose build knew no level for its data (a generated task)
    gets the level of the data its experiment file trains on; the reference arm's tests then read against it."""
    from attnlab.studies.report.__main__ import render_committed

    out = tmp_path / "induction_heads"
    shutil.copytree(REPORTS / "induction_heads", out)
    meta = json.loads((out / "summary.json").read_text())
    meta["attention_free_level"] = None
    (out / "summary.json").write_text(json.dumps(meta))
    render_committed(out)
    summary = json.loads((out / "summary.json").read_text())
    level = summary["attention_free_level"]
    assert level["source"].endswith("task_levels") and level["bigram"] == pytest.approx(
        math.log(32), abs=0.05
    )  # 32 tokens, each following any other: a bigram knows nothing
    means = {json.dumps(c["axes"], sort_keys=True): c["metrics"]["val/loss"]["mean"] for c in summary["cells_ci95"]}
    contrasts = summary["contrasts"]["val/loss"]
    assert contrasts
    for c in contrasts:
        ref = {**{k: v for k, v in c["where_axes"].items()}, c["axis"]: c["reference"]}
        assert c["below_attention_free"] == pytest.approx(level["bigram"] - means[json.dumps(ref, sort_keys=True)])
