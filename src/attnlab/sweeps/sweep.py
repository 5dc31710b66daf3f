"""``make sweep``: run a study as a Hydra multirun, then aggregate it into reports/<study>/.

    python -m attnlab.sweeps.sweep --study dk_scaling [--seeds 3] --jobs 2 [extra hydra overrides]
    python -m attnlab.sweeps.sweep --study dk_scaling --launcher slurm --partition gpu [...]

Equivalent to ``python -m attnlab.training.train -m experiment=<study> seed=0,1,2`` with a known sweep dir,
followed by ``python -m attnlab.studies.report <sweep dir>``. Failed cells do not stop the others; the
exit code is non-zero if any cell failed. ``--launcher slurm`` submits the cells as SLURM jobs
(``hydra/launcher=slurm``, one array) and builds the same table once they have all ended.

The console follows the study, not its steps: one line per finished cell (its axis values and seed,
its val loss or its error) with the cells finished of the total, the failures and the time left,
read from the runs' results.json (:class:`SweepProgress`). Each job prints into its run dir's
console.log; Hydra's own lines go to the sweep dir's multirun.log.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from attnlab.config.study import DEFAULT_STUDY, load_study, study_names
from attnlab.sweeps import resume
from attnlab.training.console import RUN_LOG, RUN_LOG_ENV, clock
from attnlab.training.results import FINISHED_ENV, RESULTS
from attnlab.util.cli import command_parser


def unknown_study(name: str, key: str) -> str | None:
    """The one-line refusal of a name that is not a study, or None."""
    if name in study_names():
        return None
    return f"attnlab: error: {key} {name!r} is not a study; expected one of {', '.join(study_names())}"


def declared_seeds(study: str) -> int:
    """The seeds ``experiment=<study>`` declares (``question.seeds``: what its committed report ran with);
    1 for a study that declares none."""
    seeds = load_study(study).question.seeds
    if seeds == "auto":  # the plan's seeds (make plan), under the study's time cap
        return planned_seeds(study)
    return int(seeds)


PLAN = "plan.json"  # reports/<study>/plan.json, written by `attnlab plan`


def planned_seeds(study: str, reports: Path = Path("reports")) -> int:
    """The seeds ``question.seeds: auto`` runs: the plan's, at least 2."""
    path = reports / study / PLAN
    if not path.is_file():
        raise SystemExit(
            f"attnlab: error: question.seeds=auto: {path} does not exist; expected a plan first: make plan SWEEP={study}"
        )
    return max(2, int(json.loads(path.read_text())["seeds"] or 2))


