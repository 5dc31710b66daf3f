"""Plots of a sweep: a metric against a numeric axis (one line per other-axes combination),
per-layer entropy against d_k, and the max logit, first-token statistics and head analysis over
training from the histories the report keeps (``history``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker

from attnlab.attention.stats import SINK_EPSILON
from attnlab.callbacks.attention_stats import read_history
from attnlab.studies.report.aggregate import Cell
from attnlab.studies.report.lr import LR_AXIS
from attnlab.writing.pages import short, where

plt.switch_backend("agg")  # files only: no display is assumed, whatever the environment chose


def _numeric(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _series(cells: list[Cell], x_axis: str) -> dict[str, list[Cell]]:
    out: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = where({k: v for k, v in cell.axes.items() if k != x_axis})
        out.setdefault(rest, []).append(cell)
    return out


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight")  # "tight" keeps a legend placed outside the axes in the file
    plt.close(fig)
    return path


def colours(n: int) -> list:
    """n distinct colours: tab10, tab20 beyond 10, a sampled colormap beyond 20 (no repeating cycle)."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(i / max(n - 1, 1)) for i in range(n)]


def legend_outside(fig, ax_or_handles=None, title: str | None = None):
    """One legend for the figure, right of the axes, so it never covers data."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(
            handles,
            labels,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=7,
            title=title,
            title_fontsize=7,
            frameon=False,
        )


def _error(cell, key: str):
    """The 95 % t interval's half-widths around the mean (0 without one): the error bar."""
    interval = cell.interval(key) if hasattr(cell, "interval") else None
    mean = cell.mean(key)
    return (0.0, 0.0) if interval is None or mean is None else (mean - interval[0], interval[1] - mean)


def metric_vs_axis(
    cells,
    x_axis: str,
    metric: str,
    path: Path,
    logx: bool = False,
    ylabel: str | None = None,
    baseline: float | None = None,
) -> Path | None:
    """``metric`` (mean over seeds, 95 % t interval as error bar) against a numeric axis, one line per other-axes
    combination in distinct colours, the legend outside the axes; ``baseline``: a level drawn across (the
    attention-free loss)."""
    if not cells or any(_numeric(c.axes[x_axis]) is None for c in cells):
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    series = _series(cells, x_axis)
    for k, ((name, group), colour) in enumerate(zip(series.items(), colours(len(series)))):
        pts = sorted(
            (_numeric(c.axes[x_axis]), c.mean(metric), *_error(c, metric)) for c in group if c.mean(metric) is not None
        )
        if pts:
            xs, ys, lo, hi = zip(*pts)
            dodge = 2 ** (
                0.04 * (k - (len(series) - 1) / 2)
            )  # side by side on the log axis, so error bars do not hide each other
            ax.errorbar([x * dodge for x in xs], ys, yerr=[lo, hi], marker="o", capsize=3, label=name, color=colour)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if baseline is not None:
        ax.axhline(baseline, color="k", ls="--", lw=0.9, label=f"attention-free (bigram) {baseline:.3f}")
    if any(len(c.values(metric)) > 1 for c in cells):
        ax.set_title("mean over seeds, error bars: 95 % t interval", fontsize=8)
    ax.set_xscale("log", base=10 if logx else 2)
    xs = sorted({_numeric(c.axes[x_axis]) for c in cells})
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(short(x_axis))
    ax.set_ylabel(ylabel or metric)
    ax.grid(alpha=0.3)
    legend_outside(fig)
    return save(fig, path)


def layer_stat_vs_axis(cells, x_axis: str, stat: str, layers: int, path: Path) -> Path | None:
    """One panel per other-axes combination, one line per layer (mean over seeds, 95 % t interval as error bar)."""
    if not cells or any(_numeric(c.axes[x_axis]) is None for c in cells):
        return None
    series = _series(cells, x_axis)
    cols = min(len(series), 4)
    rows_n = -(-len(series) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 3.0 * rows_n), squeeze=False, sharey=True)
    drawn = False
    palette = colours(layers)
    for ax, (name, group) in zip(axes.flat, series.items()):
        for i in range(layers):
            key = f"attn/L{i}/{stat}"
            pts = sorted(
                (_numeric(c.axes[x_axis]), c.mean(key), *_error(c, key)) for c in group if c.mean(key) is not None
            )
            if pts:
                xs, ys, lo, hi = zip(*pts)
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=f"layer {i}", color=palette[i])
                drawn = True
        ax.set_xscale("log", base=2)
        ticks = sorted({_numeric(c.axes[x_axis]) for c in group})
        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.minorticks_off()
        ax.set_title(name, fontsize=8)
        ax.set_xlabel(short(x_axis))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    if not drawn:
        plt.close(fig)
        return None
    for row in axes:
        row[0].set_ylabel(stat)
    fig.suptitle(f"final {stat} per layer: mean over seeds, error bars 95 % t interval", fontsize=9)
    fig.tight_layout()
    legend_outside(fig)
    return save(fig, path)


