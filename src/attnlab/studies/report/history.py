"""A study's values over training, kept beside runs.csv as histories.csv so its figures over training are
renders of committed data like its other pages: one row per run (its cell and seed), source and step.

``source`` is ``stats`` (the attention statistics the run logged, ``callbacks.attention_stats``) or
``heads`` (the head analysis, heads.json); only the columns the figures draw are kept.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from attnlab.analysis.phase import head_history
from attnlab.callbacks.attention_stats import read_history
from attnlab.studies.report.aggregate import RunResult
from attnlab.writing.pages import where

HISTORIES = "histories.csv"
# the figures' columns: max logit per layer and layer 0's first-token statistics; the head analysis' copying
# accuracy, best induction score and whole-layer knockout per layer
KEPT = {
    "stats": re.compile(r"attn/L\d+/max_logit|attn/L0/(sink_mass_dormant|value_drain|residual_peak)"),
    "heads": re.compile(r"repeat_acc|L\d+/(induction_max|induction_knockout_all_heads)"),
}


def of_runs(runs: list[RunResult], axes: list[str], rows: pd.DataFrame) -> pd.DataFrame:
    """The histories of the ok ``runs`` whose cell and seed ``rows`` (runs.csv rows) hold, keyed by both."""
    wanted = {(*(str(r[a]) for a in axes), seed_text(r["seed"])) for _, r in rows.iterrows()}
    out = []
    for run in runs:
        key = {a: str(run.overrides.get(a, "-")) for a in axes} | {"seed": run.seed}  # as runs.csv keys a run
        if not run.ok or (*list(key.values())[:-1], seed_text(run.seed)) not in wanted:
            continue
        for source, points in (("stats", read_history(run.dir)), ("heads", head_history(run.dir))):
            for p in points:
                kept = {k: v for k, v in p.items() if KEPT[source].fullmatch(k) and v is not None}
                out.append({**key, "source": source, "step": int(p["step"]), **kept})
    return pd.DataFrame(out)


def read(out: Path) -> pd.DataFrame | None:
    path = out / HISTORIES
    if not path.is_file():
        return None
    header = pd.read_csv(path, nrows=0).columns
    axes = list(header[: list(header).index("seed")])
    return pd.read_csv(path, dtype={a: str for a in axes} | {"source": str}, keep_default_na=False, na_values=[""])


def merged(committed: pd.DataFrame | None, new: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """The committed histories, those of a cell and seed the new runs hold replaced by theirs."""
    if committed is None or committed.empty:
        return new
    if new.empty:
        return committed
    key = [*axes, "seed"]

    def ident(f: pd.DataFrame) -> pd.Series:
        return pd.Series([(*(str(r[a]) for a in axes), seed_text(r["seed"])) for _, r in f.iterrows()], index=f.index)

    kept = committed[~ident(committed).isin(set(ident(new)))]
    return pd.concat([kept, new], ignore_index=True)[
        [*key, "source", "step", *sorted(set(kept) | set(new) - {*key, "source", "step"})]
    ]


def by_cell(
    histories: pd.DataFrame, frame: pd.DataFrame, axes: list[str], source: str
) -> list[tuple[str, dict, list[list[dict]]]]:
    """Per cell of ``frame`` (its ok rows, in its order): its label, axes and each seed's points of ``source``."""
    points = histories[histories["source"] == source]
    groups = []
    ok = frame[frame["status"] == "ok"]
    for key, rows in ok.groupby(axes, sort=False, dropna=False) if axes else [((), ok)]:
        cell = dict(zip(axes, map(str, key if isinstance(key, tuple) else (key,))))
        seeds = []
        for seed in rows["seed"]:
            mine = points[(points["seed"].map(seed_text) == seed_text(seed)) & _matches(points, cell)].sort_values(
                "step"
            )
            if len(mine):
                seeds.append(
                    [
                        {k: v for k, v in p.items() if pd.notna(v)}
                        for p in mine.drop(columns=[*axes, "seed", "source"]).to_dict("records")
                    ]
                )
        if seeds:
            groups.append((where(cell), cell, seeds))
    return groups


def seed_text(seed) -> str:
    """A seed as both tables key it: its integer, or "" where a run records none."""
    return "" if seed is None or pd.isna(seed) else str(int(seed))


def _matches(points: pd.DataFrame, cell: dict) -> pd.Series:
    match = pd.Series(True, index=points.index)
    for a, v in cell.items():
        match &= points[a].astype(str) == v
    return match
