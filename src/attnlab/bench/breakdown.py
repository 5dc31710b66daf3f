"""Breakdown of one whole ``python -m attnlab.train`` run: phase, seconds, share of the run.

The parent starts ``python -m attnlab.bench.breakdown --child OUT.json -- OVERRIDES`` and times the
whole process, as a user's ``make train`` would be timed. The child times its own imports, wraps
the training code path in ``phases.instrument`` and calls the same ``attnlab.train.main`` the CLI
calls; what the child cannot see (interpreter start and exit) is the parent's wall time minus the
child's span. ``--cprofile`` adds the functions with the most self time (cProfile inflates Python
time, so that run's seconds are not the table's).
"""
from __future__ import annotations

import time

T_START = time.perf_counter()  # before the heavy imports below: the child's imports are timed from here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

GROUPS = (  # (group, phase-name prefixes) in the table's order
    ("start-up", ("interpreter", "imports", "W&B: import", "Hydra")),
    ("set-up", ("data:", "model:", "trainer:", "callbacks: build", "kernel check", "git sha", "W&B: init",
                "W&B: log config", "CSV: log config")),
    ("training steps", ("step:", "Lightning loop")),
    ("callbacks during training", ("callback",)),
    ("logging", ("W&B: log", "CSV:")),
    ("validation and checkpoints", ("validation", "checkpoint")),
    ("end of run", ("W&B: finish", "results.json", "train()")),
)


def group_of(phase: str) -> str:
    from .phases import is_end_of_training

    if is_end_of_training(phase):
        return "end of run"
    for group, prefixes in GROUPS:
        if any(phase.startswith(p) for p in prefixes):
            return group
    return "other"


# ----------------------------------------------------------------------------------------- child


def child(out: Path, overrides: list[str], cprofile: bool) -> int:
    import attnlab.train as train_mod  # the CLI's own imports: torch, lightning, hydra, attnlab

    imports_s = time.perf_counter() - T_START
    t = time.perf_counter()
    import wandb  # noqa: F401  (imported here so its cost is its own row; a real run pays it in WandbLogger())

    wandb_import_s = time.perf_counter() - t
    from .phases import PhaseTimer, instrument

    timer = PhaseTimer()
    rc, profiler = 0, None
    if cprofile:
        import cProfile

        profiler = cProfile.Profile()
    t_main = time.perf_counter()
    with instrument(timer):
        sys.argv = ["attnlab.train", *overrides]
        with timer.phase("Hydra: parse, compose, run dir, log set-up, exit"):
            try:
                if profiler:
                    profiler.enable()
                train_mod.main()
            except SystemExit as err:
                rc = int(err.code or 0)
            finally:
                if profiler:
                    profiler.disable()
    main_s = time.perf_counter() - t_main
    data = {"imports_s": imports_s, "wandb_import_s": wandb_import_s, "main_s": main_s, "rc": rc,
            "seconds": timer.seconds, "calls": timer.calls, "background_s": timer.background,
            "span_s": time.perf_counter() - T_START}
    if profiler:
        data["cprofile_top"] = top_functions(profiler)
    out.write_text(json.dumps(data, indent=1))
    return rc


def top_functions(profiler, n: int = 25) -> list[dict]:
    import pstats

    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}({func})" if line else func, "calls": calls,
                     "self_s": tottime, "cum_s": cumtime})
    return sorted(rows, key=lambda r: -r["self_s"])[:n]


# ---------------------------------------------------------------------------------------- parent


def run_child(overrides: list[str], run_dir: Path, cprofile: bool = False, env: dict | None = None) -> dict:
    """One instrumented run in a fresh process; its phases plus ``wall_s`` measured from outside."""
    out = run_dir.parent / f"{run_dir.name}.phases.json"
    cmd = [sys.executable, "-m", "attnlab.bench.breakdown", "--child", str(out), *(["--cprofile"] if cprofile else []),
           "--", *overrides, f"hydra.run.dir={run_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode or not out.exists():
        raise RuntimeError(f"breakdown run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    data["wall_s"] = wall
    results = json.loads((run_dir / "results.json").read_text())
    data["steps"] = int(results["metrics"].get("step", 0))
    data["results_wall_s"] = results.get("wall_s")
    data["median_tokens_per_s"] = results["metrics"].get("perf/tokens_per_s")
    return data


def table(data: dict) -> list[dict]:
    """Rows (group, phase, seconds, share, calls, ms per call) that add up to the process's wall time."""
    wall, steps = data["wall_s"], max(1, data.get("steps") or 1)
    in_child = {"imports (torch, lightning, hydra, attnlab)": data["imports_s"], "W&B: import": data["wandb_import_s"],
                **data["seconds"]}
    # what the child spent outside every phase: wrapping and unwrapping the hooks, reading the clock
    in_child["the breakdown's own instrumentation"] = data["span_s"] - sum(in_child.values())
    seconds = {"interpreter start and exit (wall minus the child's span)": wall - data["span_s"], **in_child}
    calls = data["calls"]
    rows = []
    for phase, sec in seconds.items():
        n = calls.get(phase, 1)
        rows.append({"group": group_of(phase), "phase": phase, "seconds": sec, "share": sec / wall, "calls": n,
                     "ms_per_call": sec * 1e3 / n, "ms_per_step": sec * 1e3 / steps})
    order = [g for g, _ in GROUPS] + ["other"]
    return sorted(rows, key=lambda r: (order.index(r["group"]), -r["seconds"]))


def group_totals(rows: list[dict]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in rows:
        totals[r["group"]] = totals.get(r["group"], 0.0) + r["seconds"]
    return totals


def breakdown(overrides: list[str], work_dir: Path, cprofile: bool = True, log=print,
              cprofile_overrides: list[str] = ()) -> dict:
    """A timed run (table) and, with ``cprofile``, a second, profiled run (top functions only; with
    ``cprofile_overrides`` added, e.g. fewer steps, since cProfile slows every Python call)."""
    load_before = list(os.getloadavg())
    timed = run_child(overrides, work_dir / "timed")
    log(f"  breakdown: {timed['wall_s']:.1f} s wall, {timed['steps']} steps")
    result = {"overrides": overrides, "wall_s": timed["wall_s"], "steps": timed["steps"],
              "median_tokens_per_s": timed["median_tokens_per_s"], "rows": table(timed),
              "load": [load_before, list(os.getloadavg())], "background_s": timed.get("background_s", {})}
    result["groups"] = group_totals(result["rows"])
    if cprofile:
        profiled = run_child([*overrides, *cprofile_overrides], work_dir / "profiled", cprofile=True)
        result["cprofile_top"] = profiled.get("cprofile_top", [])
        result["cprofile_run"] = {"overrides": [*overrides, *cprofile_overrides], "wall_s": profiled["wall_s"],
                                  "steps": profiled["steps"]}
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m attnlab.bench.breakdown")
    p.add_argument("--child", required=True, help="(internal) write this run's phases to this JSON file")
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args(own)
    return child(Path(args.child), overrides, args.cprofile)


if __name__ == "__main__":
    sys.exit(main())
