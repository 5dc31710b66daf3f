"""``attnlab verify STUDY``: train committed rows of reports/<STUDY>/runs.csv again and compare their final
metrics bit for bit, so a row's provenance is checked, not only recorded.

A CPU run repeats exactly at the same code, torch, device and thread count; so each sampled row is trained
alone at its recorded thread count (1, a sweep's, where it records none) and every metric of the trained
model is compared (the machine's own measures, throughput, load, peak memory and wall time, are not).
Per cell: ``identical``, ``differs`` (the largest difference and its metric) or ``not checkable`` (why).
The record goes to reports/<STUDY>/verify.json and the report states it. ``--stamp``: a row without
provenance that came back identical takes the new run's provenance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from attnlab.studies.report import write_report
from attnlab.studies.report.data import (
    META,
    axes_of,
    cell_overrides,
    provenance_of,
    read_runs,
    today_fingerprint,
    write_runs,
)
from attnlab.studies.report.provenance import VERIFY
from attnlab.training.results import FINISHED_ENV, PROVENANCE, RESULTS, provenance
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text

# what measures the machine, not the trained model: not expected to repeat
MACHINE = ("perf/", "machine/", "mem/peak", "wall_s")
SWEEP_THREADS = "1"  # what a row that records no thread count was trained at: a sweep's 1 thread a job


@dataclass
class Check:
    """One sampled row and what training it again gave."""

    cell: dict[str, str]
    budget: str
    seed: int
    threads: str
    verdict: str = "not checkable"
    detail: str = ""
    metric: str | None = None
    difference: float | None = None
    compared: int = 0
    provenance: dict = field(default_factory=dict)


def compared_metrics(row: pd.Series) -> list[str]:
    """The row's final metrics of the trained model (every numeric column but the machine's)."""
    return [
        c
        for c in row.index
        if c not in META and not c.startswith(MACHINE) and isinstance(row[c], (int, float)) and pd.notna(row[c])
    ]


def compare(row: pd.Series, metrics: dict) -> tuple[str, str, str | None, float | None, int]:
    """(verdict, detail, metric, difference, how many compared): identical only where every value is equal."""
    names = compared_metrics(row)
    missing = [n for n in names if n not in metrics]
    worst, gap, differing = None, 0.0, 0
    for name in names:
        if name in metrics and float(metrics[name]) != float(row[name]):
            differing += 1
            diff = abs(float(metrics[name]) - float(row[name]))
            if worst is None or diff > gap:
                worst, gap = name, diff
    if worst is not None:
        return (
            "differs",
            f"{differing} of {len(names)} metrics differ, most {worst} by {gap:.3g} "
            f"({float(row[worst])!r} committed, {float(metrics[worst])!r} now)",
            worst,
            gap,
            len(names),
        )
    if not names or len(missing) == len(names):
        return "not checkable", "the new run logged none of the row's metrics", None, None, 0
    note = f"; {len(missing)} not logged now ({', '.join(missing[:3])})" if missing else ""
    return "identical", f"{len(names) - len(missing)} metrics equal bit for bit{note}", None, 0.0, len(names)


def sample(frame: pd.DataFrame, seeds: int | None) -> list[pd.Series]:
    """``seeds`` finished rows of each cell (None: all of them), those that record the least first (no
    commit before a commit), then the lowest seeds: the rows whose provenance is least known get checked."""
    axes = axes_of(frame)
    ok = frame[frame["status"] == "ok"].copy()
    ok["_known"] = ok["commit"].fillna("").astype(str) != "" if "commit" in ok else False
    ok = ok.sort_values(["_known", "seed"], kind="stable")
    rows = []
    for _, cell in ok.groupby([*axes, "budget"], sort=False, dropna=False):
        rows += [r.drop("_known") for _, r in (cell if seeds is None else cell.head(seeds)).iterrows()]
    return rows


def why_not(row: pd.Series, study: str, axes: list[str], here: str) -> str | None:
    """Why a row cannot be trained again here, or None."""
    device = str(row.get("device") or "")
    if device and device.split(":")[0] != here.split(":")[0]:
        return f"trained on {device}; this machine trains on {here}"
    fingerprint = str(row.get("config") or "")
    if fingerprint:
        today = today_fingerprint(study, tuple((a, str(row[a])) for a in axes), row["budget"])
        if today != fingerprint:
            return f"trained other settings than today's experiment file (fingerprint {fingerprint}, today {today})"
    return None


def train_again(study: str, row: pd.Series, axes: list[str], threads: str, run_dir: Path) -> dict:
    """The row's cell and seed trained alone, at ``threads``; its results.json."""
    overrides = [*cell_overrides(study, {a: row[a] for a in axes}, row["budget"]), f"seed={int(row['seed'])}"]
    env = dict(os.environ) | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "WANDB_MODE": "offline"}
    env.pop(FINISHED_ENV, None)  # never skipped as finished: the point is to train it
    cmd = [sys.executable, "-m", "attnlab.training.train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    results = run_dir / RESULTS
    if not results.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"status": "failed", "error": tail[0]}
    return json.loads(results.read_text())


