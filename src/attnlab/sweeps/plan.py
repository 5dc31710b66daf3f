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

from attnlab.config.study import load_study, study_names
from attnlab.studies.report import onset, tested_cells, write_report
from attnlab.studies.report.aggregate import load_sweeps
from attnlab.studies.report.analysis import cells_from_runs, contrasts
from attnlab.studies.report.baseline import experiment_baseline, study_level
from attnlab.studies.report.data import (
    DEFAULT_BUDGET,
    axes_of,
    current_config,
    frame_from_runs,
    read_runs,
    today_fingerprint,
)
from attnlab.studies.report.provenance import one_experiment
from attnlab.sweeps.sweep import PLAN, unknown_study
from attnlab.sweeps.sweep import main as sweep
from attnlab.util import significance
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import where

DEFAULT_HOURS = 6.0  # what a study may cost on this machine when it declares no question.hours
JOBS = 2  # runs at once, as `make sweep` runs them on two cores
PILOT_SEEDS = 2  # --pilot: the fewest seeds that show a spread


def current_rows(frame: pd.DataFrame, study: str) -> tuple[pd.DataFrame, int]:
    """The rows trained with today's settings of their cell, pooled as the report pools them (a row without
    a fingerprint only where no row of its cell has one: ``provenance.one_experiment``); returns them and
    how many rows were left out."""
    if "config" not in frame:
        return frame, 0
    axes = axes_of(frame)
    keep = []
    for _, row in frame.iterrows():
        cell = tuple((a, str(row[a])) for a in axes)
        keep.append(not row["config"] or today_fingerprint(study, cell, row["budget"]) == row["config"])
    mask = np.array(keep, dtype=bool)
    kept, _ = one_experiment(frame[mask], axes, study)
    return kept, len(frame) - len(kept)


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


def seconds_by_cell(frame: pd.DataFrame, axes: list[str], config: dict) -> tuple[dict[str, float], str]:
    """Each cell's seconds a run, from its own finished runs (median wall time); a cell without one takes the
    median of all runs. An arm that costs four times another is priced so."""
    overall, timed = seconds_per_run(frame, config)
    ok = frame[frame["status"] == "ok"]
    out = {}
    for key, rows in ok.groupby(axes, sort=False) if axes else [((), ok)]:
        key = key if isinstance(key, tuple) else (key,)
        wall = rows["wall_s"].dropna() if "wall_s" in rows else pd.Series(dtype=float)
        label = where(dict(zip(axes, map(str, key))))
        if len(wall) or overall is not None:
            out[label] = float(wall.median()) if len(wall) else overall
    return out, ("each cell's median wall time" if timed.startswith("median") else timed)


def load_by_cell(frame: pd.DataFrame, axes: list[str]) -> dict[str, float]:
    """Each cell's median machine load per CPU while its runs trained (runs that recorded it): above 1, they
    waited for a core, and their wall time prices the machine as much as the arm."""
    if "machine/load_per_cpu" not in frame:
        return {}
    ok = frame[(frame["status"] == "ok") & frame["machine/load_per_cpu"].notna()]
    groups = ok.groupby(axes, sort=False) if axes else [((), ok)]
    return {
        where(dict(zip(axes, map(str, k if isinstance(k, tuple) else (k,))))): float(r["machine/load_per_cpu"].median())
        for k, r in groups
    }


def resolution(config: dict, metric: str) -> float:
    """The smallest step a metric can take between two runs: for a generated task's answer accuracy, one
    scored query of its validation set; 0 where not known."""
    data = dict(config["data"])
    if metric.endswith("/acc") and str(data.get("_target_", "")).endswith("MQARDataModule"):
        queries = data.get("num_queries") or data.get("num_pairs") or 8  # MQARDataModule's defaults
        scored = (data.get("val_batches") or 8) * data["batch_size"] * queries
        return 1.0 / scored
    return 0.0


