"""The report's figures: softmax saturation, dot-product std vs d, memory vs T, Jacobian, head scores.

Small PNGs (dpi 90) so they can be committed. matplotlib runs headless (Agg).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

plt.switch_backend("agg")  # files only: no display is assumed, whatever the environment chose

DPI = 90


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path.name


def saturation(curves: dict, stds, path: Path) -> str:
    """curves: n -> (max_p list, normalised entropy list) over ``stds``."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    for n, (maxp, hnorm) in curves.items():
        a.plot(stds, maxp, marker=".", label=f"n={n}")
        b.plot(stds, hnorm, marker=".", label=f"n={n}")
    for ax, title in ((a, "mean max probability"), (b, "entropy / log n")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("logit std")
        ax.set_title(title, fontsize=10)
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _save(fig, path)


def dot_std(rows: list[dict], big: dict, path: Path) -> str:
    """std(q.k) vs d, with sqrt(d)."""
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ds = [r["d"] for r in rows]
    grid = [2 ** (i / 4) for i in range(16, 41)]
    ax.plot(grid, [math.sqrt(d) for d in grid], color="grey", lw=1, label="sqrt(d)")
    ax.plot(ds, [r["std"] for r in rows], "o", label="source code, 2000 pairs")
    ax.plot(list(big), [v * math.sqrt(d) for d, v in big.items()], "x", label="large sample")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("d")
    ax.set_ylabel("std(q.k)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def memory(rows: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ts = [r["T"] for r in rows]
    styles = (
        ("naive", "naive (explicit T x T)", "-", "o"),
        ("sdpa", "SDPA", "-", "s"),
        ("flash", "flash (forced)", "--", "x"),
    )
    for kind, label, ls, marker in styles:  # on CPU SDPA picks its flash kernel: the dashed line lies on SDPA's
        ax.plot(ts, [r[kind] / 2**20 for r in rows], ls=ls, marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("peak MiB (CPU, fwd+bwd)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def jacobian(rows: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    stds = [r["logit_std"] for r in rows]
    ax.plot(stds, [r["jac_fro"] for r in rows], marker="o", label="||diag(p) - pp^T||_F")
    ax.plot(stds, [r["grad_norm"] for r in rows], marker="s", label="||J g||, g ~ N(0, I)")
    ax.plot(stds, [1 - r["max_p"] for r in rows], marker=".", ls=":", label="1 - max p")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("logit std")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)