def sweep_axes(study: str, seeds: int = 1, extra: list[str] = ()) -> dict[str, list]:
    """The axes a sweep runs, as Hydra's sweeper expands them: the study's grid, where a command-line value
    replaces its axis and a command-line sweep (``a,b``, ``range(...)``) adds one, and the seeds."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    axes = load_study(study).grid
    for text in extra:
        try:
            override = parser.parse_override(text)
        except HydraException:
            continue  # the multirun refuses it in its own words
        if override.is_sweep_override():
            axes[override.key_or_group] = list(override.sweep_iterator())
        elif override.key_or_group in axes:
            axes[override.key_or_group] = [override.value()]
    if seeds > 1 and "seed" not in axes:
        axes["seed"] = list(range(seeds))
    return axes


# the statuses results.json holds once a run has ended (skipped: finished in the study's runs.csv before)
FINISHED = ("ok", "failed", "interrupted", "skipped")


@dataclass
class Cell:
    name: str
    status: str
    val_loss: float | None
    error: str | None
    wall_s: float | None


class SweepProgress:
    """A sweep followed through its runs' results.json files, one line per cell that ends.

    A line: ``[finished/total, failed, time left] axis values and seed: val/loss x (wall)``. The time left
    is the sweep's pace so far (elapsed over cells finished, so parallel jobs count) times the cells to go.
    A cell whose status changes (a SLURM job requeued after ``interrupted``) is counted once, as it is now.
    """

    def __init__(
        self,
        sweep_dir: Path,
        axes: dict[str, list],
        stream: TextIO | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ):
        self.sweep_dir, self.stream, self.clock_s = Path(sweep_dir), stream, clock_s
        self.total = math.prod(len(values) for values in axes.values())
        self.named = [key for key, values in axes.items() if len(values) > 1 and key != "seed"]
        self.started = clock_s()
        self.cells: dict[str, Cell] = {}  # run dir name -> its cell, as last read
        self.earlier: set[str] = set()  # runs a resumed sweep dir held when it started again
        self._seen: dict[str, tuple] = {}  # run dir name -> its results.json (inode, mtime, size) when last read

    @property
    def finished(self) -> int:
        return len(self.cells)

    @property
    def failed(self) -> int:
        return sum(cell.status not in ("ok", "skipped") for cell in self.cells.values())

    @property
    def skipped(self) -> int:
        return sum(cell.status == "skipped" for cell in self.cells.values())

    def absorb(self) -> int:
        """Count the runs a resumed sweep dir already holds, without a line each; returns how many ended ok."""
        self.poll(echo=False)
        self.earlier = {run for run, cell in self.cells.items() if cell.status == "ok"}
        self.cells = {run: cell for run, cell in self.cells.items() if run in self.earlier}
        self.started = self.clock_s()
        return len(self.earlier)

    def eta_s(self) -> float | None:
        ran = self.finished - self.skipped - len(self.earlier)  # the pace of the runs trained by this sweep
        if ran <= 0:
            return None
        return (self.clock_s() - self.started) / ran * max(self.total - self.finished, 0)

    def cell_name(self, record: dict) -> str:
        """The cell's swept values as its overrides wrote them (the key's last part unless two axes share
        it), then its seed."""
        given = dict(o.lstrip("+").split("=", 1) for o in record.get("overrides") or [] if "=" in o)
        short = [key.rsplit(".", 1)[-1] for key in self.named]
        parts = [
            f"{label if short.count(label) == 1 else key}={given.get(key, '?')}"
            for key, label in zip(self.named, short)
        ]
        return " ".join([*parts, f"seed={(record.get('config') or {}).get('seed', given.get('seed', '?'))}"])

    def poll(self, echo: bool = True) -> list[str]:
        """Read the results.json files written since the last poll; print (with ``echo``) and return a line per
        ended cell."""
        lines = []
        for path in sorted(self.sweep_dir.glob(f"*/{RESULTS}"), key=lambda p: (len(p.parent.name), p.parent.name)):
            try:
                stat = path.stat()  # results.json is replaced by a rename: a new version is a new inode
                version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if self._seen.get(path.parent.name) == version:
                    continue
                record = json.loads(path.read_text())
                loss = (record.get("metrics") or {}).get("val/loss")
                loss = float(loss) if isinstance(loss, (int, float, str)) else None  # a diverged run's is "nan"
            except (OSError, ValueError):
                continue  # replaced while read: the next poll sees the new file
            run = path.parent.name
            self._seen[run] = version
            if record.get("status") not in FINISHED:
                continue
            self.cells[run] = Cell(
                self.cell_name(record),
                record["status"],
                loss,
                " ".join(str(record.get("error") or "").split())[:300] or None,
                record.get("wall_s"),
            )
            lines.append(self.line(self.cells[run]))
        for line in lines if echo else ():
            print(line, file=self.stream or sys.stdout, flush=True)
        return lines

    def line(self, cell: Cell) -> str:

        eta = self.eta_s()
        left = clock(eta) if eta is not None else "?"
        where = f"[{self.finished}/{max(self.total, self.finished)}, {self.failed} failed, {left} left]"
        if cell.status == "ok":
            what = f"val/loss {cell.val_loss:.4f}" if cell.val_loss is not None else "val/loss -"
        elif cell.status == "skipped":
            what = "finished before (its row in the study's runs.csv)"
        else:
            what = f"{cell.status.upper()}: {cell.error or 'no error recorded'}"
        took = f" ({clock(cell.wall_s)})" if isinstance(cell.wall_s, (int, float)) else ""
        return f"attnlab: {where} {cell.name}: {what}{took}"


def follow(progress: SweepProgress, every_s: float = 2.0) -> Callable[[], None]:
    """Poll ``progress`` from a thread; the returned function stops it and reads what ended meanwhile."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            progress.poll()

    thread = threading.Thread(target=loop, name="attnlab-sweep-progress", daemon=True)
    thread.start()

    def done() -> None:
        stop.set()
        thread.join()
        progress.poll()

    return done


