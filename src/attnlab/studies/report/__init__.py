"""A study's runs -> reports/<study>/: runs.csv (one row per run and seed), and from it alone ablation.md,
index.html, ablation.csv (per cell), summary.json and the plots of final values (kv_frontier: frontier.md too).

A sweep of a study that already has a report adds its runs to runs.csv: a cell and seed already there is
kept as it was and listed, runs of another budget (extra overrides such as ``debug=smoke``) go to
``reports/<study>/<budget>/``; ``replace=True`` writes the report from these sweeps alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from ...analysis.phase import head_history
from ...results import atomic_write_text
from ..pages import TEMPLATES, short
from . import analysis, frontier, lr, plots, render
from .aggregate import group_cells, load_sweeps, recording_differences, swept_axes
from .data import DEFAULT_BUDGET, axes_of, frame_from_committed, frame_from_runs, merge, read_runs, write_runs
from .wandb_summary import log_summary_run

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
    """The axes the study's experiment file sweeps (hydra.sweeper.params), with those of the experiments it extends."""
    from ...config import CONF_DIR

    path = CONF_DIR / "experiment" / f"{study}.yaml"
    if not path.is_file():
        return []
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    own = list(((cfg.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    parents = [d for d in cfg.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    return list(dict.fromkeys([*own, *(a for p in parents for a in declared_axes(p))]))


def baseline_of(runs) -> dict | None:
    """The attention-free level of the runs' data (character text, a readable token corpus or a generated task)."""
    return baseline_of_config(next((c for r in runs if (c := r.results.get("config", {})).get("data")), {}))


def experiment_baseline(study: str) -> dict | None:
    """The attention-free level of the data ``experiment=<study>`` trains on: for a committed report whose
    runs are no longer on disk."""
    from ...config import CONF_DIR, compose_config

    if not (CONF_DIR / "experiment" / f"{study}.yaml").is_file():
        return None
    cfg = compose_config([f"experiment={study}"])
    parts = {"data": cfg.data, "model": {"block_size": cfg.model.block_size}, "seed": cfg.seed}
    return baseline_of_config(OmegaConf.to_container(OmegaConf.create(parts), resolve=True))


def baseline_of_config(config: dict) -> dict | None:
    from .baseline import attention_free_levels, task_data, task_levels, text_corpus, token_corpus_level

    data = config.get("data")
    if task_data(data):
        return task_levels(data, config["model"]["block_size"], config.get("seed", 0))
    if not text_corpus(data):
        return token_corpus_level(data)
    level = attention_free_levels()
    keep = ("bigram", "unigram", "chance", "vocab")
    return {**{k: level[k] for k in keep}, "split": "val", "source": "attnlab.studies.report.baseline"}


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
    summary = {}
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
        ids = set(rows["run"])
        if (
            fresh and draw
        ):  # the plots over training need the runs' histories: drawn when the report is these runs alone
            cells = group_cells([r for r in runs if r.dir.name in ids], swept_axes(runs))
            plots.max_logit_over_training(cells, out / "max_logit_over_training.png")
            plots.extreme_tokens_over_training(cells, out / "sink_formation.png")
            plots.heads_over_training(
                {c.label: [h for r in c.ok_runs if len(h := head_history(r.dir)) > 1] for c in cells},
                out / "heads_over_training.png",
            )
        write_runs(merged, out / "runs.csv")
        summary = write_report(out, meta, draw)
        log_summary_run(name, out, sorted(out.glob("*.png")), runs, sweep_dirs[0])
        print(
            f"attnlab: {len(merged)} runs ({len(rows) - len(duplicates)} added) -> {out}/runs.csv, ablation.md, index.html"
        )
    return summary


def study_budget(out: Path) -> str:
    """The budget of a committed report's runs (a report written before runs.csv: the default one)."""
    if not (out / "runs.csv").is_file():
        return DEFAULT_BUDGET
    return str(pd.read_csv(out / "runs.csv", usecols=["budget"], dtype=str, keep_default_na=False)["budget"].iloc[0])


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
    if frame is not None:
        frame = frame[frame["budget"] == frame["budget"].iloc[0]]
        axes, cells = axes_of(frame), analysis.cells_from_runs(frame)
    else:
        axes, cells = analysis.cells_from_summaries(pd.read_csv(out / "ablation.csv", dtype=str, keep_default_na=False))
    baseline = meta.get("attention_free_level")
    level = (baseline or {}).get("bigram")
    if study in frontier.STUDIES and frame is not None:  # frontier.md beside ablation.md, its data checked first
        meta["frontier"] = frontier.write(frame, study, level, out, draw)
    tested_axes, tested, arms = axes, cells, []
    if lr.LR_AXIS in axes and frame is not None:  # the question is asked of each arm's sensitivity over the grid
        arms = lr.arms(frame, axes)
        derived = lr.sensitivity_frame(arms)
        tested_axes, tested = axes_of(derived), analysis.cells_from_runs(derived, sort=False)
        if draw:
            lr.plot(arms, (baseline or {}).get("unigram"), out / "lr_sensitivity.png")
    question = analysis.question_of(study, tested_axes)
    if arms and not question.declared:  # each setting's effect at every size, and its change across sizes
        sizes = [a for a in tested_axes if a in lr.SIZE_AXES]
        question.metrics, question.across = list(lr.METRICS), sizes[0] if sizes else None
        question.compare = [(a, r) for a, r in question.compare if a not in sizes] or question.compare
    families = {}
    for metric in question.metrics:
        family = analysis.contrasts(tested, tested_axes, question, metric)
        analysis.reference_gap(family, cells, level)
        if family:
            families[metric] = family
    crossed = (
        [x for m, f in families.items() for x in analysis.interactions(tested, tested_axes, f, question.across)]
        if question.across
        else []
    )
    effects = analysis.pooled(cells, axes, "val/loss") if not arms else []
    if draw:
        final_value_plots(cells, axes, level, out)
    view = {
        "study": study,
        "axes": axes,
        "question": question,
        "families": families,
        "interactions": crossed,
        "level": level,
        "unigram": (baseline or {}).get("unigram"),
        "gaps": [c.below for f in families.values() for c in f if c.below is not None],
        "runs": len(frame) if frame is not None else sum(c.n_ok + c.n_failed for c in cells),
        "cells": cells,
        "seeds": seeds_text(cells),
        "per_seed_kept": frame is not None,
        "figures": [p.name for p in render.figures(out)],
        "out": out,
        "main": render.main_table(cells, axes, level),
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
        "per_seed": render.per_seed_table(frame, axes, [*render.MAIN_METRICS, *question.metrics])
        if frame is not None
        else None,
        "machine": render.machine_table(cells, axes),
        "failures": [f"{r['run']}: {r['error']}" for _, r in frame[frame["status"] != "ok"].iterrows()]
        if frame is not None
        else [],
        "recording": meta.get("recording_differences") or [],
        "frontier": meta.get("frontier"),
        "alpha": analysis.stats.ALPHA,
    }
    pages = render.render(view)
    atomic_write_text(out / "ablation.md", pages["ablation.md"])
    atomic_write_text(out / "index.html", pages["index.html"])
    if frame is not None:
        atomic_write_text(out / "ablation.csv", cells_csv(cells, axes))
    summary = {**meta, **summary_json(view, frame, cells, effects, arms, out)}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")
    return summary


def _measured(m) -> dict | str | None:
    return {"diff": m.diff, "ci95": [m.lo, m.hi], "p": m.p, "n": [m.n_ref, m.n_level]} if hasattr(m, "diff") else m


def seeds_text(cells) -> str:
    counts = sorted({c.n_ok for c in cells}) or [0]
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def final_value_plots(cells, axes: list[str], level: float | None, out: Path) -> None:
    """Final values against a numeric axis (with the attention-free level where known), from the cells alone."""
    if "model.d_k" in axes:
        plots.metric_vs_axis(
            cells, "model.d_k", "val/loss", out / "val_loss_vs_dk.png", ylabel="final val loss", baseline=level
        )
        layers = 1 + max(
            (int(k.split("/")[1][1:]) for c in cells for k in (*c.samples, *c.summaries) if k.startswith("attn/L")),
            default=-1,
        )
        plots.layer_stat_vs_axis(cells, "model.d_k", "entropy_norm", layers, out / "entropy_norm_vs_dk.png")
    for axis in axes:
        if axis not in ("model.d_k", lr.LR_AXIS):
            plots.metric_vs_axis(cells, axis, "val/loss", out / f"val_loss_vs_{short(axis)}.png", baseline=level)


def cells_csv(cells, axes: list[str]) -> str:
    """ablation.csv: per cell the seed counts and every metric's mean, sample std and 95 % t interval."""
    keys = list(dict.fromkeys(k for c in cells for k in c.samples))
    rows = []
    for c in cells:
        row = {**c.axes, "n_ok": c.n_ok, "n_failed": c.n_failed, "errors": c.errors}
        for k in keys:
            s, ci = c.stats(k), c.interval(k)
            row.update(
                {
                    f"{k}_mean": s and s[0],
                    f"{k}_std": s and s[1],
                    f"{k}_ci95_lo": ci and ci[0],
                    f"{k}_ci95_hi": ci and ci[1],
                }
            )
        rows.append(row)
    return pd.DataFrame(rows).to_csv(index=False)


def _contrast(c) -> dict:
    t = c.test
    return {
        "axis": c.axis,
        "level": c.level,
        "reference": c.reference,
        "where": c.where,
        "diff": c.diff,
        "ci95": [t.lo, t.hi] if t else None,
        "n": list(c.n),
        "df": t.df if t else None,
        "p": t.p if t else None,
        "p_holm": c.p_holm,
        "detectable": t.detectable if t else None,
        "seeds_needed": c.seeds_needed,
        "below_attention_free": c.below,
        "beyond_noise": c.verdict in ("higher", "lower"),
        "verdict": c.verdict,
    }


def summary_json(view: dict, frame, cells, effects, arms, out: Path) -> dict:
    """summary.json's data entries (its keys as other code reads them), from the same analysis as the pages."""
    families, axes = view["families"], view["axes"]
    ok = frame[frame["status"] == "ok"] if frame is not None else None
    data = {
        "runs": view["runs"],
        "cells": len(cells),
        "failed": sum(c.n_failed for c in cells),
        "seeds_per_cell": view["seeds"],
        # a budget's runs are written inside their study's dir; a report dir of its own stands under reports/
        "out": f"reports/{view['study']}/{out.name}" if out.parent.name == view["study"] else f"reports/{out.name}",
        "question": {**vars(view["question"])},
        "headline": " ".join(TEMPLATES.get_template("headline.j2").render(**view).split()),
        "contrasts": {m: [_contrast(c) for c in f] for m, f in families.items()},
        "interactions": [
            {
                "metric": x.metric,
                "across": x.across,
                "first": x.first,
                "last": x.last,
                "at": x.at,
                "diff": x.test and x.test.diff,
                "ci95": x.test and [x.test.lo, x.test.hi],
                "p": x.test and x.test.p,
                "p_holm": x.p_holm,
                "detectable": x.test and x.test.detectable,
                "verdict": x.verdict,
            }
            for x in view["interactions"]
        ],
        "scaled_vs_unscaled": [
            {**_contrast(c), "scaling": c.level}
            for c in families.get("val/loss", [])
            if c.axis == analysis.SCALING_AXIS
        ],
        "pooled_effects": [
            {
                "axis": e["axis"],
                "level": e["level"],
                "reference": e["reference"],
                "diff": e["diff"],
                "strata": e["strata"],
                "df": e["test"] and e["test"].df,
                "p": e["test"] and e["test"].p,
                "p_holm": e["p_holm"],
                "beyond_noise": e["p_holm"] is not None and e["p_holm"] < analysis.stats.ALPHA,
                "ci95": e["test"] and [e["test"].lo, e["test"].hi],
            }
            for e in effects
        ],
        "cells_ci95": [
            {
                "axes": c.axes,
                "n": c.n_ok,
                "metrics": {
                    k: {"mean": c.mean(k), "std": c.stats(k)[1], "ci95": c.interval(k)}
                    for k in render.MAIN_METRICS
                    if c.stats(k)
                },
            }
            for c in cells
        ],
    }
    if ok is not None:
        metrics = [
            m
            for m in frame.columns[list(frame.columns).index("run") + 1 :]
            if not m.startswith(("head_type/", "phase/"))
        ]
        groups = ok.groupby(axes, sort=False) if axes else [((), ok)]
        data["per_seed"], data["head_types"], data["phase_change_steps"] = [], [], []
        for key, rows in groups:
            cell = dict(zip(axes, map(str, key if isinstance(key, tuple) else (key,))))
            data["per_seed"].append(
                {
                    "axes": cell,
                    "runs": [
                        {"seed": r["seed"], "dir": r["run"], "metrics": {m: r[m] for m in metrics if pd.notna(r[m])}}
                        for _, r in rows.iterrows()
                    ],
                }
            )
            kinds = [c for c in frame.columns if c.startswith("head_type/")]
            layers = 1 + max((int(c.split("/")[1][1:]) for c in kinds), default=-1)
            typed = rows.dropna(subset=kinds, how="all") if kinds else rows.iloc[0:0]
            data["head_types"].append(
                {
                    "axes": cell,
                    "layers": [
                        {
                            c.rsplit("/", 1)[1]: [int(v) for v in typed[c].fillna(0)]
                            for c in kinds
                            if c.startswith(f"head_type/L{i}/") and typed[c].fillna(0).any()
                        }
                        for i in range(layers)
                    ],
                }
            )
            if "phase/measured" in rows:
                steps = rows[rows["phase/measured"] == 1]["phase/step"]
                data["phase_change_steps"].append(
                    {"axes": cell, "steps": [None if pd.isna(s) else int(s) for s in steps]}
                )
        data.pop("per_seed_note", None)
    else:
        data["per_seed_note"] = (
            "Per-seed values were not kept for this study: ablation.csv holds each cell's mean, sample std and seed count."
        )
    if arms:
        data["lr_sensitivity"] = {
            "arms": [
                {
                    "size": a.size_label,
                    "arm": a.label,
                    "params_non_embedding": a.params,
                    "initial_loss": a.initial,
                    "seeds": len(a.seeds),
                    "sensitivity_per_seed": a.per_seed(),
                    "upper_sensitivity_per_seed": a.per_seed(upper=True),
                    "best_lr": a.best_lr,
                    "critical_lr": a.critical_lr(view["unigram"]),
                    "loss": {f"{lr_:g}": a.mean_loss(lr_) for lr_ in a.lrs},
                    "max_logit": {f"{lr_:g}": a.logits.get(lr_) for lr_ in a.lrs},
                }
                for a in arms
            ],
            "critical_fraction": lr.CRITICAL_FRACTION,
            "against_source": [
                {"statement": r["statement"], "verdict": r["verdict"], "measured": _measured(r["measured"])}
                for r in view["source"]
            ],
        }
    return data


def _json_default(value):
    if value is pd.NA:  # a run without a seed id
        return None
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(type(value))