def continuous_rows(
    tested, axes, question, metric: str, floor_sd: float, grid: list | None = None, level: float | None = None
) -> list[dict]:
    """Per comparison of a continuous outcome: the seeds a side at which Welch's test finds the declared
    difference, each sd taken at its upper 80 % bound (Browne 1995) and never below the metric's resolution, and no fewer
    than the exact test needs where it decides. A comparison whose reference arm does not beat the attention-free
    ``level`` (its best over the ``grid`` cells it shares, as the report reads it) needs a longer budget, not seeds."""
    family = contrasts(tested, axes, question, metric, grid, level)
    rows = []
    for c in family:
        std_ref = c.test.std_ref if c.test else math.nan
        std_level = c.test.std_level if c.test else math.nan
        sds = [significance.planning_sd(s, n, floor_sd) for s, n in ((std_ref, c.n[0]), (std_level, c.n[1]))]
        resolved = c.verdict in ("higher", "lower")  # beyond seed noise already: these seeds answer it
        known = all(math.isfinite(sd) and sd > 0 for sd in sds)
        need = None
        if resolved:
            need = min(c.n)
        elif known and question.difference and c.unanswerable_because is None:
            need = significance.seeds_needed(*sds, question.difference)
            need = max(need, significance.exact_seeds_for(len(family))) if need is not None else None
        rows.append(
            {
                "comparison": f"{c.axis}: {c.level} vs {c.reference}",
                "where": c.where,
                "cells": [where({a: {**c.at, c.axis: lvl}.get(a) for a in axes}) for lvl in (c.reference, c.level)],
                "seeds": list(c.n),
                "reference": c.ref_mean,
                "level": c.level_mean,
                "std_reference": std_ref,
                "std_level": std_level,
                "sd_planned": sds,
                "test": c.test_name,
                "p_holm": c.p_holm,
                "resolved": resolved,
                "seeds_needed": need,
                "unanswerable": c.unanswerable_because,
            }
        )
    return rows


def learning_rows(frame, axes, question) -> list[dict]:
    """Per comparison of a learned or onset outcome: k of n; the seeds a side at which Fisher's exact test
    finds an arm that never learns where the reference learns at its observed rate (the costly failure two
    seeds cannot bound), its exact power now, and for onsets the log-rank test's power now, simulated from
    the arms' own runs."""
    arms = onset.arms_of(frame, axes, question)
    rows = []
    family = onset.compare(arms, axes, question)
    for c in family:
        rate = c.ref.k / c.ref.n
        resolved = c.verdict not in ("none", "untested")
        need = min(c.ref.n, c.arm.n) if resolved else significance.fisher_seeds_needed(rate, 0.0) if rate > 0 else None
        if c.onset and not resolved and c.p is not None:  # a tie answers only at 80 % power against what it shows
            need = significance.logrank_seeds_needed(
                c.ref.steps, ~c.ref.learned, c.arm.steps, ~c.arm.learned, significance.ALPHA / len(family)
            )
        if need is not None and not resolved:  # no fewer than the exact test needs after Holm over the family
            need = max(need, significance.exact_seeds_for(len(family)))
        power_logrank = (
            significance.logrank_power(c.ref.steps, ~c.ref.learned, c.arm.steps, ~c.arm.learned, min(c.ref.n, c.arm.n))
            if c.onset
            else None
        )
        rows.append(
            {
                "comparison": f"{c.axis}: {c.level} vs {c.reference}",
                "where": c.where,
                "cells": [where(c.ref.axes), where(c.arm.axes)],
                "seeds": [c.ref.n, c.arm.n],
                "reference": f"{c.ref.k} of {c.ref.n}",
                "level": f"{c.arm.k} of {c.arm.n}",
                "test": c.test_name,
                "p_holm": c.p_holm,
                "power_never_learns": significance.fisher_power(rate, 0.0, c.ref.n, c.arm.n) if rate > 0 else None,
                "power_logrank": power_logrank,
                "resolved": resolved,
                "seeds_needed": need,
            }
        )
    return rows


def build_plan(study: str, frame: pd.DataFrame, hours: float | None = None, dropped: int = 0) -> dict:
    frame = frame[frame["budget"] == DEFAULT_BUDGET] if (frame["budget"] == DEFAULT_BUDGET).any() else frame
    axes = axes_of(frame)
    cells = cells_from_runs(frame, axes)
    tested_axes, tested, _, question = tested_cells(study, frame, axes, cells)
    metric = question.metrics[0]
    hours = float(hours or load_study(study).question.hours or DEFAULT_HOURS)
    config = current_config([f"experiment={study}"])
    seconds, timed = seconds_by_cell(frame, axes, config)
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
    learning = question.outcome in ("learned", "onset")
    if learning:
        ref_k = [a for a in onset.arms_of(frame, axes, question) if a.axes.get(reference_axis) == reference]
        if ref_k and not any(a.k for a in ref_k):
            problems.append(f"the reference learned (reached {learned}) in none of its {sum(a.n for a in ref_k)} runs")
    elif learned is not None and ref_acc is not None and ref_acc < learned:
        problems.append(f"the reference answers {ref_acc:.3f} of the queries, below the {learned} it must reach")
    floor_sd = resolution(config, metric)
    rows = (
        learning_rows(frame, axes, question)
        if learning
        else continuous_rows(tested, tested_axes, question, metric, floor_sd, cells, level)
    )
    per_seed = sum(seconds.values()) if seconds else None  # one seed of every cell
    most = max(2, int(hours * 3600 * JOBS / per_seed)) if per_seed else None
    for r in rows:  # the hours to bring this comparison's two cells to its seeds, within the cap
        cost = _open_hours([r], seconds) if r["seeds_needed"] is not None else None
        r["within_budget"] = cost is not None and cost <= hours and not problems
    open_rows = [r for r in rows if not _answered(r)]
    needed = max((r["seeds_needed"] for r in open_rows if r["seeds_needed"]), default=None)
    plan = {
        "study": study,
        "outcome": question.outcome,
        "metric": metric,
        "difference": question.difference,
        "runs_read": int((frame["status"] == "ok").sum()),
        "runs_left_out": dropped,
        "cells": len(cells),
        "seconds_per_cell": seconds,
        "seconds_per_run": float(np.median(list(seconds.values()))) if seconds else None,
        "timed": timed,
        "load_per_cpu": load_by_cell(frame, axes),
        "resolution": floor_sd,
        "attention_free_level": level,
        "reference_val_loss": ref_loss,
        "reference_val_acc": ref_acc,
        "task_floor": floor,
        "learned": learned,
        "problems": problems,
        "hours_cap": hours,
        "most_seeds": most,
        "comparisons": rows,
        "seeds_for_all": needed,
        "hours_for_all": _open_hours(open_rows, seconds),
    }
    fits = plan["hours_for_all"] is not None and plan["hours_for_all"] <= hours
    plan["seeds"] = needed if needed is not None and fits else None  # what seeds: auto runs (at least 2)
    plan["answerable"] = bool(rows) and not problems and all(_answered(r) or r["within_budget"] for r in rows)
    return plan


