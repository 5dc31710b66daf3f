"""Results of runs -> Markdown/CSV/HTML tables and PNG plots under reports/<study>/."""

from __future__ import annotations

from pathlib import Path

from ...analysis.phase import phase_change_step
from .aggregate import (
    group_cells,
    load_sweeps,
    n_layers,
    recording_differences,
    seeds_per_cell,
    short,
    swept_axes,
)
from .layout import (
    HEAD_TYPES_NOTE,
    attention_free_level,
    head_type_seeds,
    head_type_text,
    phase_text,
    study_from_runs,
    text_corpus,
    token_corpus_level,
    write,
)
from .lr import LR_AXIS, arms
from .lr import plot as lr_plot
from .plots import (
    extreme_tokens_over_training,
    heads_over_training,
    layer_stat_vs_axis,
    max_logit_over_training,
    metric_vs_axis,
)
from .tables import csv_keys, csv_text
from .tables import read_raw as read_csv_text
from .wandb_summary import log_summary_run

__all__ = ["HEAD_TYPES_NOTE", "build_report", "head_type_seeds", "head_type_text", "latest_sweep", "phase_text"]


def latest_sweep(root: Path = Path("logs")) -> Path | None:
    """The most recent multirun dir under ``root`` (by modification time)."""
    dirs = [p for p in root.glob("*/multiruns/*") if p.is_dir()]
    return max(dirs, key=lambda p: p.stat().st_mtime) if dirs else None


def study_name(sweep_dir: Path, runs) -> str:
    for run in runs:
        study = run.results.get("config", {}).get("study")
        if study:
            return study
    return sweep_dir.name


def build_report(sweep_dirs: Path | list[Path], reports: Path = Path("reports")) -> dict:
    """Write ablation.md/.csv, plots, index.html and summary.json for a study run as one or several sweep dirs
    (merged: e.g. one dir per seed); return the summary."""
    sweep_dirs = [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]
    runs = load_sweeps(sweep_dirs)
    if not runs:
        raise SystemExit(
            f"attnlab: error: DIR={' '.join(map(str, sweep_dirs))!r} holds no results.json; expected sweep dirs under logs/"
        )
    axes = swept_axes(runs)
    cells = group_cells(runs, axes)
    layers = n_layers(runs)
    name = study_name(sweep_dirs[0], runs)
    out = reports / name
    out.mkdir(parents=True, exist_ok=True)
    keys = csv_keys(cells, layers)
    study = study_from_runs(name, cells, axes, keys, layers)
    study.sources = [str(d) for d in sweep_dirs]
    study.runs, study.failed = len(runs), sum(len(c.failed) for c in cells)
    study.recording = recording_differences(runs)
    study.failures = [f"- {r.dir.name}: {r.results.get('error')}" for c in cells for r in c.failed]
    data_cfg = next(
        (r.results.get("config", {}).get("data") for r in runs if r.results.get("config", {}).get("data")), None
    )
    study.baseline = attention_free_level() if text_corpus(data_cfg) else token_corpus_level(data_cfg)

    if LR_AXIS in axes:
        study.lr_arms = arms(cells, axes, (study.baseline or {}).get("unigram"))
    histories = {cell.label: cell.head_histories() for cell in cells}
    plots = final_value_plots(study, out)
    if study.lr_arms:
        plots.append(lr_plot(study.lr_arms, out / "lr_sensitivity.png"))
    plots.append(max_logit_over_training(cells, out / "max_logit_over_training.png"))
    plots.append(extreme_tokens_over_training(cells, out / "sink_formation.png"))
    plots.append(heads_over_training(histories, out / "heads_over_training.png"))
    study.plots = [p for p in plots if p is not None]
    types = {cell.label: cell.head_types(layers) for cell in cells}
    phases = {label: [phase_change_step(h) for h in runs] for label, runs in histories.items()}
    study.head_types = [{"axes": c.axes, "layers": types[c.label]} for c in cells]
    study.phases = [{"axes": c.axes, "steps": phases[c.label]} for c in cells if phases[c.label]]

    header, body = read_csv_text(csv_text(cells, axes, layers))
    summary = {
        "study": name,
        "sweep_dirs": [str(d) for d in sweep_dirs],
        "runs": len(runs),
        "cells": len(cells),
        "failed": study.failed,
        "seeds_per_cell": seeds_per_cell(cells),
        "out": str(out),
        "per_seed": [{"axes": c.axes, "runs": [per_seed_values(r, keys) for r in c.ok_runs]} for c in cells],
        "head_types": study.head_types,
        "phase_change_steps": study.phases,
    }
    summary = write(study, out, header, body, summary)
    log_summary_run(name, out, study.plots, runs, sweep_dirs[0])
    print(f"attnlab: {len(cells)} cells ({study.failed} failed runs) -> {out}/ablation.md, index.html")
    return summary


def final_value_plots(study, out: Path) -> list[Path]:
    """The plots of final values against a numeric axis (with the attention-free level where there is one):
    drawn from the table alone, so a committed report redraws them too."""
    level = study.baseline["bigram"] if study.baseline else None
    plots = []
    if "model.d_k" in study.axes:
        plots.append(
            metric_vs_axis(
                study.cells,
                "model.d_k",
                "val/loss",
                out / "val_loss_vs_dk.png",
                ylabel="final val loss",
                baseline=level,
            )
        )
        plots.append(
            layer_stat_vs_axis(study.cells, "model.d_k", "entropy_norm", study.layers, out / "entropy_norm_vs_dk.png")
        )
    for axis in study.axes:
        if axis not in ("model.d_k", "optim.lr"):
            plots.append(
                metric_vs_axis(study.cells, axis, "val/loss", out / f"val_loss_vs_{short(axis)}.png", baseline=level)
            )
    return [p for p in plots if p is not None]


def per_seed_values(run, keys: list[str]) -> dict:
    """One finished run's seed id, run dir and final metrics (the table's keys): what per-seed ranges are quoted from."""
    return {
        "seed": run.seed,
        "dir": run.dir.name,
        "metrics": {k: v for k in keys if (v := run.metric(k)) is not None},
    }
