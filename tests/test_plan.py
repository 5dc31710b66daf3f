"""The planner: seeds a side for each outcome kind (Welch's noncentral t at an sd's upper bound, the exact
test's smallest p, Fisher's exact power), the reference's learning checked, and the hours the cells that
need seeds cost at their own seconds a run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnlab.config.compose import CONF_DIR, compose_config
from attnlab.data.tasks import MQARDataModule
from attnlab.studies import report
from attnlab.studies.report.analysis import cells_from_runs
from attnlab.studies.report.data import DEFAULT_BUDGET, axes_of, read_runs
from attnlab.sweeps import plan
from attnlab.sweeps.sweep import declared_seeds, planned_seeds
from attnlab.util import significance

ROOT = Path(__file__).resolve().parents[1]


def runs(
    values: dict[str, list[float]], metric: str = "val/loss", wall_s: dict | float = 90.0, **extra
) -> pd.DataFrame:
    rows = [
        {"variant": arm, "seed": seed, "budget": DEFAULT_BUDGET, "status": "ok", "error": "", "config": "", "run": ""}
        | {metric: value, "wall_s": wall_s[arm] if isinstance(wall_s, dict) else wall_s}
        | {k: v[arm][seed] for k, v in extra.items()}
        for arm, arm_values in values.items()
        for seed, value in enumerate(arm_values)
    ]
    return pd.DataFrame(rows)


def test_seeds_needed_plan_from_each_sds_upper_bound_and_price_the_cells_that_need_them():
    """variants (continuous, difference 0.02): each comparison's seeds from Browne's 80 % upper bound of each
    cell's sd, no fewer than the exact test needs over the family; hours from each cell's own seconds."""
    frame = runs(
        {"baseline": [1.50, 1.52, 1.48], "mqa": [1.50, 1.56, 1.44], "gate": [1.501, 1.502, 1.503]},
        wall_s={"baseline": 100.0, "mqa": 100.0, "gate": 400.0},
    )
    made = plan.build_plan("variants", frame, hours=1000)
    assert not made["problems"] and made["cells"] == 3
    by_arm = {row["comparison"].split(": ")[1].split(" vs ")[0]: row for row in made["comparisons"]}
    ref = np.array([1.50, 1.52, 1.48])
    for arm, row in by_arm.items():
        lvl = frame[frame["variant"] == arm]["val/loss"].to_numpy()
        upper = [significance.planning_sd(a.std(ddof=1), 3) for a in (ref, lvl)]
        expected = max(significance.seeds_needed(*upper, 0.02), significance.exact_seeds_for(2))
        assert row["seeds_needed"] == expected and row["sd_planned"] == pytest.approx(upper)
    assert significance.exact_seeds_for(2) == 5  # 2/C(8,4) = 0.029 is not below 0.05/2; 2/C(10,5) = 0.0079 is
    # the hours: each cell brought to the seeds its comparisons need, at its own seconds
    need = {a: r["seeds_needed"] for a, r in by_arm.items()}
    cost = (max(need.values()) - 3) * 100 + (need["mqa"] - 3) * 100 + (need["gate"] - 3) * 400
    assert made["hours_for_all"] == pytest.approx(cost / plan.JOBS / 3600)
    assert plan.verdict(made).startswith(f"untested: needs {made['seeds_for_all']} seeds a side")

    capped = plan.build_plan("variants", frame, hours=0.1)  # one seed of the 3 cells: 600 s; 2 jobs
    assert capped["most_seeds"] == 2 and not capped["answerable"]
    assert "over the 0.1 hours allowed" in plan.verdict(capped)


def test_zero_spread_plans_at_the_resolution_and_a_flat_pair_is_not_known():
    flat = runs({"baseline": [1.5, 1.5, 1.5], "mqa": [1.5, 1.5, 1.5]})
    row = plan.build_plan("variants", flat, hours=1000)["comparisons"][0]
    assert row["seeds_needed"] is None and row["test"] == "exact"  # nothing bounds a spread of 0 for a loss
    config = plan.current_config(["experiment=kv_frontier"])
    assert plan.resolution(config, "val/acc") == pytest.approx(1 / (8 * 32 * 24))  # one scored query
    assert plan.resolution(config, "val/loss") == 0.0


def onset_runs(arms: dict[str, list[tuple[int, bool]]]) -> pd.DataFrame:
    steps = {a: [float(s) for s, _ in r] for a, r in arms.items()}
    cens = {a: [0.0 if learned else 1.0 for _, learned in r] for a, r in arms.items()}
    acc = {a: [0.95 if learned else 0.21 for _, learned in r] for a, r in arms.items()}
    return runs(
        acc,
        "val/acc",
        60.0,
        **{"onset/step": steps, "onset/censored": cens, "val/loss": {a: [0.01] * len(r) for a, r in arms.items()}},
    )


def test_an_onset_plan_asks_for_the_seeds_that_find_an_arm_that_never_learns():
    """2 of 2 against 0 of 2: Fisher's p is 1/3 whatever happens, so the plan asks for 4 a side (2/70) and
    gives the power these 2 seeds have (none)."""
    made = plan.build_plan("kv_frontier", onset_runs({"baseline": [(250, True)] * 2, "mqa": [(6000, False)] * 2}), 1000)
    row = made["comparisons"][0]
    assert row["seeds_needed"] == significance.fisher_seeds_needed(1.0, 0.0) == 4
    assert row["power_never_learns"] == 0.0 and not row["resolved"]
    assert plan.verdict(made).startswith("untested: needs 4 seeds a side")
    five = plan.build_plan("kv_frontier", onset_runs({"baseline": [(250, True)] * 5, "mqa": [(6000, False)] * 5}), 1000)
    assert five["comparisons"][0]["resolved"] and plan.verdict(five).startswith("answered")


def test_a_reference_that_never_learned_leaves_every_comparison_untested():
    made = plan.build_plan(
        "kv_frontier", onset_runs({"baseline": [(6000, False)] * 3, "mqa": [(6000, False)] * 3}), 1000
    )
    assert made["problems"] and not any(r["within_budget"] for r in made["comparisons"])
    assert plan.verdict(made).startswith("untested: the reference learned")


def test_mqar_floors_match_their_closed_forms():
    """Guessing among the distinct values of 1 pair is always right; elimination with distinct queries
    answers the last query of every sequence for sure."""
    one = MQARDataModule(vocab_size=16, num_pairs=1, seq_len=16).floors(n=256)
    assert one["in_context"] == 1.0 and one["elimination"] == 1.0
    floors = MQARDataModule(vocab_size=64, num_pairs=8, seq_len=64).floors(n=2048)
    assert floors["in_context"] < floors["elimination"] < 1.0
    assert "elimination" not in MQARDataModule(vocab_size=64, num_pairs=8, num_queries=24, seq_len=64).floors(n=64)


def test_each_study_declares_the_seeds_its_committed_runs_hold():
    """question.seeds (the plan's, for seeds: auto) equals the fewest finished seeds of any cell of the
    study's committed runs.csv: a report never rests on fewer seeds than its config says it ran."""
    root = Path(__file__).resolve().parents[1]
    checked = 0
    for table in sorted((root / "reports").glob("*/runs.csv")):
        study = table.parent.name
        if not (CONF_DIR / "experiment" / f"{study}.yaml").is_file():
            continue  # a report of an experiment's variant, run with explicit overrides
        frame = read_runs(table)
        ok = frame[(frame["status"] == "ok") & (frame["budget"] == frame["budget"].iloc[0])]
        axes = axes_of(frame)
        fewest = int(ok.groupby(axes)["seed"].nunique().min()) if axes else ok["seed"].nunique()
        seeds = compose_config([f"experiment={study}"]).question.seeds
        declared = planned_seeds(study, root / "reports") if seeds == "auto" else declared_seeds(study)
        assert declared == fewest, f"{study}: question.seeds {declared}, committed {fewest} a cell"
        checked += 1
    assert checked >= 8


def test_a_new_plan_reaches_the_studys_page(tmp_path, capsys):
    """attnlab plan rewrites plan.json and the page that opens with its verdict: a report built before the
    plan is not left showing the old one."""
    reports = tmp_path / "reports"
    shutil.copytree(ROOT / "reports" / "gqa", reports / "gqa")
    page = reports / "gqa" / "ablation.md"
    page.write_text(page.read_text().replace("**Plan: ", "**Plan: stale ", 1))
    assert plan.main(["gqa", "--reports", str(reports)]) == 0
    verdict = json.loads((reports / "gqa" / "plan.json").read_text())["verdict"]
    assert page.read_text().splitlines()[2].startswith(f"**Plan: {verdict}")
    assert page.read_text() == (ROOT / "reports" / "gqa" / "ablation.md").read_text()


def test_a_resolved_comparison_needs_no_budget():
    """A comparison already beyond seed noise reads "-" under "within budget": nothing is left to run for it."""
    frame = runs({"baseline": [1.50, 1.51, 1.49, 1.50, 1.52], "gate": [1.20, 1.21, 1.19, 1.20, 1.22]})
    made = plan.build_plan("variants", frame, hours=0.001)
    (row,) = made["comparisons"]
    assert row["resolved"] and plan.budget_cell(row) == "-"
    assert plan.budget_cell(row | {"resolved": False}) == ("yes" if row["within_budget"] else "no")
    line = next(x for x in plan.markdown(made).splitlines() if x.startswith("| variant: gate vs baseline"))
    assert line.endswith("| resolved | - |")


def test_a_reference_arm_at_the_attention_free_level_leaves_its_comparison_untested():
    """As the report reads it: a comparison whose reference arm ends at or above the attention-free level
    is untested whatever its p, no seeds are planned for it, and the plan's verdict says so."""
    frame = runs({"baseline": [1.50, 1.51, 1.49, 1.50, 1.52], "gate": [1.20, 1.21, 1.19, 1.20, 1.22]})
    clear = plan.build_plan("variants", frame, hours=10)
    assert clear["comparisons"][0]["resolved"] and plan.verdict(clear).startswith("answered")
    cells = cells_from_runs(frame, ["variant"])
    tested_axes, tested, _, question = report.tested_cells("variants", frame, ["variant"], cells)
    for level, blocked in ((1.49, True), (1.51, False)):  # the baseline's mean val loss is 1.504
        (row,) = plan.continuous_rows(tested, tested_axes, question, "val/loss", 0.0, cells, level)
        assert bool(row["unanswerable"]) == blocked and row["resolved"] != blocked
        assert plan.seeds_cell(row) == ("untested" if blocked else "resolved")
        assert (row["seeds_needed"] is None) == blocked and plan._answered(row) != blocked
    made = clear | {"comparisons": [row | {"unanswerable": "the reference arm is not below the attention-free level"}]}
    assert plan.verdict(made).startswith("untested: in 1 of 1 comparisons the reference arm is not below")
