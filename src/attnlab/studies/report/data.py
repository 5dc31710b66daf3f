"""A study's runs as one table, runs.csv: one row per run and seed, the only input of its report.

Columns: the swept axes (the config keys that differ between runs, as the override spelled them),
then ``seed``, ``budget`` (``default``, or the extra overrides a sweep ran with, e.g. ``debug=smoke``),
``status``, ``error``, what made the run (``config``: a hash of what it trained, ``training_fingerprint``;
``version``, ``commit`` and ``dirty``: attnlab's code; ``torch``, ``device``, ``threads``: what it ran on,
``results.PROVENANCE``), ``run`` (the run dir's name), then every final metric the run logged (per-layer
ones included), each run's head types per layer (``head_type/L{i}/{type}``: heads of that type) and the
step of its phase change (``phase/step``, where ``phase/measured`` is 1). A notebook opens it with
``pandas.read_csv``; ``read_runs`` keeps the axes as text (``0.02`` and ``fan_in`` in one column).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from attnlab.analysis.heads import types_by_layer
from attnlab.analysis.phase import head_history, phase_change_step
from attnlab.config.compose import compose_config
from attnlab.studies.report.aggregate import IGNORED_AXES, RENAMED_KEYS, RunResult, swept_axes
from attnlab.studies.report.lr import SIZE_AXES
from attnlab.training.results import PROVENANCE, TRAINING, training_fingerprint
from attnlab.training.settle import settle

META = ["seed", "budget", "status", "error", *PROVENANCE, "run"]
DEFAULT_BUDGET = "default"
# per-step values and bookkeeping that results.json keeps beside the final metrics
SKIPPED = ("train/", "step", "epoch", "lr-")


def axes_of(frame: pd.DataFrame) -> list[str]:
    """The axis columns: those before ``seed``."""
    return list(frame.columns[: list(frame.columns).index("seed")])


def read_runs(path: Path) -> pd.DataFrame:
    header = pd.read_csv(path, nrows=0).columns
    axes = list(header[: list(header).index("seed")])
    text = {c: str for c in [*axes, *META] if c != "seed"}
    frame = pd.read_csv(path, dtype=text, keep_default_na=False, na_values={c: [""] for c in header if c not in text})
    frame["seed"] = pd.to_numeric(frame["seed"], errors="coerce").astype("Int64")
    return frame


def write_runs(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)


def _head_columns(layers: list[dict[str, list[int]]], j: int) -> dict[str, int]:
    return {f"head_type/L{i}/{kind}": counts[j] for i, layer in enumerate(layers) for kind, counts in layer.items()}


def budget_of(run: RunResult, axes: list[str]) -> str:
    """The overrides a run shares with its sweep but not with the study's own runs: what it was trained for."""
    extra = sorted(
        f"{k}={v}" for k, v in run.overrides.items() if k not in axes and k not in IGNORED_AXES and k != "experiment"
    )
    return ",".join(extra) or DEFAULT_BUDGET


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def provenance_of(results: dict) -> dict[str, str]:
    """A run's provenance columns as text ("" where unknown); a results.json written before the block keeps
    its fingerprint and its git sha (``-dirty`` then meant any tracked file)."""
    made = dict(results.get("provenance") or {})
    if not made:
        sha = results.get("git_sha") or ""
        made = {"commit": sha.removesuffix("-dirty"), "dirty": sha.endswith("-dirty") if sha else None}
        if (threads := (results.get("metrics") or {}).get("machine/threads")) is not None:
            made["threads"] = int(threads)
    if results.get("config"):
        made["config"] = training_fingerprint(results["config"])
    return {k: "" if made.get(k) is None else str(made[k]) for k in PROVENANCE}