def wandb_command(study: str) -> list[str]:
    """What a W&B agent runs: the study's experiment file supplies every fixed value, the agent the grid's."""
    return ["attnlab", "train", f"experiment={study}", "logger.wandb.mode=online", "${args_no_hyphens}"]


def wandb_sweep_yaml(study: str) -> str:
    """sweeps/<study>.yaml, a W&B grid sweep generated from conf/experiment/<study>.yaml."""

    def flow(values) -> str:
        return "[" + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values) + "]"

    params = "\n".join(f"  {key}: {{values: {flow(values)}}}" for key, values in load_study(study).grid.items())
    command = flow(f'"{arg}"' if arg.startswith("$") else arg for arg in wandb_command(study))
    return (
        f"# W&B grid sweep generated from conf/experiment/{study}.yaml: edit that file, then\n"
        f"#   attnlab sweep --study {study} --wandb-spec > sweeps/{study}.yaml\n"
        f"# Run it (network and a W&B login): wandb sweep sweeps/{study}.yaml; wandb agent <id>\n"
        f"program: attnlab\nproject: attnlab\nname: {study}\nmethod: grid\n"
        f"metric: {{name: val/loss, goal: minimize}}\nparameters:\n{params}\n"
        f"command: {command}\n"
    )


LAUNCHERS = ("local", "slurm")


