"""``make sweep``: run a study as a Hydra multirun, then aggregate it into reports/<study>/.

    python -m attnlab.studies.sweep --study dk_scaling --seeds 3 --jobs 2 [extra hydra overrides]
    python -m attnlab.studies.sweep --study dk_scaling --launcher slurm --partition gpu [...]

Equivalent to ``python -m attnlab.train -m experiment=<study> seed=0,1,2`` with a known sweep dir,
followed by ``python -m attnlab.studies.report <sweep dir>``. Failed cells do not stop the others; the
exit code is non-zero if any cell failed. ``--launcher slurm`` submits the cells as SLURM jobs
(``hydra/launcher=slurm``, one array) and builds the same table once they have all ended.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..cli import command_parser
from ..config import CONF_DIR


def studies() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def study_grid(study: str) -> dict[str, list]:
    """The swept axes of ``experiment=<study>`` (its ``hydra.sweeper.params``), values parsed as Hydra does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={study}"], return_hydra_config=True)
    parser = OverridesParser.create()
    grid = {}
    for key, value in (cfg.hydra.sweeper.params or {}).items():
        override = parser.parse_override(f"{key}={value}")
        grid[key] = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    return grid


def wandb_command(study: str) -> list[str]:
    """What a W&B agent runs: the study's experiment file supplies every fixed value, the agent the grid's."""
    return ["attnlab", "train", f"experiment={study}", "logger.wandb.mode=online", "${args_no_hyphens}"]


def wandb_sweep_yaml(study: str) -> str:
    """sweeps/<study>.yaml, a W&B grid sweep generated from conf/experiment/<study>.yaml."""

    def flow(values) -> str:
        return "[" + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values) + "]"

    params = "\n".join(f"  {key}: {{values: {flow(values)}}}" for key, values in study_grid(study).items())
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
    cmd = [sys.executable, "-m", "attnlab.train", "-m", f"experiment={study}", f"hydra.sweep.dir={sweep_dir}"]
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
    parser.add_argument("--study", default="dk_scaling", help="one of: " + ", ".join(studies()))
    parser.add_argument("--seeds", type=int, default=1)
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
    args, extra = parser.parse_known_args(argv)
    if args.study not in studies():
        print(
            f"attnlab: error: --study {args.study!r} is not a study; expected one of {', '.join(studies())}",
            file=sys.stderr,
        )
        return 2
    if args.wandb_spec:
        print(wandb_sweep_yaml(args.study), end="")
        return 0
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
    sweep_dir = Path(args.logs) / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{args.study}"
    cmd = sweep_command(args.study, args.seeds, args.jobs, sweep_dir, extra, args.launcher, args.partition)
    print("attnlab: " + " ".join(cmd[1:]), flush=True)
    started = time.perf_counter()
    env = dict(os.environ)
    if (
        args.launcher == "local" and args.jobs > 1
    ):  # share the cores: torch would otherwise start one thread per core in every job
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    proc = subprocess.run(cmd, env=env)
    print(f"attnlab: sweep took {time.perf_counter() - started:.0f} s", flush=True)
    if not sweep_dir.exists():
        return proc.returncode or 1
    from .report import build_report

    summary = build_report(sweep_dir)
    return 1 if proc.returncode or summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
