"""``python -m attnlab.repro --mode fast|full [--out DIR] [--reports DIR]``: reproduce and check the source claims."""
from __future__ import annotations

import sys
from pathlib import Path

from ..cli import command_parser
from .runner import MODES, main


def cli(argv: list[str] | None = None) -> int:
    parser = command_parser("repro", __doc__)
    parser.add_argument("--mode", choices=sorted(MODES), default="full",
                        help="fast: no training, under a minute; full: all 15 claims, training runs included")
    parser.add_argument("--out", type=Path, default=Path("reports/repro"), help="output directory (default reports/repro)")
    parser.add_argument("--reports", type=Path, default=Path("reports"),
                        help="where the studies that claims 12 and 13 cite live (reports/induction_heads, reports/sinks)")
    args = parser.parse_args(argv)
    main(args.mode, args.out, log=lambda msg: print(msg, flush=True), reports=args.reports)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
