"""A study's runs -> reports/<study>/: runs.csv (one row per run and seed), and from it alone ablation.md,
index.html, ablation.csv (per cell), summary.json and the plots of final values (an onset study: onset.png too).

A sweep of a study that already has a report adds its runs to runs.csv: a cell and seed already there is
kept as it was and listed, runs of another budget (extra overrides such as ``debug=smoke``) go to
``reports/<study>/<budget>/``; ``replace=True`` writes the report from these sweeps alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from attnlab.config.study import load_study, study_names
from attnlab.studies.report import analysis, history, lr, onset, plots, provenance, render, summary
from attnlab.studies.report.aggregate import load_sweeps, recording_differences
from attnlab.studies.report.baseline import baseline_of
from attnlab.studies.report.data import (
    DEFAULT_BUDGET,
    axes_of,
    frame_from_committed,
    frame_from_runs,
    merge,
    read_runs,
    write_runs,
)
from attnlab.studies.report.wandb_summary import log_summary_run
from attnlab.util import significance
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import short

__all__ = ["build_report", "latest_sweep", "write_report"]


def latest_sweep(root: Path = Path("logs")) -> Path | None:
    """The most recent multirun dir under ``root`` (by modification time)."""
    dirs = [p for p in root.glob("*/multiruns/*") if p.is_dir()]
    return max(dirs, key=lambda p: p.stat().st_mtime) if dirs else None


def shown(path) -> str:
    """A sweep dir as a report names it: from its logs/ folder on, wherever the checkout is."""
    parts = Path(path).parts
    return str(Path(*parts[parts.index("logs") :])) if "logs" in parts else Path(path).name


def declared_axes(study: str) -> list[str]:
    """The axes the study's experiment sweeps (with those of the experiments it extends); none for a study
    without an experiment file."""
    return list(load_study(study).grid) if study in study_names() else []


def build_report(sweep_dirs, reports: Path = Path("reports"), replace: bool = False, draw: bool = True) -> dict:
    """Add the runs of ``sweep_dirs`` to their study's runs.csv (or, with ``replace``, start it from them) and
    rebuild the report; returns the summary of the last report written.
    ``draw=False``: the pages and data without redrawing the figures."""
    sweep_dirs = [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]
    runs = load_sweeps(sweep_dirs)
    if not runs:
        raise SystemExit(
            f"attnlab: error: DIR={' '.join(map(str, sweep_dirs))!r} holds no results.json; expected sweep dirs under logs/"
        )
    name = next((s for r in runs if (s := r.results.get("config", {}).get("study"))), sweep_dirs[0].name)
    committed_axes = (
        axes_of(pd.read_csv(reports / name / "runs.csv", nrows=0)) if (reports / name / "runs.csv").is_file() else []
    )
    frame = frame_from_runs(runs, [*declared_axes(name), *committed_axes])
    axes = axes_of(frame)
    if lr.LR_AXIS in axes:
        frame = frame.join(pd.DataFrame([lr.run_columns(r) for r in runs]))
    baseline = baseline_of(runs)
    written = {}
    for budget, rows in frame.groupby("budget", sort=False):
        out = reports / name
        if (out / "summary.json").is_file() and budget != study_budget(out):  # another budget: beside the study's own
            out = out / re.sub(r"[^\w.=-]+", "_", budget)
        committed = None
        if (out / "runs.csv").is_file():
            committed = read_runs(out / "runs.csv")
        elif (out / "summary.json").is_file():
            committed = frame_from_committed(out)
            if committed is None and not replace:  # only cell means were kept: a report of these runs, beside it
                print(
                    f"attnlab: {out}/ keeps only each cell's mean and std; these runs go to {out}/new_runs/ (--replace: over it)"
                )
                out = out / "new_runs"
                committed = read_runs(out / "runs.csv") if (out / "runs.csv").is_file() else None
        fresh = replace or committed is None
        merged, duplicates = (
            (rows.reset_index(drop=True), rows.iloc[0:0]) if fresh else merge(committed, rows, f"{out}/runs.csv")
        )
        for _, d in duplicates.iterrows():
            cell = ", ".join(f"{short(a)}={d[a]}" for a in axes)
            print(
                f"attnlab: {cell} seed {d['seed']} is already in {out}/runs.csv: kept as it was, run {d['run']} left out"
            )
        meta = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() and not fresh else {}
        meta.update(
            study=name,
            sweep_dirs=list(dict.fromkeys([*map(shown, meta.get("sweep_dirs") or []), *map(shown, sweep_dirs)])),
            attention_free_level=baseline,
            recording_differences=recording_differences(runs),
        )
        out.mkdir(parents=True, exist_ok=True)
        added = rows[~rows["run"].isin(set(duplicates["run"]))]
        traces = history.of_runs(runs, axes, added)
        if not traces.empty or (fresh and (out / history.HISTORIES).is_file()):
            kept = None if fresh else history.read(out)
            write_runs(history.merged(kept, traces, axes), out / history.HISTORIES)
        write_runs(merged, out / "runs.csv")
        written = write_report(out, meta, draw)
        log_summary_run(name, out, sorted(out.glob("*.png")), runs, sweep_dirs[0])
        print(
            f"attnlab: {len(merged)} runs ({len(rows) - len(duplicates)} added) -> {out}/runs.csv, ablation.md, index.html"
        )
    return written


def study_budget(out: Path) -> str:
    """The budget of a committed report's runs (a report written before runs.csv: the default one)."""
    if not (out / "runs.csv").is_file():
        return DEFAULT_BUDGET
    return str(pd.read_csv(out / "runs.csv", usecols=["budget"], dtype=str, keep_default_na=False)["budget"].iloc[0])