def _answered(row: dict) -> bool:
    """Resolved, or its seeds already detect what the plan plans for (never where no seeds can answer it)."""
    if row.get("unanswerable"):
        return False
    return row["resolved"] or (row["seeds_needed"] or math.inf) <= min(row["seeds"])


def _open_hours(rows: list[dict], seconds: dict[str, float]) -> float | None:
    """The hours to bring each cell of the open comparisons to the seeds its comparisons need, at its own
    seconds a run: the cells that need seeds, not the whole grid."""
    need: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r["seeds_needed"] is None:
            return None
        for cell, have in zip(r["cells"], r["seeds"]):
            want = max(need.get(cell, (0, have))[0], r["seeds_needed"])
            need[cell] = (want, have)
    if any(cell not in seconds for cell in need):
        return None
    return sum(max(want - have, 0) * seconds[cell] for cell, (want, have) in need.items()) / JOBS / 3600


def verdict(plan: dict) -> str:
    """The plan's one line: answered by the seeds run, or untested with the seeds and hours it needs."""
    if plan["problems"]:
        return "untested: " + "; ".join(plan["problems"]) + " (a longer budget or an easier task first)"
    rows = plan["comparisons"]
    if rows and all(_answered(r) for r in rows):
        return "answered: every comparison is resolved or its seeds detect what the plan plans for"
    if blocked := [r for r in rows if r.get("unanswerable")]:
        open_others = sum(not _answered(r) for r in rows if not r.get("unanswerable"))
        if open_others:
            rest = f"; {open_others} others need seeds"
        elif len(blocked) < len(rows):
            rest = "; the other comparisons are answered"
        else:
            rest = ""
        return (
            f"untested: in {len(blocked)} of {len(rows)} comparisons {' or '.join(sorted({r['unanswerable'] for r in blocked}))} "
            f"(a longer budget or an easier task first){rest}"
        )
    if plan["seeds_for_all"] is None:
        return "untested: no seed spread to plan from (run the plan with --pilot)"
    open_rows = [r for r in rows if not _answered(r)]
    hours = plan["hours_for_all"]
    over = f", over the {plan['hours_cap']:g} hours allowed" if hours is None or hours > plan["hours_cap"] else ""
    return (
        f"untested: needs {plan['seeds_for_all']} seeds a side"
        + (f" ({hours:.1f} hours on this machine for the cells that need them)" if hours is not None else "")
        + f"{over} for {len(open_rows)} of {len(rows)} comparisons"
    )


PLANNED_FOR = {
    "continuous": "Welch's test finds the declared difference with 80 % power, each cell's sd at its upper 80 % "
    "bound (and never below the metric's resolution), and no fewer than the exact test needs where it decides",
    "learned": "Fisher's exact test finds, with 80 % power, an arm that never learns where the reference learns "
    "at its observed rate",
}
PLANNED_FOR["onset"] = PLANNED_FOR["learned"] + "; the log-rank test's power now is simulated from the arms' own runs"


def seeds_cell(row: dict) -> str:
    """The seeds a comparison needs: "resolved", "untested" where no number of seeds answers it, else a count."""
    if row["resolved"]:
        return "resolved"
    return "untested" if row.get("unanswerable") else num(row["seeds_needed"], "d")


