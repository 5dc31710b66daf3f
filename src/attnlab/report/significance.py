"""Scaled vs unscaled over seeds: is a difference in final val loss larger than seed noise?

Each cell with a scaling rule is paired with the unscaled cell (scaling=none) that has the same
values on every other axis. The test is Welch's t-test (two-sided, unequal variances): with 3 seeds
per cell a bootstrap has only 10 distinct resamples per group and gives intervals that are too
narrow, while the t-test accounts for how little 3 values say about the spread. With one seed per
cell there is no spread to compare against, and nothing is called significant.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .aggregate import Cell, short
from .numbers import mean_pm_std

SCALING_AXIS = "model.attention.scaling"
BASELINE = "none"
ALPHA = 0.05
TEST_NAME = "Welch's t-test (two-sided, unequal variances)"


@dataclass(frozen=True)
class Welch:
    t: float
    df: float
    p: float


def welch(a: list[float], b: list[float]) -> Welch | None:
    """Welch's t-test of mean(b) - mean(a); None when a group has under 2 values or both have no spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a), statistics.variance(b)
    if va == 0 and vb == 0:
        return None
    from scipy.stats import t as student_t

    sa, sb = va / len(a), vb / len(b)
    t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    return Welch(t, df, float(2 * student_t.sf(abs(t), df)))


@dataclass
class Pair:
    """One scaled cell against its unscaled twin."""

    rest: dict[str, str]  # the other axes' values
    variant: str
    unscaled: list[float]
    scaled: list[float]
    test: Welch | None

    @property
    def diff(self) -> float:
        """mean(scaled) - mean(unscaled): negative when scaling lowers the loss."""
        return statistics.fmean(self.scaled) - statistics.fmean(self.unscaled)

    @property
    def significant(self) -> bool:
        return self.test is not None and self.test.p < ALPHA

    @property
    def where(self) -> str:
        return ", ".join(f"{short(k)}={v}" for k, v in self.rest.items()) or "all"


def scaling_pairs(cells: list[Cell], axes: list[str], metric: str = "val/loss") -> list[Pair]:
    """Every (scaled, unscaled) pair of cells that agree on the other axes and both have values."""
    if SCALING_AXIS not in axes:
        return []
    others = [a for a in axes if a != SCALING_AXIS]
    base = {tuple(c.axes[a] for a in others): c for c in cells if c.axes[SCALING_AXIS] == BASELINE}
    pairs = []
    for cell in cells:
        twin = base.get(tuple(cell.axes[a] for a in others))
        if cell.axes[SCALING_AXIS] == BASELINE or twin is None:
            continue
        unscaled, scaled = twin.values(metric), cell.values(metric)
        if unscaled and scaled:
            pairs.append(Pair({a: cell.axes[a] for a in others}, cell.axes[SCALING_AXIS], unscaled, scaled, welch(unscaled, scaled)))
    return pairs


def pairs_table(pairs: list[Pair]) -> tuple[list[str], list[list[str]]]:
    header = ["where", "scaling", "val loss none", "val loss scaled", "scaled - none", "t", "df", "p", f"beyond seed noise (p < {ALPHA})"]
    body = []
    for p in pairs:
        t = p.test
        body.append([p.where, p.variant, mean_pm_std(statistics.fmean(p.unscaled), _std(p.unscaled), len(p.unscaled)),
                     mean_pm_std(statistics.fmean(p.scaled), _std(p.scaled), len(p.scaled)), f"{p.diff:+.3f}",
                     f"{t.t:.2f}" if t else "-", f"{t.df:.1f}" if t else "-", _p(t.p) if t else "-",
                     ("**yes**" if p.significant else "no") if t else f"untested ({_why_untested(p)})"])
    return header, body


def _why_untested(p: Pair) -> str:
    return "1 seed" if min(len(p.unscaled), len(p.scaled)) < 2 else "no spread: every seed gave the same value"


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else "< 0.001"


def _p_clause(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


def summary(pairs: list[Pair]) -> str:
    """The sentences the report prints about the pairs, chosen by the measured values."""
    if not pairs:
        return ""
    tested = [p for p in pairs if p.test is not None]
    seeds = sorted({min(len(p.unscaled), len(p.scaled)) for p in pairs})
    seed_text = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    if not tested and seeds[-1] < 2:
        return (f"{len(pairs)} scaled/unscaled pairs, {seed_text} seed(s) per cell: with one run per cell there is no seed noise "
                "to compare against, so no difference here is called significant; run more seeds (SEEDS=3) to test them.")
    if not tested:
        return f"{len(pairs)} scaled/unscaled pairs, {seed_text} seeds per cell, but no spread over seeds to test against: nothing is called significant."
    better = [p for p in tested if p.significant and p.diff < 0]
    worse = [p for p in tested if p.significant and p.diff > 0]
    within = [p for p in tested if not p.significant]
    lines = [f"Test: {TEST_NAME} on the final val loss, {seed_text} seeds per cell, p < {ALPHA} counts as beyond seed noise. "
             f"{len(better) + len(worse)} of {len(tested)} scaled/unscaled pairs differ beyond seed noise."]
    if better:
        lines.append("Scaling lowers the loss at " + "; ".join(_describe(p) for p in better) + ".")
    if worse:
        lines.append("Scaling raises the loss at " + "; ".join(_describe(p) for p in worse) + ".")
    if within:
        lines.append("Within seed noise at " + "; ".join(_describe(p) for p in within) + ".")
    if len(tested) > 1:
        lines.append(f"With {len(tested)} tests at {ALPHA}, about {ALPHA * len(tested):.1f} would pass by chance if no pair differed; "
                     "the t-test has little power with so few seeds, so 'within noise' is not 'no effect'.")
    untested = [p for p in pairs if p.test is None]
    if untested:
        lines.append("Not tested: " + "; ".join(f"{p.where} ({_why_untested(p)})" for p in untested) + ".")
    return " ".join(lines)


def _describe(p: Pair) -> str:
    return f"{p.where} ({p.variant} - none = {p.diff:+.3f}, {_p_clause(p.test.p)})"


def marked_cells(pairs: list[Pair]) -> set[tuple]:
    """The scaled cells (their axes as sorted items, as ``cell_key``) whose difference is beyond seed noise."""
    return {tuple(sorted({**p.rest, SCALING_AXIS: p.variant}.items())) for p in pairs if p.significant}


def cell_key(cell: Cell) -> tuple:
    return tuple(sorted(cell.axes.items()))