def tested_cells(
    study: str, frame, axes: list[str], cells: list
) -> tuple[list[str], list, list, analysis.SweepQuestion]:
    """The cells the study's question is asked of, with the question: the runs' own cells, or for a
    learning-rate grid each arm's sensitivity over its rates (then also the arms)."""
    tested_axes, tested, arms = axes, cells, []
    if lr.LR_AXIS in axes and frame is not None:  # the question is asked of each arm's sensitivity over the grid
        arms = lr.arms(frame, axes)
        derived = lr.sensitivity_frame(arms)
        tested_axes, tested = axes_of(derived), analysis.cells_from_runs(derived, sort=False)
    question = analysis.question_of(study, tested_axes)
    if arms and not question.declared:  # each setting's effect at every size, and its change across sizes
        sizes = [a for a in tested_axes if a in lr.SIZE_AXES]
        question.metrics, question.across = list(lr.METRICS), sizes[0] if sizes else None
        question.compare = [(a, r) for a, r in question.compare if a not in sizes] or question.compare
    return tested_axes, tested, arms, question


def write_report(out: Path, meta: dict | None = None, draw: bool = True) -> dict:
    """Render ``out``'s report from its runs.csv (or, for a study whose per-seed values were never kept,
    from its ablation.csv's cells); ``meta``: summary.json's study-level entries (default: the file's)."""
    meta = meta if meta is not None else json.loads((out / "summary.json").read_text())
    meta["sweep_dirs"] = [
        shown(d) for d in meta.get("sweep_dirs") or ([meta["sweep_dir"]] if meta.get("sweep_dir") else [])
    ]
    if meta.get("sweep_dir"):
        meta["sweep_dir"] = shown(meta["sweep_dir"])
    study = meta.get("study") or out.name
    frame = read_runs(out / "runs.csv") if (out / "runs.csv").is_file() else None
    unpooled = []
    if frame is not None:
        frame = frame[frame["budget"] == frame["budget"].iloc[0]]
        made = provenance.made_by(frame)
        frame, unpooled = provenance.one_experiment(frame, axes_of(frame), str(out / "runs.csv"))
        axes, cells = axes_of(frame), analysis.cells_from_runs(frame)
    else:
        made = provenance.made_by(None)
        axes, cells = analysis.cells_from_summaries(pd.read_csv(out / "ablation.csv", dtype=str, keep_default_na=False))
    baseline = meta.get("attention_free_level")
    level = (baseline or {}).get("bigram")
    tested_axes, tested, arms, question = tested_cells(study, frame, axes, cells)
    if arms and draw:
        lr.plot(arms, (baseline or {}).get("unigram"), out / "lr_sensitivity.png", level)
    families, learning = {}, None
    if question.outcome in ("learned", "onset") and frame is not None:  # k of n and onsets, not means
        learning = learning_view(frame, axes, question, out, draw)
    for metric in question.metrics if learning is None else ():
        family = analysis.contrasts(tested, tested_axes, question, metric, cells, level)
        if family:
            families[metric] = family
    crossed = (
        [x for m, f in families.items() for x in analysis.interactions(tested, tested_axes, f, question.across)]
        if question.across
        else []
    )
    effects = analysis.pooled(cells, axes, "val/loss") if not arms and learning is None else []
    if draw:
        plots.final_value_plots(cells, axes, level, out, question.metrics[0])
        over_training(out, frame, axes)
    view = {
        "study": study,
        "axes": axes,
        "varying": plots.varying_axes(cells, axes),
        "question": question,
        "families": families,
        "interactions": crossed,
        "level": level,
        "unigram": (baseline or {}).get("unigram"),
        "gaps": [c.below for f in families.values() for c in f if c.below is not None],
        "unlearned": sum(c.unlearned for f in families.values() for c in f),
        "plan": json.loads((out / "plan.json").read_text())["verdict"] if (out / "plan.json").is_file() else None,
        "runs": len(frame) if frame is not None else sum(c.n_ok + c.n_failed for c in cells),
        "cells": cells,
        "seeds": seeds_text(cells),
        "per_seed_kept": frame is not None,
        "figures": [p.name for p in render.figures(out, question.metrics[0])],
        "out": out,
        "main": render.main_table(cells, axes, level, question if question.outcome in ("learned", "onset") else None),
        "comparisons": [render.comparisons_table(f) for f in families.values()],
        "pooled": render.pooled_table(effects) if effects else None,
        "layers": render.layer_tables(cells, axes),
        "lr": render.lr_tables(arms, (baseline or {}).get("unigram")) if arms else [],
        "source": lr.against_source(arms, families.get(lr.METRICS[0], []), crossed, question.difference or 0.0)
        if arms
        else [],
        "source_name": lr.SOURCE,
        "head_types": render.head_types_table(frame, axes) if frame is not None else None,
        "phase": render.phase_table(frame, axes) if frame is not None else None,
        "per_seed": render.per_seed_table(frame, axes, per_seed_metrics(question, frame))
        if frame is not None
        else None,
        "machine": render.machine_table(cells, axes),
        "failures": [f"{r['run']}: {r['error']}" for _, r in frame[frame["status"] != "ok"].iterrows()]
        if frame is not None
        else [],
        "recording": meta.get("recording_differences") or [],
        "made_by": made,
        "unpooled": unpooled,
        "verified": provenance.verification(out),
        "alpha": significance.ALPHA,
        "outcomes": significance.OUTCOMES,
        "learning": learning,
        "exact_up_to": significance.EXACT_UP_TO,
    }
    pages = render.render(view)
    atomic_write_text(out / "ablation.md", pages["ablation.md"])
    atomic_write_text(out / "index.html", pages["index.html"])
    if frame is not None:
        atomic_write_text(out / "ablation.csv", summary.cells_csv(cells, axes))
    data = {**meta, **summary.summary_json(view, frame, cells, effects, arms, out)}
    atomic_write_text(out / "summary.json", json.dumps(data, indent=2, default=summary.json_default) + "\n")
    return data