def sweep_command(
    study: str,
    seeds: int,
    jobs: int,
    sweep_dir: Path,
    extra: list[str],
    launcher: str = "local",
    partition: str | None = None,
) -> list[str]:
    cmd = [sys.executable, "-m", "attnlab.training.train", "-m", f"experiment={study}", f"hydra.sweep.dir={sweep_dir}"]
    if seeds > 1:
        cmd.append(f"seed=range(0,{seeds})")
    if launcher == "slurm":  # the scheduler decides how many run at once; each job gets the CPUs it asked for
        cmd.append("hydra/launcher=slurm")
        return cmd + ([f"hydra.launcher.partition={partition}"] if partition else []) + extra
    if jobs > 1:
        # each job gets its share of the cores instead of all of them fighting for every core
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("sweep", "Run a study (Hydra multirun) and build its report.")
    parser.add_argument("--study", default=DEFAULT_STUDY, help="one of: " + ", ".join(study_names()))
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..N-1 (default: the study's question.seeds, else 1)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="parallel jobs (joblib launcher) when > 1; local launcher only"
    )
    parser.add_argument(
        "--launcher",
        default="local",
        choices=LAUNCHERS,
        help="local: on this machine; slurm: as SLURM jobs (conf/hydra/launcher/slurm.yaml)",
    )
    parser.add_argument(
        "--partition", default=None, help="the SLURM partition (--launcher slurm; default: the cluster's)"
    )
    parser.add_argument("--logs", default="logs/train/multiruns")
    parser.add_argument("--wandb-spec", action="store_true", help="print the study's W&B grid sweep file and exit")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="a new sweep dir, every run trained again (default: go on in the last unfinished sweep dir of the "
        "same command, and skip the runs the study's runs.csv holds with the same settings)",
    )
    args, extra = parser.parse_known_args(argv)
    if (refusal := unknown_study(args.study, "--study")) is not None:
        print(refusal, file=sys.stderr)
        return 2
    if args.wandb_spec:
        print(wandb_sweep_yaml(args.study), end="")
        return 0
    if args.seeds is None:
        args.seeds = declared_seeds(args.study)
    if args.seeds < 1 or args.jobs < 1:
        print(f"attnlab: error: --seeds {args.seeds} --jobs {args.jobs}: expected positive integers", file=sys.stderr)
        return 2
    if args.partition and args.launcher != "slurm":
        print(
            f"attnlab: error: --partition {args.partition} needs --launcher slurm (LAUNCHER=slurm); "
            f"--launcher is {args.launcher}",
            file=sys.stderr,
        )
        return 2
    if args.launcher == "slurm" and shutil.which("sbatch") is None:
        print(
            "attnlab: error: --launcher slurm: sbatch is not on PATH; expected a SLURM login node (or a test "
            "cluster: tests/slurm_cluster.py start), or --launcher local",
            file=sys.stderr,
        )
        return 2
    if (
        args.launcher == "local"
        and args.jobs > 1
        and any(x.split("=", 1)[0] in ("trainer", "trainer.strategy") and "ddp" in x for x in extra)
    ):
        print(
            f"attnlab: error: --jobs {args.jobs} with DDP: each DDP job starts its own processes, which Hydra's "
            "parallel launcher cannot host; use JOBS=1 (jobs one after another, each on all its devices)",
            file=sys.stderr,
        )
        return 2

    spec = resume.sweep_spec(args.study, args.seeds, extra, args.launcher)
    earlier_dir = None if args.fresh else resume.unfinished_sweep(Path(args.logs), spec)
    sweep_dir = earlier_dir or Path(args.logs) / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{args.study}"
    table, finished = resume.committed_runs(args.study) if not args.fresh else (None, [])
    cmd = sweep_command(args.study, args.seeds, args.jobs, sweep_dir, extra, args.launcher, args.partition)
    progress = SweepProgress(sweep_dir, sweep_axes(args.study, args.seeds, extra))
    at_once = "as SLURM jobs" if args.launcher == "slurm" else f"{args.jobs} at a time"
    print("attnlab: " + " ".join(cmd[1:]), flush=True)
    if earlier_dir is not None:
        print(
            f"attnlab: going on in {sweep_dir} (the same command, cut short): {progress.absorb()} of its runs "
            "finished there and are skipped; --fresh starts again",
            flush=True,
        )
    if finished:
        print(f"attnlab: {table} holds {len(finished)} finished runs; those of these cells are skipped", flush=True)
    print(
        f"attnlab: {progress.total} cells, {at_once}, into {sweep_dir}; each run prints into its "
        f"<job>/{RUN_LOG}, Hydra into multirun.log",
        flush=True,
    )
    started = time.perf_counter()
    resume.start(sweep_dir, spec, finished)
    env = dict(os.environ) | {RUN_LOG_ENV: "1", FINISHED_ENV: str((sweep_dir / resume.FINISHED).resolve())}
    if (
        args.launcher == "local" and args.jobs > 1
    ):  # share the cores: torch would otherwise start one thread per core in every job
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    multirun_log = sweep_dir / "multirun.log"
    stop_following = follow(progress)
    try:
        with open(multirun_log, "a") as log:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        stop_following()
    missing = max(progress.total - progress.finished, 0)
    trained = progress.finished - progress.failed - progress.skipped - len(progress.earlier)
    print(
        f"attnlab: sweep took {time.perf_counter() - started:.0f} s: {trained} trained ok, {progress.failed} "
        f"failed, {progress.skipped + len(progress.earlier)} skipped as finished before ({len(progress.earlier)} "
        f"in this sweep dir, {progress.skipped} in {table or 'runs.csv'}), {missing} without results.json, "
        f"of {progress.total}",
        flush=True,
    )
    if not missing and not progress.failed and not proc.returncode:
        resume.mark_complete(sweep_dir)
    if proc.returncode:
        tail = multirun_log.read_text(errors="replace").splitlines()[-20:]
        print(
            "\n".join([f"attnlab: the multirun exited {proc.returncode}; the end of {multirun_log}:", *tail]),
            file=sys.stderr,
        )
    if not progress.cells:
        if not any(sweep_dir.glob("*/.hydra")) and earlier_dir is None:  # Hydra refused before it launched a job
            shutil.rmtree(sweep_dir)
        return proc.returncode or 1
    if progress.skipped == progress.finished:  # every run was in runs.csv already: its report stands
        return 1 if proc.returncode or missing else 0
    report = subprocess.run([sys.executable, "-m", "attnlab.studies.report", str(sweep_dir)])
    return 1 if proc.returncode or progress.failed or missing or report.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
