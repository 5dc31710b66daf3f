"""``attnlab plan STUDY``: before the compute, can the study's question be answered at its budget?

From the study's runs (its committed runs.csv, or ``--from`` sweep dirs such as a two-seed pilot that
``--pilot`` runs), per comparison of the declared question: each cell's seed-to-seed spread, the seeds a
side a two-sided Welch test needs to find the declared difference with 80 % power (the noncentral t,
``significance.seeds_needed``), and whether the reference arm has learned the task at all: below the
attention-free (bigram) level, and, for a task with an accuracy floor, above it by the accuracy the study
declares (``question.learned``). With the seconds a run takes on this machine, the study's hours. A
comparison whose seeds exceed what ``question.hours`` (or ``--hours``) allows is out of reach at this
budget; a reference that has not learned the task leaves every comparison untested.

Written to reports/<study>/plan.json and plan.md; ``make sweep`` reads plan.json when the study declares
``question.seeds: auto``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import OmegaConf

from attnlab.cli import command_parser
from attnlab.config.compose import compose_config
from attnlab.studies.report import tested_cells
from attnlab.studies.report.aggregate import load_sweeps
from attnlab.studies.report.analysis import cells_from_runs, contrasts
from attnlab.studies.report.baseline import experiment_baseline, study_level
from attnlab.studies.report.data import (
    DEFAULT_BUDGET,
    axes_of,
    cell_overrides,
    current_config,
    frame_from_runs,
    read_runs,
)
from attnlab.sweeps.sweep import PLAN, studies, unknown_study
from attnlab.sweeps.sweep import main as sweep
from attnlab.training.results import training_fingerprint
from attnlab.util import significance
from attnlab.util.files import atomic_write_text

DEFAULT_HOURS = 6.0  # what a study may cost on this machine when it declares no question.hours
JOBS = 2  # runs at once, as `make sweep` runs them on two cores


def declared(study: str) -> dict:
    """The study's composed ``question`` block (seeds, difference, learned, hours, ...)."""
    return OmegaConf.to_container(compose_config([f"experiment={study}"]).get("question") or {}, resolve=True)


def current_rows(frame: pd.DataFrame, study: str) -> tuple[pd.DataFrame, int]:
    """The rows trained with today's settings of their cell (rows older than the fingerprint column are
    kept: nothing says they differ); returns them and how many rows were left out."""
    if "config" not in frame:
        return frame, 0
    axes = axes_of(frame)
    keep = []
    cache: dict[tuple, str] = {}
    for _, row in frame.iterrows():
        if not row["config"]:
            keep.append(True)
            continue
        key = (*(str(row[a]) for a in axes), row["budget"])
        if key not in cache:
            cache[key] = training_fingerprint(current_config(cell_overrides(study, dict(zip(axes, key)), key[-1])))
        keep.append(cache[key] == row["config"])
    mask = np.array(keep, dtype=bool)
    return frame[mask], int((~mask).sum())


def seconds_per_run(frame: pd.DataFrame, config: dict) -> tuple[float | None, str]:
    """The median wall time of the runs, else their training time from the median tokens per second."""
    ok = frame[frame["status"] == "ok"]
    if "wall_s" in ok and ok["wall_s"].notna().any():
        return float(ok["wall_s"].median()), "median wall time of its runs"
    if "perf/tokens_per_s" in ok and ok["perf/tokens_per_s"].notna().any():
        tokens = config["trainer"]["max_steps"] * config["data"]["batch_size"] * config["model"]["block_size"]
        return tokens / float(ok["perf/tokens_per_s"].median()), "steps only, from the median tokens/s"
    return None, "unknown"


def task_floor(config: dict) -> dict | None:
    """A generated task's accuracy floors (MQAR: guessing among the values in context), else None."""
    data = dict(config["data"])
    if not str(data.get("_target_", "")).endswith("MQARDataModule"):
        return None
    dm = instantiate(data, block_size=config["model"]["block_size"], steps=1, seed=0)
    return dm.floors()


def _compared(cell, cells: list, axis: str, reference: str) -> bool:
    """Whether ``cell`` is the reference side of a comparison: at the reference level, with a cell that differs
    from it on ``axis`` alone (a reference-level cell no other level is compared with is not the reference arm)."""
    if cell.axes.get(axis) != reference:
        return False
    rest = {k: v for k, v in cell.axes.items() if k != axis}
    return any(c.axes.get(axis) != reference and {k: v for k, v in c.axes.items() if k != axis} == rest for c in cells)


