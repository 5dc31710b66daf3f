"""The planner: seeds a side from the noncentral t at each comparison's spread, the reference's learning
checked against the attention-free level and the task's floor, and the hours those seeds cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnlab.config.compose import CONF_DIR, compose_config
from attnlab.data.tasks import MQARDataModule
from attnlab.studies.report.data import DEFAULT_BUDGET, axes_of, read_runs
from attnlab.sweeps import plan
from attnlab.sweeps.sweep import declared_seeds, planned_seeds
from attnlab.util import significance


def runs(acc: dict[str, list[float]], loss: float = 1.0, wall_s: float = 90.0) -> pd.DataFrame:
    rows = [
        {"variant": arm, "seed": seed, "budget": DEFAULT_BUDGET, "status": "ok", "error": "", "config": "", "run": ""}
        | {"val/acc": value, "val/loss": loss + 0.01 * seed, "wall_s": wall_s}
        for arm, values in acc.items()
        for seed, value in enumerate(values)
    ]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def levels():
    return plan.experiment_baseline("kv_frontier")["bigram"]


def test_seeds_needed_follow_each_comparisons_spread_and_the_hours_follow_the_seeds(levels):
    frame = runs(
        {"baseline": [0.95, 0.97, 0.93], "mqa": [0.90, 0.96, 0.84], "gqa_kv2": [0.951, 0.952, 0.953]},
        loss=levels - 1.0,
    )
    made = plan.build_plan("kv_frontier", frame, hours=1000)
    assert not made["problems"] and made["cells"] == 3
    by_arm = {row["comparison"].split(": ")[1].split(" vs ")[0]: row for row in made["comparisons"]}
    for arm, row in by_arm.items():
        ref, lvl = np.array([0.95, 0.97, 0.93]), frame[frame["variant"] == arm]["val/acc"].to_numpy()
        expected = significance.seeds_needed(ref.std(ddof=1), lvl.std(ddof=1), 0.05)
        assert row["seeds_needed"] == expected and row["within_budget"]
    assert made["seeds"] == max(r["seeds_needed"] for r in made["comparisons"])
    assert made["hours"] == pytest.approx(made["seeds"] * 3 * 90.0 / plan.JOBS / 3600)
    assert (
        plan.verdict(made)
        == f"untested: needs {made['seeds_for_all']} seeds ({made['hours_for_all']:.1f} hours on this machine)"
        " for 2 of 2 comparisons"
    )
    tight = runs({"baseline": [0.950, 0.951, 0.952], "mqa": [0.950, 0.952, 0.951]}, loss=levels - 1.0)
    assert plan.verdict(plan.build_plan("kv_frontier", tight, hours=1000)).startswith("answered")

    capped = plan.build_plan("kv_frontier", frame, hours=0.05)  # 3 cells x 90 s x 2 seeds fits, no more
    assert capped["most_seeds"] == 2 and not capped["answerable"]
    assert plan.verdict(capped).startswith(f"untested: needs {capped['seeds_for_all']} seeds")
    assert "over the 0.05 hours allowed" in plan.verdict(capped)


def test_a_reference_that_has_not_learned_the_task_leaves_every_comparison_untested(levels):
    below_floor = runs({"baseline": [0.30, 0.35, 0.32], "mqa": [0.31, 0.33, 0.30]}, loss=levels - 1.0)
    made = plan.build_plan("kv_frontier", below_floor, hours=1000)
    assert made["problems"] and not any(r["within_budget"] for r in made["comparisons"])
    assert made["task_floor"]["in_context"] < 0.3  # guessing among the values in context
    assert plan.verdict(made).startswith("untested")

    above_level = runs({"baseline": [0.95, 0.96, 0.97], "mqa": [0.95, 0.96, 0.97]}, loss=levels + 0.1)
    assert plan.build_plan("kv_frontier", above_level, hours=1000)["problems"]


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
