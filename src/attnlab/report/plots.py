"""Plots of a sweep: a metric against a numeric axis (one line per other-axes combination),
per-layer entropy against d_k, max logit over training from each run's attention_stats.jsonl,
and the head analysis over training from each run's heads.json."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..callbacks.attention_stats import read_history  # noqa: E402
from .aggregate import Cell, short  # noqa: E402


def _numeric(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _series(cells: list[Cell], x_axis: str) -> dict[str, list[Cell]]:
    out: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = ", ".join(f"{short(k)}={v}" for k, v in cell.axes.items() if k != x_axis) or "all"
        out.setdefault(rest, []).append(cell)
    return out


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def metric_vs_axis(cells: list[Cell], x_axis: str, metric: str, path: Path, logx: bool = False, ylabel: str | None = None) -> Path | None:
    """``metric`` (mean, std as error bar) against a numeric axis, one line per other-axes combination."""
    if not cells or any(_numeric(c.axes[x_axis]) is None for c in cells):
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    series = _series(cells, x_axis)
    for k, (name, group) in enumerate(series.items()):
        pts = sorted((_numeric(c.axes[x_axis]), c.mean(metric), c.std(metric)) for c in group if c.mean(metric) is not None)
        if pts:
            xs, ys, es = zip(*pts)
            dodge = 2 ** (0.04 * (k - (len(series) - 1) / 2))  # side by side on the log axis, so error bars do not hide each other
            ax.errorbar([x * dodge for x in xs], ys, yerr=es, marker="o", capsize=3, label=name)
            drawn = True
    if any(len(c.values(metric)) > 1 for c in cells):
        ax.set_title("mean over seeds, error bars ±1 std", fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=10 if logx else 2)
    ax.set_xlabel(short(x_axis))
    ax.set_ylabel(ylabel or metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def layer_stat_vs_axis(cells: list[Cell], x_axis: str, stat: str, layers: int, path: Path) -> Path | None:
    """One panel per other-axes combination, one line per layer (mean over seeds, std as error bar)."""
    if not cells or any(_numeric(c.axes[x_axis]) is None for c in cells):
        return None
    series = _series(cells, x_axis)
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.4), squeeze=False, sharey=True)
    drawn = False
    for ax, (name, group) in zip(axes[0], series.items()):
        for i in range(layers):
            key = f"attn/L{i}/{stat}"
            pts = sorted((_numeric(c.axes[x_axis]), c.mean(key), c.std(key)) for c in group if c.mean(key) is not None)
            if pts:
                xs, ys, es = zip(*pts)
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"layer {i}")
                drawn = True
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(short(x_axis))
        ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    axes[0][0].set_ylabel(stat)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def max_logit_over_training(cells: list[Cell], path: Path) -> Path | None:
    """Max over layers of the max logit, against the step, one line per cell (its first finished seed only)."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    drawn = False
    for cell in cells:
        run = next(iter(cell.ok_runs), None)
        points = read_history(run.dir) if run else []
        if not points:
            continue
        steps = [p["step"] for p in points]
        values = [max(v for k, v in p.items() if k.endswith("/max_logit")) for p in points]
        ax.plot(steps, values, label=cell.label)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("max logit (max over layers)")
    ax.set_yscale("symlog")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


EXTREME_PANELS = {"sink_mass_dormant": "first-token weight, dormant queries", "value_drain": "value drain ||v_0|| / ||v_t||",
                  "residual_peak": "residual peak ||h_0|| / ||h_t||"}


def extreme_tokens_over_training(cells: list[Cell], path: Path, layer: int = 0) -> Path | None:
    """When a sink forms: layer ``layer``'s dormant first-token weight, value drain and residual peak
    against the step, one colour per cell and one line per seed (every seed drawn); None if no run
    recorded them (a task without query classes)."""
    fig, axes = plt.subplots(1, len(EXTREME_PANELS), figsize=(4.2 * len(EXTREME_PANELS), 3.4), squeeze=False)
    drawn = False
    for colour, cell in enumerate(cells):
        for seed, run in enumerate(cell.ok_runs):
            points = [p for p in read_history(run.dir) if f"attn/L{layer}/sink_mass_dormant" in p]
            if not points:
                continue
            drawn = True
            for ax, stat in zip(axes[0], EXTREME_PANELS):
                ax.plot([p["step"] for p in points], [p[f"attn/L{layer}/{stat}"] for p in points], color=f"C{colour}",
                        lw=0.9, alpha=0.8, label=cell.label if seed == 0 else None)
    if not drawn:
        plt.close(fig)
        return None
    for ax, (stat, title) in zip(axes[0], EXTREME_PANELS.items()):
        ax.set_xlabel("step")
        ax.set_title(f"L{layer}: {title}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].axhline(0.3, color="k", lw=0.6, ls="--")  # Gu et al.'s sink threshold
    axes[0][-1].legend(fontsize=6)
    return _save(fig, path)


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
                ax.plot([p["step"] for p in points], [p[f"attn/{layer}/{stat}"] for p in points], style,
                        color=f"C{i}", label=f"{label} {layer}")
    for ax, stat in zip(axes[0], stats):
        ax.set_xlabel("step")
        ax.set_title(stat, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, ncol=2)
    return _save(fig, path)


HEAD_PANELS = {"repeat_acc": "copying accuracy on the probe", "induction_max": "induction score (best head of L{i})",
               "induction_knockout_all_heads": "knockout, all heads of L{i}"}


def heads_over_training(histories: dict[str, list[list[dict]]], path: Path) -> Path | None:
    """The head analysis' history of every seed of each cell ({cell label: [history per seed]}, one
    colour per cell): copying accuracy, then per layer the best induction score and the knockout of
    the whole layer, against the step; None if no run has one. Every seed is drawn, so a seed that
    never makes the phase change shows as its own flat line."""
    histories = {label: runs for label, runs in histories.items() if runs}
    if not histories:
        return None
    fig, axes = plt.subplots(1, len(HEAD_PANELS), figsize=(4.2 * len(HEAD_PANELS), 3.4), squeeze=False)
    for colour, (label, runs) in enumerate(histories.items()):
        for seed, history in enumerate(runs):
            steps = [p["step"] for p in history]
            axes[0][0].plot(steps, [p["repeat_acc"] for p in history], color=f"C{colour}", lw=1 if len(runs) == 1 else 0.8,
                            label=label if seed == 0 else None)
            for ax, stat in zip(axes[0][1:], list(HEAD_PANELS)[1:]):
                layers = sorted({k.split("/")[0] for k in history[-1] if k.startswith("L") and k.endswith(f"/{stat}")})
                for style, layer in zip(["-", "--", ":", "-."], layers):
                    ax.plot(steps, [p.get(f"{layer}/{stat}") for p in history], style, color=f"C{colour}", lw=0.8)
    for ax, title in zip(axes[0], HEAD_PANELS.values()):
        ax.set_xlabel("step")
        ax.set_title(title.replace("L{i}", "each layer") + (" (solid L0, dashed L1, ...)" if "{i}" in title else ""), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    return _save(fig, path)
