"""What made a report's rows: a cell pools one experiment only, and the page says what trained its rows
and what ``attnlab verify`` found when it trained them again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

VERIFY = "verify.json"  # attnlab verify's record beside runs.csv


def cell_label(row, axes: list[str]) -> str:
    return ", ".join(f"{a}={row[a]}" for a in axes) or "one cell"


def one_experiment(frame: pd.DataFrame, axes: list[str], where: str) -> tuple[pd.DataFrame, list[str]]:
    """The rows each cell may pool: a cell of two training fingerprints is refused (SystemExit, one line
    naming its rows); rows without a fingerprint beside rows that have one are left out, and named."""
    if "config" not in frame or frame.empty:
        return frame, []
    prints = frame["config"].fillna("").astype(str)
    keep = pd.Series(True, index=frame.index)
    notes = []
    for _, rows in frame.groupby([*axes, "budget"], sort=False, dropna=False):
        made = prints[rows.index]
        known = sorted(set(made) - {""})
        label = cell_label(rows.iloc[0], axes)
        if len(known) > 1:
            parts = "; ".join(f"{fp}: seeds {', '.join(map(str, sorted(rows['seed'][made == fp])))}" for fp in known)
            raise SystemExit(
                f"attnlab: error: {where}: {label} holds rows of {len(known)} training fingerprints ({parts}); "
                "expected one a cell: train the cell again with today's settings (attnlab sweep) or move the others out"
            )
        unproven = rows.index[made == ""]
        if known and len(unproven):
            keep[unproven] = False
            notes.append(f"{label}: seeds {', '.join(map(str, sorted(rows['seed'][unproven])))}")
    return frame[keep], notes


def made_by(frame: pd.DataFrame | None) -> str:
    """One line: how many rows record what made them, and what that was."""
    if frame is None:
        return "Per-seed rows were not kept: nothing records what trained them."
    if "config" not in frame:
        return f"None of the {len(frame)} rows records what trained it (no training fingerprint, code or machine)."
    known = frame[frame["config"].fillna("").astype(str) != ""]
    line = f"{len(known)} of {len(frame)} rows carry a training fingerprint"
    if "commit" in known:
        known = known[known["commit"].fillna("").astype(str) != ""]
        line += f", {len(known)} the code and machine that made them"
    else:
        known = known.iloc[0:0]
    parts = []
    for column, name in (("commit", "commit"), ("torch", "torch"), ("device", "device"), ("threads", "threads")):
        values = sorted(set(known[column].fillna("").astype(str)) - {""}) if column in known else []
        if values:
            shown = [v[:7] if column == "commit" else v for v in values]
            parts.append(f"{name} {', '.join(shown)}")
    if "dirty" in known and (known["dirty"].astype(str) == "True").any():
        parts.append(f"{int((known['dirty'].astype(str) == 'True').sum())} from uncommitted code")
    return line + (f" ({'; '.join(parts)})" if parts else "") + "."


def verification(out: Path) -> str:
    """One line from verify.json: how many cells a re-training reproduced, at which commit."""
    path = out / VERIFY
    if not path.is_file():
        return "Not verified: no `attnlab verify` has trained its rows again."
    record = json.loads(path.read_text())
    cells = record["cells"]
    count = {v: sum(c["verdict"] == v for c in cells) for v in ("identical", "differs", "not checkable")}
    commit = (record.get("commit") or "unknown")[:7] + ("-dirty" if record.get("dirty") else "")
    threads = record.get("threads")
    threads = ", ".join(map(str, threads)) if isinstance(threads, list) else threads
    return (
        f"`attnlab verify` at commit {commit} trained one seed of each of {len(cells)} cells again "
        f"({threads} thread(s), {record.get('device')}): {count['identical']} identical bit for bit, "
        f"{count['differs']} differ, {count['not checkable']} not checkable ([{VERIFY}]({VERIFY}))."
    )