class _Cell:
    """A cell as the figures over training read it: its label and axes."""

    def __init__(self, label: str, axes: dict):
        self.label, self.axes = label, axes


def _colour_axis(cells) -> str | None:
    """The axis a study compares (the scaling rule when swept, else the one with the fewest levels): colours
    within a panel; the other axes make the panels."""
    axes = list(cells[0].axes) if cells else []
    if not axes:
        return None
    if "model.attention.scaling" in axes:
        return "model.attention.scaling"
    return min(axes, key=lambda a: (len({c.axes[a] for c in cells}), axes.index(a)))


def max_logit_over_training(groups: list[tuple[str, dict, list[list[dict]]]], path: Path) -> Path | None:
    """Max over layers of the max logit against the step, every seed with a history drawn (``groups``: per
    cell its label, axes and each seed's points, ``history.by_cell``): one panel per combination of the other
    axes, one colour per level of the compared axis (``_colour_axis``), legend outside."""
    with_history = [(_Cell(label, axes), seeds) for label, axes, seeds in groups if seeds]
    if not with_history:
        return None
    colour_axis = _colour_axis([c for c, _ in with_history])
    levels = list(dict.fromkeys(c.axes[colour_axis] for c, _ in with_history)) if colour_axis else [None]
    palette = dict(zip(levels, colours(len(levels))))
    panels: dict[str, list] = {}
    for cell, runs in with_history:
        rest = where({k: v for k, v in cell.axes.items() if k != colour_axis})
        panels.setdefault(rest, []).append((cell, runs))
    cols = min(len(panels), 4)
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.4 * cols, 2.6 * rows_n), squeeze=False, sharex=True, sharey=True)
    for ax, (name, group) in zip(axes.flat, panels.items()):
        for cell, runs in group:
            level = cell.axes[colour_axis] if colour_axis else None
            for seed, points in enumerate(runs):
                steps = [p["step"] for p in points]
                values = [max(v for k, v in p.items() if k.endswith("/max_logit")) for p in points]
                ax.plot(
                    steps,
                    values,
                    color=palette[level],
                    lw=0.9,
                    alpha=0.85,
                    label=(f"{short(colour_axis)}={level}" if colour_axis else cell.label) if seed == 0 else None,
                )
        ax.set_title(name, fontsize=8)
        ax.set_yscale("symlog", linthresh=1.0)  # linear below 1, logarithmic over the hundreds an unscaled run reaches
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for row in axes:
        row[0].set_ylabel("max logit (max over layers)")
    fig.suptitle("max logit over training, one line per seed whose history the report keeps", fontsize=9)
    fig.tight_layout()
    legend_outside(fig)
    return save(fig, path)


EXTREME_PANELS = {
    "sink_mass_dormant": "first-token weight, dormant queries",
    "value_drain": "value drain ||v_0|| / ||v_t||",
    "residual_peak": "residual peak ||h_0|| / ||h_t||",
}


