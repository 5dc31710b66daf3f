"""``python -m attnlab.studies.report [SWEEP_DIR ...] [--replace]``: add a sweep's runs (default: the latest
under logs/) to reports/<study>/runs.csv and rebuild the report from it; several dirs (a study run in parts)
go in together. ``--replace`` writes the report from these sweeps alone.

``--render REPORT_DIR ...``: rebuild committed reports from their runs.csv (a report written before runs.csv
gets one from its summary.json's per-seed values first).

``--compare LABEL=RUN_DIR ...``: per-layer entropy_norm, max logit and sink mass over training of a few runs
side by side, into reports/compare/stats_over_training.png.
"""

import json
import sys
from pathlib import Path

from attnlab.studies.report import build_report, latest_sweep, write_report
from attnlab.studies.report.baseline import experiment_baseline
from attnlab.studies.report.data import frame_from_committed, write_runs
from attnlab.studies.report.plots import stats_over_training
from attnlab.util.cli import command_parser


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


def render_committed(report: Path) -> None:
    if not (report / "runs.csv").is_file():
        frame = frame_from_committed(report)
        if frame is not None:
            write_runs(frame, report / "runs.csv")
    meta = json.loads((report / "summary.json").read_text())
    if meta.get("attention_free_level") is None:  # a level this code computes and the report's build did not
        meta["attention_free_level"] = experiment_baseline(meta.get("study") or report.name)
    write_report(report, meta)
    print(f"attnlab: {report}/ablation.md, index.html, summary.json rebuilt from its data")


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("report", "Add a sweep's runs to reports/<study>/ and rebuild the report, or compare runs.")
    parser.add_argument(
        "sweep_dirs", nargs="*", metavar="SWEEP_DIR", help="sweep dirs under logs/ (default: the latest)"
    )
    parser.add_argument(
        "--reports", type=Path, default=Path("reports"), help="write into REPORTS/<study>/ (default reports)"
    )
    parser.add_argument(
        "--replace", action="store_true", help="write the report from these sweeps alone, over its runs.csv"
    )
    parser.add_argument(
        "--render", nargs="+", type=Path, metavar="REPORT_DIR", help="rebuild these reports from their data"
    )
    parser.add_argument(
        "--compare", nargs="+", metavar="LABEL=RUN_DIR", help="plot these runs' statistics side by side"
    )
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args.compare)
    if args.render:
        for report in args.render:
            if not (report / "summary.json").is_file():
                print(
                    f"attnlab: error: {report}/summary.json not found; expected a report dir written by make report",
                    file=sys.stderr,
                )
                return 2
        for report in args.render:
            render_committed(report)
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
    build_report(targets, args.reports, replace=args.replace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