def over_training(out: Path, frame, axes: list[str]) -> None:
    """The figures over training, from histories.csv's rows of the runs the report pools."""
    traces = history.read(out)
    if traces is None or frame is None:
        return
    stats = history.by_cell(traces, frame, axes, "stats")
    plots.max_logit_over_training(stats, out / "max_logit_over_training.png")
    plots.extreme_tokens_over_training(stats, out / "sink_formation.png")
    heads = [
        (label, cell, [h for h in seeds if len(h) > 1])
        for label, cell, seeds in history.by_cell(traces, frame, axes, "heads")
    ]
    plots.heads_over_training(heads, out / "heads_over_training.png")


def learning_view(frame, axes: list[str], question: analysis.SweepQuestion, out: Path, draw: bool) -> dict:
    """An onset or learned study's arms, comparisons, table, figure and summary entries."""
    arms = onset.arms_of(frame, axes, question)
    family = onset.compare(arms, axes, question)
    axis = question.compare[0][0] if question.compare else None
    caps = [a.survival.cap for a in arms if a.survival is not None]
    nbytes = onset.cache_bytes(frame, axis) if axis else {}
    resolved = onset.frontier(arms, axis, nbytes) if nbytes else []
    front = resolved or []
    unresolved = None
    if resolved is None:  # Holm over every pair of arms: what the pairs need and how many runs an arm would do
        pairs = len(nbytes) * (len(nbytes) - 1) // 2
        unresolved = (
            f"Not resolved: {min(a.n for a in arms)} runs an arm cannot reach p < {significance.ALPHA} after Holm "
            f"over its {pairs} pairs of arms ({significance.exact_seeds_for(pairs)} an arm can)"
        )
    if draw and caps and axis:
        onset.plot(arms, axis, max(caps), out / onset.FIGURE, nbytes, front)
    return {
        "family": family,
        "table": onset.table(family),
        "summary": onset.summary(family, arms, axis, nbytes, front),
        "on_frontier": front,
        "frontier_unresolved": unresolved,
        "tally": onset.tally(arms, axis) if axis else [],
        "cap": max(caps) if caps else None,
        "reference_learned": family[0].ref.k if family else None,
    }


def per_seed_metrics(question: analysis.SweepQuestion, frame) -> list[str]:
    """The per-seed table's columns: the main metrics, the question's, and an onset study's step and censoring."""
    extra = [onset.ONSET, onset.CENSORED] if question.outcome == "onset" else []
    return [m for m in dict.fromkeys([*render.MAIN_METRICS, *question.metrics, *extra]) if m in frame]


def seeds_text(cells) -> str:
    counts = sorted({c.n_ok for c in cells}) or [0]
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
