"""Read the results.json files of a sweep and reduce them to one row per cell (mean +- std over seeds)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, fields
from pathlib import Path

from attnlab.attention import AttentionConfig
from attnlab.training.results import overrides_dict
from attnlab.writing.pages import where

# config keys that were renamed: runs recorded under the old name aggregate under the new one
RENAMED_KEYS = {
    f"model.attention.{f.name}": f"model.attention.{f.metadata['renamed_to']}"
    for f in fields(AttentionConfig)
    if "renamed_to" in f.metadata
}
# Overrides that are not axes: the seed (replicates of a cell), and settings that change what a run
# records, not what it trains (loggers, the progress bar, checkpoints, the attention-map callback,
# which only reads the model in eval mode, and the q/k gradient norms, read after backward). A study
# run in parts may differ in these.
IGNORED_AXES = {
    "seed",
    "logger",
    "trainer.enable_progress_bar",
    "callbacks.checkpoint",
    "callbacks.attention_maps",
    "callbacks.qk_grad_norms",
}


@dataclass
class RunResult:
    """One job of a sweep as its results.json tells it (status, overrides, metrics)."""

    dir: Path
    results: dict

    @property
    def ok(self) -> bool:
        return self.results.get("status") == "ok"

    @property
    def overrides(self) -> dict[str, str]:
        return {RENAMED_KEYS.get(k, k): v for k, v in overrides_dict(self.results.get("overrides", [])).items()}

    @property
    def seed(self):
        """The seed the run trained with (an int where it reads as one): what tells a cell's replicates apart."""
        seed = self.results.get("config", {}).get("seed", self.overrides.get("seed"))
        return int(seed) if str(seed).lstrip("-").isdigit() else seed

    def metric(self, key: str) -> float | None:
        value = self.results.get("metrics", {}).get(key)
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None


@dataclass
class Cell:
    axes: dict[str, str]
    runs: list[RunResult] = field(default_factory=list)

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.runs if not r.ok]

    def values(self, key: str) -> list[float]:
        return [v for r in self.ok_runs if (v := r.metric(key)) is not None]

    def mean(self, key: str) -> float | None:
        vals = self.values(key)
        return statistics.fmean(vals) if vals else None

    def std(self, key: str) -> float | None:
        vals = self.values(key)
        return statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None)

    @property
    def label(self) -> str:
        return where(self.axes)


def load_runs(sweep_dir: Path) -> list[RunResult]:
    runs = []
    for path in sorted(Path(sweep_dir).glob("**/results.json")):
        try:
            results = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a results.json being written right now; atomic writes make this rare
        if results.get("status") != "skipped":  # finished before: its row is in the study's runs.csv
            runs.append(RunResult(path.parent, results))
    return runs


def run_identity(run: RunResult) -> tuple:
    """What makes a run unique in a study: its overrides without the seed, and the seed it ran with."""
    rest = tuple(sorted((k, v) for k, v in run.overrides.items() if k not in IGNORED_AXES))
    return rest, run.seed


def recording_differences(runs: list[RunResult]) -> list[str]:
    """The ignored recording-only overrides (IGNORED_AXES but the seed) whose values differ between
    runs, as 'key (value, value)' for the report's header."""
    values: dict[str, set] = {}
    for run in runs:
        for k in IGNORED_AXES - {"seed"}:
            values.setdefault(k, set()).add(run.overrides.get(k, "(default)"))
    return [f"{k} ({', '.join(sorted(v))})" for k, v in sorted(values.items()) if len(v) > 1]


def load_sweeps(sweep_dirs: list[Path]) -> list[RunResult]:
    """The runs of several sweep dirs (a study run in parts, e.g. one dir per seed) as one list.
    The same cell and seed twice would count one run as two seeds: that is refused."""
    runs, seen = [], {}
    for sweep_dir in dict.fromkeys(Path(d).resolve() for d in sweep_dirs):
        for run in load_runs(sweep_dir):
            key = run_identity(run)
            if key in seen:
                raise SystemExit(
                    f"attnlab: error: DIR holds the same cell and seed twice: {seen[key]} and {run.dir}; "
                    "pass sweep dirs whose seeds or cells do not overlap"
                )
            seen[key] = run.dir
            runs.append(run)
    return runs


def swept_axes(runs: list[RunResult]) -> list[str]:
    """Override keys whose values differ between runs (seeds excluded), in first-seen order."""
    keys: dict[str, set] = {}
    for run in runs:
        for k, v in run.overrides.items():
            keys.setdefault(k, set()).add(v)
    missing = {k for k in keys if any(k not in r.overrides for r in runs)}
    return [k for k, vals in keys.items() if k not in IGNORED_AXES and (len(vals) > 1 or k in missing)]


def sort_key(value: str):
    """A level as it sorts: numbers by value, before words."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def group_cells(runs: list[RunResult], axes: list[str]) -> list[Cell]:
    cells: dict[tuple, Cell] = {}
    for run in runs:
        key = tuple(run.overrides.get(a, "-") for a in axes)
        cells.setdefault(key, Cell(dict(zip(axes, key)))).runs.append(run)
    return [cells[k] for k in sorted(cells, key=lambda key: [sort_key(v) for v in key])]