def build_plan(study: str, frame: pd.DataFrame, hours: float | None = None, dropped: int = 0) -> dict:
    question_cfg = declared(study)
    frame = frame[frame["budget"] == DEFAULT_BUDGET] if (frame["budget"] == DEFAULT_BUDGET).any() else frame
    axes = axes_of(frame)
    cells = cells_from_runs(frame, axes)
    axes, tested, _, question = tested_cells(study, frame, axes, cells)
    metric = question.metrics[0]
    difference = question.difference
    hours = float(hours or question_cfg.get("hours") or DEFAULT_HOURS)
    config = current_config([f"experiment={study}"])
    seconds, timed = seconds_per_run(frame, config)
    level = (study_level(study) or experiment_baseline(study) or {}).get("bigram")  # the report's, if it has one
    floor = task_floor(config)
    learned = question.learned
    reference_axis, reference = question.compare[0] if question.compare else (None, None)
    refs = [c for c in cells if reference_axis and _compared(c, cells, reference_axis, reference)] or cells
    ref_loss = min((m for c in refs if (m := c.mean("val/loss")) is not None), default=None)
    ref_acc = max((m for c in refs if (m := c.mean("val/acc")) is not None), default=None)
    problems = []
    if level is not None and ref_loss is not None and ref_loss >= level:
        problems.append(f"the reference's val loss {ref_loss:.3f} is not below the attention-free level {level:.3f}")
    if learned is not None and ref_acc is not None and ref_acc < learned:
        problems.append(f"the reference answers {ref_acc:.3f} of the queries, below the {learned} it must reach")
    runs_per_seed = len(cells)
    most = max(2, int(hours * 3600 * JOBS / (seconds * runs_per_seed))) if seconds else None
    rows = []
    for c in contrasts(tested, axes, question, metric):
        std_ref = c.test.std_ref if c.test else math.nan
        std_level = c.test.std_level if c.test else math.nan
        resolved = c.verdict in ("higher", "lower")  # beyond seed noise already: these seeds answer it
        need = (
            min(c.n) if resolved else significance.seeds_needed(std_ref, std_level, difference) if difference else None
        )
        rows.append(
            {
                "comparison": f"{c.axis}: {c.level} vs {c.reference}",
                "where": c.where,
                "seeds": list(c.n),
                "reference": c.ref_mean,
                "level": c.level_mean,
                "std_reference": std_ref,
                "std_level": std_level,
                "p_holm": c.p_holm,
                "resolved": resolved,
                "seeds_needed": need,
                "within_budget": need is not None and most is not None and need <= most and not problems,
            }
        )
    reachable = [r["seeds_needed"] for r in rows if r["within_budget"]]
    seeds = max(reachable, default=None)
    needed = max((r["seeds_needed"] for r in rows if r["seeds_needed"]), default=None)
    plan = {
        "study": study,
        "metric": metric,
        "difference": difference,
        "runs_read": int((frame["status"] == "ok").sum()),
        "runs_left_out": dropped,
        "cells": runs_per_seed,
        "seconds_per_run": seconds,
        "timed": timed,
        "attention_free_level": level,
        "reference_val_loss": ref_loss,
        "reference_val_acc": ref_acc,
        "task_floor": floor,
        "learned": learned,
        "problems": problems,
        "hours_cap": hours,
        "most_seeds": most,
        "comparisons": rows,
        "seeds": seeds,
        "hours": _hours(seeds, runs_per_seed, seconds),
        "seeds_for_all": needed,
        "hours_for_all": _hours(needed, runs_per_seed, seconds),
    }
    plan["answerable"] = bool(rows) and all(r["within_budget"] for r in rows)
    return plan


def _hours(seeds: int | None, cells: int, seconds: float | None) -> float | None:
    return None if seeds is None or seconds is None else seeds * cells * seconds / JOBS / 3600