def extreme_tokens_over_training(
    groups: list[tuple[str, dict, list[list[dict]]]], path: Path, layer: int = 0
) -> Path | None:
    """When a sink forms: layer ``layer``'s dormant first-token weight, value drain and residual peak
    against the step, one colour per cell and one line per seed (every seed drawn); None if no run
    recorded them (a task without query classes)."""
    fig, axes = plt.subplots(1, len(EXTREME_PANELS), figsize=(4.2 * len(EXTREME_PANELS), 3.4), squeeze=False)
    drawn = False
    palette = colours(len(groups))
    for colour, (label, _axes, seeds) in enumerate(groups):
        for seed, history in enumerate(seeds):
            points = [p for p in history if f"attn/L{layer}/sink_mass_dormant" in p]
            if not points:
                continue
            drawn = True
            for ax, stat in zip(axes[0], EXTREME_PANELS):
                ax.plot(
                    [p["step"] for p in points],
                    [p[f"attn/L{layer}/{stat}"] for p in points],
                    color=palette[colour],
                    lw=0.9,
                    alpha=0.8,
                    label=label if seed == 0 else None,
                )
    if not drawn:
        plt.close(fig)
        return None
    for ax, title in zip(axes[0], EXTREME_PANELS.values()):
        ax.set_xlabel("step")
        ax.set_title(f"L{layer}: {title}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].axhline(SINK_EPSILON, color="k", lw=0.6, ls="--", label=f"sink threshold {SINK_EPSILON} (Gu et al.)")
    fig.tight_layout()
    legend_outside(fig)
    return save(fig, path)


def stats_over_training(runs: dict[str, Path], stats: tuple[str, ...], path: Path) -> Path | None:
    """Per-layer statistics against the step for a few runs side by side (one panel per statistic)."""
    fig, axes = plt.subplots(1, len(stats), figsize=(4.2 * len(stats), 3.4), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for (label, run_dir), style in zip(runs.items(), styles):
        points = read_history(run_dir)
        if not points:
            continue
        layers = sorted({k.split("/")[1] for k in points[0] if k.startswith("attn/L")})
        for ax, stat in zip(axes[0], stats):
            for i, layer in enumerate(layers):
                ax.plot(
                    [p["step"] for p in points],
                    [p[f"attn/{layer}/{stat}"] for p in points],
                    style,
                    color=f"C{i}",
                    label=f"{label} {layer}",
                )
    for ax, stat in zip(axes[0], stats):
        ax.set_xlabel("step")
        ax.set_title(stat, fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig)
    return save(fig, path)


HEAD_PANELS = {
    "repeat_acc": "copying accuracy on the probe",
    "induction_max": "induction score (best head of L{i})",
    "induction_knockout_all_heads": "knockout, all heads of L{i}",
}


def heads_over_training(groups: list[tuple[str, dict, list[list[dict]]]], path: Path) -> Path | None:
    """The head analysis' history of every seed of each cell (``history.by_cell``, one colour per cell):
    copying accuracy, then per layer the best induction score and the knockout of the whole layer, against
    the step; None if no run has one. Every seed is drawn, so a seed that never makes the phase change shows
    as its own flat line."""
    histories = {label: runs for label, _axes, runs in groups if runs}
    if not histories:
        return None
    fig, axes = plt.subplots(1, len(HEAD_PANELS), figsize=(4.2 * len(HEAD_PANELS), 3.4), squeeze=False)
    palette = colours(len(histories))
    for colour, (label, runs) in enumerate(histories.items()):
        for seed, history in enumerate(runs):
            steps = [p["step"] for p in history]
            axes[0][0].plot(
                steps,
                [p["repeat_acc"] for p in history],
                color=palette[colour],
                lw=1 if len(runs) == 1 else 0.8,
                label=label if seed == 0 else None,
            )
            for ax, stat in zip(axes[0][1:], list(HEAD_PANELS)[1:]):
                layers = sorted({k.split("/")[0] for k in history[-1] if k.startswith("L") and k.endswith(f"/{stat}")})
                for style, layer in zip(["-", "--", ":", "-."], layers):
                    # with a marker: a statistic measured once (the knockout at the end) still shows
                    ax.plot(
                        steps,
                        [p.get(f"{layer}/{stat}") for p in history],
                        style,
                        color=palette[colour],
                        lw=0.8,
                        marker=".",
                        ms=4,
                    )
    for ax, title in zip(axes[0], HEAD_PANELS.values()):
        ax.set_xlabel("step")
        ax.set_title(
            title.replace("L{i}", "each layer") + (" (solid L0, dashed L1, ...)" if "{i}" in title else ""), fontsize=8
        )
        ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig)
    return save(fig, path)


def varying_axes(cells, axes: list[str]) -> list[str]:
    """The axes on which the cells take more than one value (an axis with one value compares nothing)."""
    return [a for a in axes if len({c.axes.get(a) for c in cells}) > 1]


def figure_name(metric: str, axis: str) -> str:
    """The file of ``metric`` drawn against ``axis``: val_acc_vs_n_kv_head.png."""
    return f"{metric.replace('/', '_')}_vs_{short(axis)}.png"


def final_value_plots(cells, axes: list[str], level: float | None, out: Path, metric: str = "val/loss") -> None:
    """Final values against each numeric axis the cells vary on, from the cells alone: the question's primary
    ``metric`` and the val loss (with the attention-free level where known)."""
    varying = varying_axes(cells, axes)
    if "model.d_k" in varying:
        metric_vs_axis(
            cells, "model.d_k", "val/loss", out / "val_loss_vs_dk.png", ylabel="final val loss", baseline=level
        )
        layers = 1 + max(
            (int(k.split("/")[1][1:]) for c in cells for k in (*c.samples, *c.summaries) if k.startswith("attn/L")),
            default=-1,
        )
        layer_stat_vs_axis(cells, "model.d_k", "entropy_norm", layers, out / "entropy_norm_vs_dk.png")
    for axis in varying:
        if axis not in ("model.d_k", LR_AXIS):
            for m in dict.fromkeys([metric, "val/loss"]):
                baseline = level if m == "val/loss" else None
                metric_vs_axis(cells, axis, m, out / figure_name(m, axis), ylabel=f"final {m}", baseline=baseline)
