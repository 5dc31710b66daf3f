"""What a sweep started again may skip: the runs its study has already finished.

A sweep writes sweep.json (the study, its seeds and extra overrides) into its dir. Started again with the
same command, ``attnlab sweep`` goes on in the newest such dir that has not completed; every job then
checks, before it builds anything, whether it finished there before or is a row of the study's committed
runs.csv with the same cell, seed and training fingerprint (``results.finished_before``), and a job cut
short goes on from its last checkpoint (``results.resumable``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from attnlab.util.files import atomic_write_text

SPEC = "sweep.json"
FINISHED = "finished.json"
COMPLETE = "complete"  # written when every cell of the sweep has a finished run


def sweep_spec(study: str, seeds: int, extra: list[str], launcher: str) -> dict:
    return {"study": study, "seeds": seeds, "extra": list(extra), "launcher": launcher}


def unfinished_sweep(logs: Path, spec: dict) -> Path | None:
    """The newest sweep dir of the same command that did not complete, or None."""
    for path in sorted(Path(logs).glob(f"*_{spec['study']}/{SPEC}"), reverse=True):
        try:
            same = json.loads(path.read_text()) == spec
        except (OSError, ValueError):
            continue
        if same and not (path.parent / COMPLETE).exists():
            return path.parent
    return None


def committed_runs(study: str, reports: Path = Path("reports")) -> tuple[Path, list[dict]]:
    """The finished rows of reports/<study>/runs.csv, each with its training fingerprint; a row without one
    (written before the column) is trained again, and the report replaces it with that run."""
    path = Path(reports) / study / "runs.csv"
    if not path.is_file():
        return path, []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "seed" not in columns:
            return path, []
        axes = columns[: columns.index("seed")]  # runs.csv's axes come before its seed column
        return path, [
            {
                "axes": {a: row[a] for a in axes},
                "seed": row["seed"],
                "config": row.get("config") or "",
                "where": str(path),
            }
            for row in reader
            if row["status"] == "ok"
        ]


def start(sweep_dir: Path, spec: dict, rows: list[dict]) -> None:
    """Write the sweep's spec and the runs its jobs may skip."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep_dir / SPEC, json.dumps(spec, indent=2))
    atomic_write_text(sweep_dir / FINISHED, json.dumps({"runs": rows}))


def mark_complete(sweep_dir: Path) -> None:
    atomic_write_text(sweep_dir / COMPLETE, "")
