"""``python -m attnlab.studies.report [SWEEP_DIR ...]``: aggregate a sweep (default: the latest under logs/);
several dirs (a study run in parts, e.g. one per seed) are merged into one report.

``python -m attnlab.studies.report --compare LABEL=RUN_DIR ...``: per-layer entropy_norm, max logit and sink
mass over training of a few runs side by side, into reports/compare/stats_over_training.png.

``python -m attnlab.studies.report --restat REPORT_DIR ...``: re-lay a committed report (tables, intervals, tests,
headline, plots of final values) from its ablation.csv and summary.json, without its runs (attnlab.studies.report.restat).
"""

import sys
from pathlib import Path

from ...cli import command_parser
from . import build_report, latest_sweep
from .plots import stats_over_training


def compare(pairs: list[str], out: Path = Path("reports/compare")) -> int:
    runs = dict(p.split("=", 1) for p in pairs if "=" in p)
    if len(runs) != len(pairs) or not runs:
        print("attnlab: error: --compare takes LABEL=RUN_DIR pairs, e.g. naive=logs/train/runs/<run>", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    path = stats_over_training(
        {k: Path(v) for k, v in runs.items()},
        ("entropy_norm", "max_logit", "sink_mass"),
        out / "stats_over_training.png",
    )
    print(f"attnlab: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("table", "Aggregate a sweep dir into reports/<study>/, or compare runs over training.")
    parser.add_argument(
        "sweep_dirs",
        nargs="*",
        metavar="SWEEP_DIR",
        help="sweep dirs under logs/, merged into one report (default: the latest)",
    )
    parser.add_argument(
        "--reports", type=Path, default=Path("reports"), help="write into REPORTS/<study>/ (default reports)"
    )
    parser.add_argument(
        "--compare", nargs="+", metavar="LABEL=RUN_DIR", help="plot these runs' statistics side by side"
    )
    parser.add_argument(
        "--restat",
        nargs="+",
        type=Path,
        metavar="REPORT_DIR",
        help="re-lay these committed reports from their ablation.csv and summary.json",
    )
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args.compare)
    if args.restat:
        from .restat import restat

        for report in args.restat:
            if not (report / "ablation.csv").is_file():
                print(
                    f"attnlab: error: {report}/ablation.csv not found; expected a report dir written by make table",
                    file=sys.stderr,
                )
                return 2
            restat(report)
            print(f"attnlab: re-laid {report}/ablation.md, index.html, ablation.csv and summary.json from its files")
        return 0
    targets = [Path(d) for d in args.sweep_dirs] or [latest_sweep()]
    if targets == [None]:
        print("attnlab: error: DIR is not set and logs/ holds no sweep; run `make sweep` first", file=sys.stderr)
        return 2
    for target in targets:
        if not target.is_dir():
            print(
                f"attnlab: error: DIR={str(target)!r} is not a directory; expected sweep dirs under logs/",
                file=sys.stderr,
            )
            return 2
    build_report(targets, args.reports)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
