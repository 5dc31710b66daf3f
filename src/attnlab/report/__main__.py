"""``python -m attnlab.report [SWEEP_DIR]``: aggregate a sweep (default: the latest under logs/)."""
import sys
from pathlib import Path

from . import build_report, latest_sweep


def main(argv: list[str]) -> int:
    target = Path(argv[0]) if argv else latest_sweep()
    if target is None:
        print("attnlab: error: DIR is not set and logs/ holds no sweep; run `make sweep` first", file=sys.stderr)
        return 2
    if not target.is_dir():
        print(f"attnlab: error: DIR={str(target)!r} is not a directory; expected a sweep dir under logs/", file=sys.stderr)
        return 2
    build_report(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