def budget_cell(row: dict) -> str:
    """Whether the study's hours bring a comparison to the seeds it needs; "-" where it needs none."""
    if row["resolved"]:
        return "-"
    return "yes" if row["within_budget"] else "no"


def num(x, fmt=".3g") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def markdown(plan: dict) -> str:
    floor = plan["task_floor"] or {}
    seconds = plan["seconds_per_cell"] or {}
    loads = plan["load_per_cpu"] or {}
    lines = [
        f"# Plan: {plan['study']}",
        "",
        f"**{verdict(plan)}**",
        "",
        f"Outcome {plan['outcome']}; primary metric {plan['metric']}, declared difference {num(plan['difference'])}; "
        f"{plan['runs_read']} finished runs read ({plan['runs_left_out']} left out: trained with other settings); "
        f"{plan['cells']} cells; {JOBS} runs at once; at most {num(plan['most_seeds'], 'd')} seeds a cell fit in "
        f"{plan['hours_cap']:g} hours. Seeds needed: the fewest a side at which {PLANNED_FOR[plan['outcome']]}.",
        "",
        f"Reference arm: val loss {num(plan['reference_val_loss'], '.4f')} against the attention-free level "
        f"{num(plan['attention_free_level'], '.4f')}; answer accuracy {num(plan['reference_val_acc'], '.3f')}"
        + (f" (must reach {plan['learned']})" if plan["learned"] is not None else "")
        + "".join(f"; floor ({k}) {v:.3f}" for k, v in floor.items())
        + ".",
        "",
    ]
    if plan["outcome"] in ("learned", "onset"):
        lines += [
            "| comparison | where | seeds now | reference | level | test | p (Holm) | power now (never learns) "
            "| power now (log-rank) | seeds needed | within budget |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in plan["comparisons"]:
            lines.append(
                f"| {r['comparison']} | {r['where']} | {r['seeds'][0]}, {r['seeds'][1]} | {r['reference']} | {r['level']} "
                f"| {r['test']} | {num(r['p_holm'], '.2g')} | {num(r['power_never_learns'], '.2f')} "
                f"| {num(r['power_logrank'], '.2f')} | {seeds_cell(r)} "
                f"| {budget_cell(r)} |"
            )
    else:
        lines += [
            "| comparison | where | seeds now | reference | level | std (ref, level) | sd planned (ref, level) | test "
            "| p (Holm) | seeds needed (80 % power) | within budget |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in plan["comparisons"]:
            sd = r["sd_planned"]
            lines.append(
                f"| {r['comparison']} | {r['where']} | {r['seeds'][0]}, {r['seeds'][1]} | {num(r['reference'], '.4g')} "
                f"| {num(r['level'], '.4g')} | {num(r['std_reference'])}, {num(r['std_level'])} | {num(sd[0])}, {num(sd[1])} "
                f"| {r['test']} | {num(r['p_holm'], '.2g')} "
                f"| {seeds_cell(r)} | {budget_cell(r)} |"
            )
    lines += ["", "| cell | seconds a run (its median) | machine load per CPU (median) |", "|---|---|---|"]
    lines += [f"| {cell} | {sec:.0f} | {num(loads.get(cell), '.2f')} |" for cell, sec in seconds.items()]
    return "\n".join(lines) + "\n"


def write(plan: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan["verdict"] = verdict(plan)  # what the study's report opens with
    atomic_write_text(out / PLAN, json.dumps(plan, indent=2, default=float) + "\n")
    atomic_write_text(out / "plan.md", markdown(plan))


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("plan", "Plan a study's seeds from its runs before the compute.")
    parser.add_argument("study", help="one of: " + ", ".join(study_names()))
    parser.add_argument("--from", dest="dirs", nargs="*", default=None, help="sweep dirs to read (default: runs.csv)")
    parser.add_argument(
        "--pilot", action="store_true", help=f"first run {PILOT_SEEDS} seeds of every cell (make sweep, resumable)"
    )
    parser.add_argument("--hours", type=float, default=None, help="the study's time cap (default: question.hours)")
    parser.add_argument("--reports", default="reports")
    args, extra = parser.parse_known_args(argv)
    if (refusal := unknown_study(args.study, "STUDY")) is not None:
        print(refusal, file=sys.stderr)
        return 2
    out = Path(args.reports) / args.study
    if args.pilot:
        sweep(["--study", args.study, "--seeds", str(PILOT_SEEDS), "--jobs", str(JOBS), *extra])
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
    if (out / "summary.json").is_file():  # the study's page leads with its plan's verdict: rendered again
        write_report(out, json.loads((out / "summary.json").read_text()), draw=False)
    print(markdown(plan), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
