"""``attnlab repro --mode fast|full [--out DIR] [--render | --check]``: reproduce and check the source claims.

Full mode writes reports/repro/ (the committed report); fast mode writes reports/repro/fast/ and
leaves the committed report as it is. ``--render`` rebuilds a report's pages from its repro.json;
``--check`` exits 1, naming them, when report files its claims read have changed since it was written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.repro.record import render_dir, stale_inputs
from attnlab.repro.runner import MODES, OUT, main
from attnlab.repro.wandb_run import log_repro_summary
from attnlab.util.cli import command_parser


def cli(argv: list[str] | None = None) -> int:
    parser = command_parser("repro", __doc__)
    parser.add_argument(
        "--mode", choices=sorted(MODES), default="full", help="fast: no training, under a minute; full: every claim"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: reports/repro for full, reports/repro/fast for fast)",
    )
    parser.add_argument(
        "--reports", type=Path, default=Path("reports"), help="where the studies the claims cite live (default reports)"
    )
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: re-render the pages of --out from its repro.json"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="measure nothing: exit 1 when a report the claims of --out read has changed since (re-run to re-judge)",
    )
    parser.add_argument(
        "--wandb",
        choices=("offline", "online"),
        default=None,
        help="also log the verdicts as a W&B run (group repro) under logs/repro/; default: no W&B",
    )
    args = parser.parse_args(argv)
    out = OUT[args.mode] if args.out is None else args.out
    if args.render:
        if not (out / "repro.json").is_file():
            parser.error(f"--render: no repro.json in {out} (--out names a report directory)")
        print(f"attnlab: rendered {', '.join(map(str, render_dir(out)))} from {out / 'repro.json'}")
        return 0
    if args.check:
        if not (out / "repro.json").is_file():
            parser.error(f"--check: no repro.json in {out} (--out names a report directory)")
        stale = stale_inputs(out, args.reports.parent)
        for path in stale:
            print(f"attnlab: {out / 'repro.json'} is older than {path}", file=sys.stderr)
        if stale:
            print(f"attnlab: re-judge with attnlab repro --mode {args.mode}", file=sys.stderr)
            return 1
        print(f"attnlab: {out / 'repro.json'} was judged on the reports as they are")
        return 0
    print(
        f"attnlab: repro --mode {args.mode} writes {out}/" + (" (the committed report)" if out == OUT["full"] else "")
    )
    main(args.mode, out, log=lambda msg: print(msg, flush=True), reports=args.reports)
    if args.wandb:
        logs = Path("logs") / "repro"
        logs.mkdir(parents=True, exist_ok=True)
        claims = json.loads((out / "repro.json").read_text())["claims"]
        run_dir = log_repro_summary(claims, logs, mode=args.wandb)
        if run_dir:
            print(f"attnlab: W&B run repro (group repro) with every verdict and its checks: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