def frame_from_runs(runs: list[RunResult], declared_axes: list[str] = ()) -> pd.DataFrame:
    """runs.csv's rows from the runs' results.json (and heads.json for the head types over training)."""
    axes = swept_axes(runs)
    axes += [a for a in declared_axes if a not in axes and any(a in r.overrides for r in runs)]
    rows = []
    for run in runs:
        row = {a: run.overrides.get(a, "-") for a in axes}
        row.update(
            seed=run.seed,
            budget=budget_of(run, axes),
            status=run.results.get("status") or "unknown",
            error=run.results.get("error") or "",
            **provenance_of(run.results),
            run=run.dir.name,
        )
        if run.ok:
            metrics = run.results.get("metrics", {})
            row.update({k: v for k, v in metrics.items() if not k.startswith(SKIPPED) and _number(v) is not None})
            row.pop("machine/threads", None)  # a provenance column now
            if _number(run.results.get("wall_s")) is not None:  # what the plan times a run by
                row["wall_s"] = run.results["wall_s"]
            layers = run.results.get("config", {}).get("model", {}).get("n_layer", 0)
            if run.results.get("heads"):
                row.update(_head_columns(types_by_layer([run.results["heads"]], layers), 0))
            if len(history := head_history(run.dir)) > 1:
                step = phase_change_step(history)
                row.update({"phase/measured": 1, "phase/step": step})
        rows.append(row)
    return pd.DataFrame(rows)


def frame_from_committed(report: Path) -> pd.DataFrame | None:
    """runs.csv's rows from a report written before runs.csv: summary.json's per-seed values, or
    ablation.csv's cells where each holds one seed (its mean is that run's value). None when the
    report keeps only each cell's mean and std over several seeds."""
    summary = json.loads((report / "summary.json").read_text())
    cells = summary.get("per_seed") or []
    rename = lambda axes: {RENAMED_KEYS.get(k, k): v for k, v in axes.items()}  # noqa: E731
    types = {json.dumps(rename(c["axes"])): c["layers"] for c in summary.get("head_types", [])}
    phases = {json.dumps(rename(c["axes"])): c["steps"] for c in summary.get("phase_change_steps", [])}
    rows = []
    if cells and all(c.get("runs") for c in cells):
        for cell in cells:
            axes, runs = rename(cell["axes"]), cell["runs"]
            layers, steps = types.get(json.dumps(axes), []), phases.get(json.dumps(axes), [])
            for j, run in enumerate(runs):
                row = {**axes, "seed": run["seed"], "budget": DEFAULT_BUDGET, "status": "ok", "error": ""}
                row.update(run=str(run.get("dir", "")), **run["metrics"])
                if layers and all(len(v) == len(runs) for layer in layers for v in layer.values()):
                    row.update(_head_columns(layers, j))
                if len(steps) == len(runs):
                    row.update({"phase/measured": 1, "phase/step": steps[j]})
                rows.append(row)
        return with_lr_columns(pd.DataFrame(rows), summary.get("lr_sensitivity"))
    table = pd.read_csv(report / "ablation.csv", dtype=str, keep_default_na=False)
    if table.empty or (table["n_ok"].astype(float) != 1).any() or (table["n_failed"].astype(float) != 0).any():
        return None
    axes = [RENAMED_KEYS.get(a, a) for a in table.columns[: list(table.columns).index("n_ok")]]
    keys = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    for _, cell in table.iterrows():
        values = dict(zip(axes, cell.iloc[: len(axes)]))
        row = {**values, "seed": summary.get("seed", 1337), "budget": DEFAULT_BUDGET, "status": "ok", "error": ""}
        row.update(run="", **{k: float(cell[f"{k}_mean"]) for k in keys if cell[f"{k}_mean"] != ""})
        layers = types.get(json.dumps(values), [])
        if layers and all(len(v) == 1 for layer in layers for v in layer.values()):
            row.update(_head_columns(layers, 0))
        rows.append(row)
    return pd.DataFrame(rows)


