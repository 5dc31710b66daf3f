"""Results of runs -> Markdown/CSV/HTML tables and PNG plots under reports/<study>/."""
from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path

from ..analysis.phase import PHASE_LEVEL, phase_change_step
from ..results import atomic_write_text
from .aggregate import group_cells, load_sweeps, lr_sensitivity, n_layers, recording_differences, seeds_per_cell, short, swept_axes
from .plots import extreme_tokens_over_training, heads_over_training, layer_stat_vs_axis, max_logit_over_training, metric_vs_axis
from .significance import effects_summary, effects_table, factor_effects, k_of_n_text, marked_cells, pairs_table, scaling_pairs
from .significance import summary as significance_summary
from ..markdown import markdown_table
from .tables import csv_keys, csv_text, html_table, rows
from .wandb_summary import log_summary_run

__all__ = ["build_report", "latest_sweep"]


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
    """Write ablation.md/.csv, plots and index.html for a study run as one or several sweep dirs
    (merged: e.g. one dir per seed); return a short summary."""
    sweep_dirs = [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]
    runs = load_sweeps(sweep_dirs)
    if not runs:
        raise SystemExit(f"attnlab: error: DIR={' '.join(map(str, sweep_dirs))!r} holds no results.json; expected sweep dirs under logs/")
    axes = swept_axes(runs)
    cells = group_cells(runs, axes)
    layers = n_layers(runs)
    name = study_name(sweep_dirs[0], runs)
    pairs = scaling_pairs(cells, axes)
    out = reports / name
    out.mkdir(parents=True, exist_ok=True)

    plots = []
    if "model.d_k" in axes:
        plots.append(metric_vs_axis(cells, "model.d_k", "val/loss", out / "val_loss_vs_dk.png", ylabel="final val loss"))
        plots.append(layer_stat_vs_axis(cells, "model.d_k", "entropy_norm", layers, out / "entropy_norm_vs_dk.png"))
    sensitivity = {}
    if "optim.lr" in axes:
        plots.append(metric_vs_axis(cells, "optim.lr", "val/loss", out / "lr_sensitivity.png", logx=True, ylabel="final val loss"))
        sensitivity = lr_sensitivity(cells)
    for axis in axes:
        if axis not in ("model.d_k", "optim.lr"):
            plots.append(metric_vs_axis(cells, axis, "val/loss", out / f"val_loss_vs_{short(axis)}.png"))
    plots.append(max_logit_over_training(cells, out / "max_logit_over_training.png"))
    plots.append(extreme_tokens_over_training(cells, out / "sink_formation.png"))
    histories = {cell.label: cell.head_histories() for cell in cells}
    plots.append(heads_over_training(histories, out / "heads_over_training.png"))
    plots = [p for p in plots if p is not None]

    header, body = rows(cells, axes, layers, marked_cells(pairs))
    failed = sum(len(c.failed) for c in cells)
    seeds = seeds_per_cell(cells)
    spread = ("Values are mean ± std (sample std, n - 1) over seeds of the final metrics, the std to two significant digits "
              "and the mean to the same decimal place; per-layer columns (means over seeds)"
              if seeds != "1" else "One seed per cell: values are single runs, with no estimate of seed noise; per-layer columns")
    lines = [
        f"# {name}: ablation table",
        "",
        f"Sweep{'s' if len(sweep_dirs) > 1 else ''}: {', '.join(f'`{d}`' for d in sweep_dirs)} ({len(runs)} runs, {len(cells)} cells, "
        f"{seeds} finished seed(s) per cell, {failed} failed). {spread} list layers 0 to "
        f"{layers - 1}. Peak MiB is the peak tensor memory of a training step above its start level."
        + (" A * after a val loss: this scaled cell differs from its unscaled twin beyond seed noise (see below)."
           if any(p.significant for p in pairs) else "")
        + (f" Runs differ in settings that change what they record, not what they train, and are grouped regardless: "
           f"{'; '.join(recording)}." if (recording := recording_differences(runs)) else ""),
        "",
        markdown_table(header, body),
    ]
    if pairs:
        p_header, p_body = pairs_table(pairs)
        lines += ["", "## Scaled vs unscaled", "", significance_summary(pairs), "", markdown_table(p_header, p_body)]
    effects = factor_effects(cells, axes)
    if effects:
        lines += ["", "## Each axis pooled over the others", "", effects_summary(effects), "", markdown_table(*effects_table(effects))]
    if sensitivity:
        lines += ["", "## LR sensitivity (Wortsman et al. 2023)", "",
                  "mean over the LR grid of min(loss, initial loss) - best loss; initial loss = ln(vocab). Lower is more robust.", "",
                  markdown_table(["variant", "LR sensitivity"], [[k, f"{v:.3f}"] for k, v in sorted(sensitivity.items(), key=lambda kv: kv[1])])]
    types = {cell.label: cell.head_types(layers) for cell in cells}
    if any(t for layer_types in types.values() for t in layer_types):
        lines += ["", "## Head types per layer", "", HEAD_TYPES_NOTE, "",
                  markdown_table(["cell", *(f"L{i}" for i in range(layers)), "types in some seeds only"],
                                 [[label, *map(head_type_text, per_layer),
                                   "; ".join(f"L{i} {t}" for i, c in enumerate(per_layer) if (t := head_type_seeds(c))) or "-"]
                                  for label, per_layer in types.items()])]
    phases = {label: [phase_change_step(h) for h in runs] for label, runs in histories.items()}
    if any(step is not None for steps in phases.values() for step in steps):  # a text model never copies: no table
        lines += ["", "## Phase change", "", f"The first measured step at which copying on the repeated probe reaches {PHASE_LEVEL} "
                  "(`attnlab.analysis.phase.phase_change_step`), per seed that ran the head analysis over training.", "",
                  markdown_table(["cell", "seeds that reach it", "step: median", "step: range"],
                                 [[label, *phase_text(steps)] for label, steps in phases.items() if steps])]
    errors = [f"- {r.dir.name}: {r.results.get('error')}" for c in cells for r in c.failed]
    if errors:
        lines += ["", "## Failed runs", "", *errors]
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    atomic_write_text(out / "ablation.md", "\n".join(lines))
    atomic_write_text(out / "ablation.csv", csv_text(cells, axes, layers))
    significance = (significance_summary(pairs), *pairs_table(pairs)) if pairs else None
    pooled = (effects_summary(effects), *effects_table(effects)) if effects else None
    atomic_write_text(out / "index.html", index_html(name, lines[2], header, body, sensitivity, plots, significance, pooled))
    summary = {"study": name, "sweep_dirs": [str(d) for d in sweep_dirs], "runs": len(runs), "cells": len(cells), "failed": failed,
               "seeds_per_cell": seeds, "out": str(out),
               "scaled_vs_unscaled": [{"where": p.where, "scaling": p.variant, "diff": p.diff, "n": [len(p.unscaled), len(p.scaled)],
                                       "welch_t": p.test.t if p.test else None, "df": p.test.df if p.test else None,
                                       "p": p.test.p if p.test else None, "p_holm": p.p_holm, "beyond_noise": p.significant}
                                      for p in pairs],
               "pooled_effects": [{"axis": e.axis, "level": e.level, "reference": e.reference, "diff": e.diff, "strata": e.strata,
                                   "welch_t": e.test.t if e.test else None, "df": e.test.df if e.test else None,
                                   "p": e.test.p if e.test else None, "p_holm": e.p_holm, "beyond_noise": e.significant}
                                  for e in effects],
               "per_seed": [{"axes": c.axes, "runs": [per_seed_values(r, keys) for r in c.ok_runs]}
                            for c in cells for keys in [csv_keys(cells, layers)]],
               "head_types": [{"axes": c.axes, "layers": types[c.label]} for c in cells],
               "phase_change_steps": [{"axes": c.axes, "steps": phases[c.label]} for c in cells if phases[c.label]]}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    log_summary_run(name, out, plots, runs, sweep_dirs[0])
    print(f"attnlab: {len(cells)} cells ({failed} failed runs) -> {out}/ablation.md, index.html")
    return summary


