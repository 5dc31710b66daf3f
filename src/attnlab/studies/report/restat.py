"""A committed report re-laid and its statistics recomputed from its files alone (ablation.csv, summary.json).

A study's runs (logs/) need not travel with its report, and re-running a study takes hours. Welch's
test and the t interval need only each cell's mean, sample std and seed count, which ablation.csv holds,
so every table of the report can be rebuilt without its runs: a cell without per-seed values is stood in
for by n values with exactly its mean and sample std (the tests see only those); summary.json's per-seed
values, where a report has them, are used as they are. The stand-in values are never written out.

``python -m attnlab.studies.report --restat reports/<study>`` rewrites that report's ablation.md, index.html,
ablation.csv's derived columns (intervals, per-seed values), the plots of final values, and summary.json's
statistics; the plots over training need the runs and are left as committed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

METRIC = "val/loss"
NOTE = (
    "Statistics recomputed by `python -m attnlab.studies.report --restat` from ablation.csv's per-cell mean, sample std and seed "
    "count, and summary.json's per-seed values where it has them (the runs themselves are not in this checkout)."
)


def standins(mean: float, std: float, n: int) -> list[float]:
    """n values whose mean and sample std are exactly ``mean`` and ``std`` (what Welch's test reads)."""
    if n < 2:
        return [mean] * n
    z = [i - (n - 1) / 2 for i in range(n)]
    scale = math.sqrt(sum(x * x for x in z) / (n - 1))
    return [mean + std * x / scale for x in z]


def restat(report: Path) -> dict:
    """Re-lay a committed report from its files and return its recomputed statistics."""
    from . import final_value_plots
    from .layout import read_raw_csv, study_from_committed, write

    report = Path(report)
    study = study_from_committed(report)
    redrawn = final_value_plots(study, report)
    study.plots = redrawn + [p for p in study.plots if p not in redrawn]
    header, body = read_raw_csv(report / "ablation.csv")
    path = report / "summary.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["statistics_note"] = NOTE
    data = write(study, report, header, body, data)
    return {
        "pairs": data["scaled_vs_unscaled"],
        "pooled_effects": data["pooled_effects"],
        "contrasts": data["contrasts"],
        "headline": data["headline"],
    }