def with_lr_columns(frame: pd.DataFrame, lr_summary: dict | None) -> pd.DataFrame:
    """An LR-sensitivity study's initial loss and size per run, from the arms its summary.json kept."""
    if not lr_summary:
        return frame

    sizes = {a["size"]: a for a in lr_summary["arms"]}
    size_axes = [a for a in SIZE_AXES if a in frame]
    labels = frame[size_axes].apply(lambda r: ", ".join(f"{a}={r[a]}" for a in size_axes), axis=1)
    frame["initial_loss"] = [sizes[s]["initial_loss"] for s in labels]
    frame["params_non_embedding"] = [sizes[s]["params_non_embedding"] for s in labels]
    return frame


def _changed_cells(committed: pd.DataFrame, new: pd.DataFrame, axes: list[str]) -> list[str]:
    """The cells whose committed runs and new runs carry different training fingerprints (rows without one,
    written before the column, match anything)."""
    if "config" not in committed or "config" not in new:
        return []
    cell = lambda f: f[axes].astype(str).apply(lambda r: ", ".join(f"{a}={r[a]}" for a in axes), axis=1)  # noqa: E731
    old = {c: set(v) - {"", "nan"} for c, v in committed["config"].astype(str).groupby(cell(committed))}
    fresh = {c: set(v) - {"", "nan"} for c, v in new["config"].astype(str).groupby(cell(new))}
    return [c for c, v in fresh.items() if old.get(c) and v and not v <= old[c]]


def merge(
    committed: pd.DataFrame | None, new: pd.DataFrame, where: str = "runs.csv"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """committed + the new rows whose cell and seed it does not hold yet; returns (merged, the duplicates left out)."""
    if committed is None or committed.empty:
        return new.reset_index(drop=True), new.iloc[0:0]
    axes = list(dict.fromkeys([*axes_of(committed), *axes_of(new)]))
    both = [
        f.reindex(columns=[*axes, *f.columns.difference(axes, sort=False)]).fillna({a: "-" for a in axes})
        for f in (committed, new)
    ]
    changed = _changed_cells(*both, axes)
    if changed:
        raise SystemExit(
            f"attnlab: error: {where} holds {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''} trained with "
            "other settings than these runs (their config column differs); expected runs of the same settings, "
            "or --replace (REPLACE=1) to start the table from these runs"
        )
    key = [*axes, "seed"]
    seen, arriving = (f[key].astype(str).apply(tuple, axis=1) for f in both)
    proven = [f["config"].fillna("").astype(str) != "" if "config" in f else pd.Series(False, f.index) for f in both]
    # a committed row without a fingerprint gives way to a new run of its cell and seed that has one
    superseded = seen.isin(set(arriving[proven[1]])) & ~proven[0]
    dup = arriving.isin(set(seen[~superseded]))
    for cell in seen[superseded]:
        print(f"attnlab: {where}: {', '.join(map(str, cell))} had no training fingerprint: replaced by the new run")
    merged = pd.concat([both[0][~superseded], both[1][~dup]], ignore_index=True)
    metrics = [c for c in merged.columns if c not in axes and c not in META]
    return merged[[*axes, *(c for c in META if c in merged), *metrics]], both[1][dup]


def cell_overrides(study: str, axes: dict[str, str], budget: str) -> list[str]:
    """The overrides a cell's job ran with: its experiment, its axes, its budget's own overrides."""
    extra = [] if budget == DEFAULT_BUDGET else budget.split(",")
    return [f"experiment={study}", *(f"{a}={v}" for a, v in axes.items() if v != "-"), *extra]


@functools.cache
def today_fingerprint(study: str, cell: tuple[tuple[str, str], ...], budget: str) -> str:
    """The training fingerprint a cell's runs get from today's experiment file (``cell``: its (axis, value)
    pairs), composed once a cell."""
    return training_fingerprint(current_config(cell_overrides(study, dict(cell), budget)))


def current_config(overrides: list[str]) -> dict:
    """The config a job of these overrides records in results.json (renamed keys moved, precision resolved)."""
    cfg = compose_config(overrides)
    settle(cfg)
    # the sections a fingerprint reads; the rest interpolates Hydra's run-time paths
    out = {}
    for key in (*TRAINING, "trainer", "seed"):
        value = cfg.get(key)
        out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return out
