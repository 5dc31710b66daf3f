"""``python -m attnlab.studies.repro --mode fast|full [--out DIR] [--reports DIR]``: reproduce and check the source claims."""

from __future__ import annotations

import sys
from pathlib import Path

from ...cli import command_parser
from .runner import MODES, main


def cli(argv: list[str] | None = None) -> int:
    parser = command_parser("repro", __doc__)
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="full",
        help="fast: no training, under a minute; full: all 15 claims, training runs included",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("reports/repro"), help="output directory (default reports/repro)"
    )
    parser.add_argument(
        "--reports",
        type=Path,
        default=Path("reports"),
        help="where the studies that claims 12 and 13 cite live (reports/induction_heads, reports/sinks)",
    )
    parser.add_argument(
        "--wandb",
        choices=("offline", "online"),
        default=None,
        help="also log the verdicts as a W&B run (group repro) under logs/repro/; default: no W&B",
    )
    args = parser.parse_args(argv)
    claims = main(args.mode, args.out, log=lambda msg: print(msg, flush=True), reports=args.reports)
    if args.wandb:
        from .wandb_summary import log_repro_summary

        logs = Path("logs") / "repro"
        logs.mkdir(parents=True, exist_ok=True)
        run_dir = log_repro_summary([c.to_json() for c in claims], logs, mode=args.wandb)
        if run_dir:
            print(f"attnlab: W&B run repro (group repro) with every verdict and its reason: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
