"""Breakdown of one whole ``attnlab train`` run: phase, seconds, share of the run.

The bench starts the command ``make train`` runs (``python -m attnlab.cli train OVERRIDES``) with
``ATTNLAB_PHASES=OUT.json``: the run records its own phases (``attnlab.training.phases``: the steps of
``attnlab.training.train``, from the process's start, and inside fit Lightning's profiler actions) and
writes them when it exits. The bench times the whole process from outside, as a user's ``make
train`` would be timed; what the recorder cannot see (process creation, interpreter teardown after
the exit handlers) is the wall time minus the recorded span. ``phases.row_of`` turns the phases
into the table's rows. ``--cprofile`` adds the functions with the most self time, from a second run
under ``python -m cProfile`` (cProfile inflates Python time, so that run's seconds are not the table's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from attnlab.tools.bench.phase_rows import GROUPS, group_of
from attnlab.tools.bench.phase_rows import rows as phase_rows
from attnlab.training.phases import ENV

OUTSIDE = "outside every phase (exit handlers: W&B, logging)"
INTERPRETER = "interpreter start and exit (wall minus the recorded span)"
ATTNLAB_TRAIN = ("-m", "attnlab.cli", "train")  # what ``make train`` runs, after the interpreter


def top_functions(path: Path, n: int = 25) -> list[dict]:
    import pstats

    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})" if line else func,
                "calls": calls,
                "self_s": tottime,
                "cum_s": cumtime,
            }
        )
    return sorted(rows, key=lambda r: -r["self_s"])[:n]


# ---------------------------------------------------------------------------------------- parent


def run_child(overrides: list[str], run_dir: Path, cprofile: bool = False, env: dict | None = None) -> dict:
    """One ``attnlab train`` run in a fresh process, recording its phases; plus ``wall_s`` measured from outside."""
    out = run_dir.parent / f"{run_dir.name}.phases.json"
    prof = run_dir.parent / f"{run_dir.name}.cprofile"
    env = dict(os.environ if env is None else env)
    if cprofile:
        env.pop(ENV, None)
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), *ATTNLAB_TRAIN]
    else:
        env[ENV] = str(out)
        cmd = [sys.executable, *ATTNLAB_TRAIN]
    cmd += [*overrides, f"hydra.run.dir={run_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode or not (prof if cprofile else out).exists():
        raise RuntimeError(f"breakdown run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    data = {"cprofile_top": top_functions(prof)} if cprofile else json.loads(out.read_text())
    data["wall_s"] = wall
    results = json.loads((run_dir / "results.json").read_text())
    data["steps"] = int(results["metrics"].get("step", 0))
    data["results_wall_s"] = results.get("wall_s")
    data["median_tokens_per_s"] = results["metrics"].get("perf/tokens_per_s")
    return data


def table(data: dict) -> list[dict]:
    """Rows (group, phase, seconds, share, calls, ms per call) that add up to the process's wall time."""
    wall, steps = data["wall_s"], max(1, data.get("steps") or 1)
    seconds, calls = phase_rows(data["seconds"], data["calls"])
    # the recorded span, less its phases: the exit handlers that run after main() returns
    seconds[OUTSIDE] = data["span_s"] - sum(data["seconds"].values())
    seconds = {INTERPRETER: wall - data["span_s"], **seconds}
    rows = []
    for phase, sec in seconds.items():
        n = calls.get(phase, 1)
        rows.append(
            {
                "group": group_of(phase),
                "phase": phase,
                "seconds": sec,
                "share": sec / wall,
                "calls": n,
                "ms_per_call": sec * 1e3 / n,
                "ms_per_step": sec * 1e3 / steps,
            }
        )
    order = [g for g, _ in GROUPS] + ["other"]
    return sorted(rows, key=lambda r: (order.index(r["group"]), -r["seconds"]))


def group_totals(rows: list[dict]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in rows:
        totals[r["group"]] = totals.get(r["group"], 0.0) + r["seconds"]
    return totals


def breakdown(
    overrides: list[str], work_dir: Path, cprofile: bool = True, log=print, cprofile_overrides: list[str] = ()
) -> dict:
    """A timed run (table) and, with ``cprofile``, a second, profiled run (top functions only; with
    ``cprofile_overrides`` added, e.g. fewer steps, since cProfile slows every Python call)."""
    load_before = list(os.getloadavg())
    timed = run_child(overrides, work_dir / "timed")
    log(f"  breakdown: {timed['wall_s']:.1f} s wall, {timed['steps']} steps")
    result = {
        "overrides": overrides,
        "wall_s": timed["wall_s"],
        "steps": timed["steps"],
        "median_tokens_per_s": timed["median_tokens_per_s"],
        "rows": table(timed),
        "load": [load_before, list(os.getloadavg())],
        "background_s": timed.get("background_s", {}),
    }
    result["groups"] = group_totals(result["rows"])
    if cprofile:
        profiled = run_child([*overrides, *cprofile_overrides], work_dir / "profiled", cprofile=True)
        result["cprofile_top"] = profiled.get("cprofile_top", [])
        result["cprofile_run"] = {
            "overrides": [*overrides, *cprofile_overrides],
            "wall_s": profiled["wall_s"],
            "steps": profiled["steps"],
        }
    return result