def check(study: str, row: pd.Series, axes: list[str], reason: str | None, run_dir: Path) -> Check:
    """Train ``row`` again unless ``reason`` (``why_not``'s) says it cannot be here."""
    threads = str(row.get("threads") or "") or SWEEP_THREADS
    found = Check({a: str(row[a]) for a in axes}, str(row["budget"]), int(row["seed"]), threads)
    if reason is not None:
        found.detail = reason
        return found
    results = train_again(study, row, axes, threads, run_dir)
    if results.get("status") != "ok":
        found.detail = f"the run did not finish: {results.get('error')}"
        return found
    found.provenance = provenance_of(results)
    found.verdict, found.detail, found.metric, found.difference, found.compared = compare(row, results["metrics"])
    return found


def stamp(frame: pd.DataFrame, checks: list[Check], axes: list[str]) -> int:
    """Rows without provenance that came back identical take the new run's; returns how many."""
    stamped = 0
    for found in checks:
        if found.verdict != "identical":
            continue
        match = (frame["seed"] == found.seed) & (frame["budget"] == found.budget)
        for a in axes:
            match &= frame[a].astype(str) == found.cell[a]
        for i in frame.index[match]:
            if not str(frame.at[i, "config"] if "config" in frame else ""):
                for column in PROVENANCE:
                    frame.loc[i, column] = found.provenance[column]
                stamped += 1
    return stamped


def verify(study: str, reports: Path, seeds: int | None, jobs: int, do_stamp: bool) -> list[Check]:
    path = reports / study / "runs.csv"
    frame = read_runs(path)
    axes = axes_of(frame)
    made = provenance({}, torch.device("cpu"))
    here = made["device"]
    rows = sample(frame, seeds)
    with tempfile.TemporaryDirectory(prefix=f"attnlab-verify-{study}-") as scratch:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # composing today's config is Hydra's global state: done here, one row after the other
            reasons = [why_not(row, study, axes, here) for row in rows]
            runs = [(row, reason, Path(scratch) / str(i)) for i, (row, reason) in enumerate(zip(rows, reasons))]
            checks = list(pool.map(lambda job: check(study, job[0], axes, job[1], job[2]), runs))
    record = {k: made[k] for k in ("version", "commit", "dirty", "torch", "device")} | {
        "threads": sorted({c.threads for c in checks}),
        "cells": [asdict(c) for c in checks],
    }
    atomic_write_text(reports / study / VERIFY, json.dumps(record, indent=2) + "\n")
    if do_stamp:
        for column in PROVENANCE:
            if column not in frame:
                frame.insert(list(frame.columns).index("run"), column, "")
        if (count := stamp(frame, checks, axes)) > 0:
            write_runs(frame, path)
            print(f"attnlab: {count} rows without provenance reproduced bit for bit: stamped in {path}")
    if (reports / study / "summary.json").is_file():  # the page states what was verified
        write_report(reports / study, draw=False)
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("verify", "Train committed rows of a study again and compare them bit for bit.")
    parser.add_argument("study", help="a study with a reports/<study>/runs.csv")
    parser.add_argument("--seeds", default="1", help="seeds a cell to train again: a count, or all (default 1)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each at its row's thread count)")
    parser.add_argument(
        "--stamp", action="store_true", help="give rows without provenance that repeat exactly the new run's"
    )
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    if not (args.reports / args.study / "runs.csv").is_file():
        known = sorted(p.parent.name for p in args.reports.glob("*/runs.csv"))
        parser.error(
            f"STUDY={args.study!r} has no {args.reports}/{args.study}/runs.csv; expected one of: {', '.join(known)}"
        )
    if args.seeds != "all" and not (args.seeds.isdigit() and int(args.seeds) > 0):
        parser.error(f"--seeds={args.seeds!r}; expected a positive count or all")
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs}; expected 1 or more")
    checks = verify(args.study, args.reports, None if args.seeds == "all" else int(args.seeds), args.jobs, args.stamp)
    for found in checks:
        print(
            f"attnlab: {', '.join(f'{k}={v}' for k, v in found.cell.items())} seed {found.seed}: {found.verdict} ({found.detail})"
        )
    count = {v: sum(c.verdict == v for c in checks) for v in ("identical", "differs", "not checkable")}
    print(
        f"attnlab: {count['identical']} identical, {count['differs']} differ, {count['not checkable']} not checkable "
        f"-> {args.reports / args.study / VERIFY}"
    )
    return 0 if count["identical"] and not count["differs"] else 1  # nothing compared is no check


if __name__ == "__main__":
    sys.exit(main())