def verdict(plan: dict) -> str:
    """The plan's one line: answered by the seeds run, or untested with the seeds and hours it needs."""
    if plan["problems"]:
        return "untested: " + "; ".join(plan["problems"]) + " (a longer budget or an easier task first)"
    rows = plan["comparisons"]
    if rows and all(r["resolved"] or (r["seeds_needed"] or math.inf) <= min(r["seeds"]) for r in rows):
        return "answered: every comparison is resolved or its seeds detect the declared difference"
    if plan["seeds_for_all"] is None:
        return "untested: no seed spread to plan from (run the plan with --pilot)"
    over = (
        "" if plan["seeds_for_all"] <= (plan["most_seeds"] or 0) else f", over the {plan['hours_cap']:g} hours allowed"
    )
    open_rows = [r for r in rows if not (r["resolved"] or (r["seeds_needed"] or math.inf) <= min(r["seeds"]))]
    return (
        f"untested: needs {plan['seeds_for_all']} seeds ({plan['hours_for_all']:.1f} hours on this machine){over}"
        f" for {len(open_rows)} of {len(rows)} comparisons"
    )


def markdown(plan: dict) -> str:
    def num(x, fmt=".3g"):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)

    floor = plan["task_floor"] or {}
    lines = [
        f"# Plan: {plan['study']}",
        "",
        f"**{verdict(plan)}**",
        "",
        f"Primary metric {plan['metric']}, declared difference {num(plan['difference'])}; "
        f"{plan['runs_read']} finished runs read ({plan['runs_left_out']} left out: trained with other settings); "
        f"{plan['cells']} cells; a run takes {num(plan['seconds_per_run'], '.0f')} s ({plan['timed']}); "
        f"{JOBS} runs at once; at most {num(plan['most_seeds'], 'd')} seeds a cell fit in {plan['hours_cap']:g} hours.",
        "",
        f"Reference arm: val loss {num(plan['reference_val_loss'], '.4f')} against the attention-free level "
        f"{num(plan['attention_free_level'], '.4f')}; answer accuracy {num(plan['reference_val_acc'], '.3f')}"
        + (f" (must reach {plan['learned']})" if plan["learned"] is not None else "")
        + "".join(f"; floor ({k}) {v:.3f}" for k, v in floor.items())
        + ".",
        "",
        "| comparison | where | seeds now | reference | level | std (ref, level) | p (Holm) | seeds needed (80 % power) "
        "| within budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in plan["comparisons"]:
        lines.append(
            f"| {r['comparison']} | {r['where']} | {r['seeds'][0]}, {r['seeds'][1]} | {num(r['reference'], '.4g')} "
            f"| {num(r['level'], '.4g')} | {num(r['std_reference'])}, {num(r['std_level'])} | {num(r['p_holm'], '.2g')} "
            f"| {'resolved' if r['resolved'] else num(r['seeds_needed'], 'd')} | {'yes' if r['within_budget'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def write(plan: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan["verdict"] = verdict(plan)  # what the study's report opens with
    atomic_write_text(out / PLAN, json.dumps(plan, indent=2, default=float) + "\n")
    atomic_write_text(out / "plan.md", markdown(plan))


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("plan", "Plan a study's seeds from its runs before the compute.")
    parser.add_argument("study", help="one of: " + ", ".join(studies()))
    parser.add_argument("--from", dest="dirs", nargs="*", default=None, help="sweep dirs to read (default: runs.csv)")
    parser.add_argument("--pilot", action="store_true", help="first run 2 seeds of every cell (make sweep, resumable)")
    parser.add_argument("--hours", type=float, default=None, help="the study's time cap (default: question.hours)")
    parser.add_argument("--reports", default="reports")
    args, extra = parser.parse_known_args(argv)
    if (refusal := unknown_study(args.study, "STUDY")) is not None:
        print(refusal, file=sys.stderr)
        return 2
    out = Path(args.reports) / args.study
    if args.pilot:
        sweep(["--study", args.study, "--seeds", "2", "--jobs", str(JOBS), *extra])
    if args.dirs:
        frame = frame_from_runs(load_sweeps([Path(d) for d in args.dirs]))
    elif (out / "runs.csv").is_file():
        frame = read_runs(out / "runs.csv")
    else:
        print(f"attnlab: error: {out / 'runs.csv'} does not exist; expected --pilot or --from DIR", file=sys.stderr)
        return 2
    frame, dropped = current_rows(frame, args.study)
    if frame.empty:
        print(
            f"attnlab: error: no run of {args.study} was trained with today's settings; expected --pilot",
            file=sys.stderr,
        )
        return 2
    plan = build_plan(args.study, frame, args.hours, dropped)
    write(plan, out)
    print(markdown(plan), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