def per_seed_values(run, keys: list[str]) -> dict:
    """One finished run's seed id, run dir and final metrics (the table's keys): what per-seed ranges are quoted from."""
    seed = run.results.get("config", {}).get("seed", run.overrides.get("seed"))
    return {"seed": int(seed) if str(seed).lstrip("-").isdigit() else seed, "dir": run.dir.name,
            "metrics": {k: v for k in keys if (v := run.metric(k)) is not None}}


HEAD_TYPES_NOTE = ("Each head's type from the final head analysis (`attnlab.analysis.heads.head_type`, docs/metrics.md): the "
                   "number of heads of each type per seed, with the seeds that have one when not all do.")


def head_type_text(counts: dict[str, list[int]]) -> str:
    """{type: heads per seed} -> 'induction 1 (2/3 seeds), content 1' (mean heads per seed)."""
    parts = []
    for kind, per_seed in sorted(counts.items(), key=lambda kv: -sum(kv[1])):
        having = sum(n > 0 for n in per_seed)
        parts.append(f"{kind} {sum(per_seed) / len(per_seed):.3g}" + (f" ({having}/{len(per_seed)} seeds)" if having < len(per_seed) else ""))
    return ", ".join(parts) or "-"


def head_type_seeds(counts: dict[str, list[int]]) -> str:
    """The types that some seeds have and others not, as k of n seeds with a Wilson interval."""
    parts = [f"{kind}: {k_of_n_text(having, len(per_seed))}" for kind, per_seed in sorted(counts.items())
             if 0 < (having := sum(n > 0 for n in per_seed)) < len(per_seed)]
    return "; ".join(parts)


def phase_text(steps: list[int | None]) -> list[str]:
    """[seeds that reach it, median step, range] for the phase-change table."""
    reached = sorted(s for s in steps if s is not None)
    if not reached:
        return [k_of_n_text(0, len(steps)), "-", "-"]
    return [k_of_n_text(len(reached), len(steps)), f"{statistics.median(reached):g}", f"{reached[0]}-{reached[-1]}"]


def index_html(name, intro, header, body, sensitivity, plots, significance=None, pooled=None) -> str:
    """A single self-contained page (plots inlined as base64) for browsing offline."""
    imgs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in plots
    )
    sens = ""
    if significance:
        text, p_header, p_body = significance
        sens += f"<h2>Scaled vs unscaled</h2><p>{html.escape(text)}</p>" + html_table(p_header, [[c.replace("**", "") for c in r] for r in p_body])
    if pooled:
        text, e_header, e_body = pooled
        sens += f"<h2>Each axis pooled over the others</h2><p>{html.escape(text)}</p>" + html_table(e_header, [[c.replace("**", "") for c in r] for r in e_body])
    if sensitivity:
        sens += "<h2>LR sensitivity</h2>" + html_table(["variant", "LR sensitivity"], [[k, f"{v:.3f}"] for k, v in sensitivity.items()])
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px}tr.failed{background:#fdd}figure{display:inline-block;margin:1em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>attnlab: {html.escape(name)}</title>"
            f"<style>{style}</style></head><body><h1>attnlab: {html.escape(name)}</h1><p>{html.escape(intro)}</p>"
            f"{html_table(header, body)}{sens}{imgs}</body></html>")
