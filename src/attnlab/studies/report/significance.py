"""Scaled vs unscaled over seeds: is a difference in final val loss larger than seed noise?

Each cell with a scaling rule is paired with the unscaled cell (scaling=none) that has the same
values on every other axis. The test is Welch's t-test (two-sided, unequal variances): with 3 seeds
per cell a bootstrap has only 10 distinct resamples per group and gives intervals that are too
narrow, while the t-test accounts for how little 3 values say about the spread. With one seed per
cell there is no spread to compare against, and nothing is called significant.

A table runs a family of tests, one per pair, so a pair counts as beyond seed noise only when its
Holm-corrected p (Holm 1979: the k-th smallest of m p values times m - k + 1, kept monotone) is below
ALPHA; the raw p is printed beside it. A study that crosses axes (sinks: data.bos x escape slot) also
gets each axis's effect pooled over the others (``factor_effects``: a stratified Welch test, the
difference averaged over the strata), which the pairs alone would hide. A mechanism that forms in some
seeds only is reported as k of n with a Wilson interval (``k_of_n_text``), not as a mean.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .aggregate import Cell, short

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


def one_sample(diffs: list[float]) -> dict:
    """Mean of per-seed differences with its 95 % t interval and two-sided p against 0 (None when
    there is no spread to test: one seed, or every seed the same)."""
    n, mean = len(diffs), statistics.fmean(diffs)
    if n < 2 or statistics.stdev(diffs) == 0:
        return {"mean": mean, "ci": [mean, mean] if n else None, "p": None, "n": n}
    from scipy.stats import t as student_t

    se = statistics.stdev(diffs) / math.sqrt(n)
    half = t_critical(n - 1) * se
    return {"mean": mean, "ci": [mean - half, mean + half], "p": float(2 * student_t.sf(abs(mean / se), n - 1)), "n": n}


def t_critical(df: float, alpha: float = ALPHA) -> float:
    """The two-sided critical value of Student's t: |t| beyond it has p < alpha."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(1 - alpha / 2, df))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-adjusted p values (None stays None): reject where adjusted p < alpha controls the family-wise error."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running, m = 0.0, len(tested)
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval for k successes in n trials (sound at small n and at k = 0 or n)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    return max(0.0, centre - half), min(1.0, centre + half)


def k_of_n_text(k: int, n: int, unit: str = "seeds") -> str:
    """'8 of 10 seeds (95 % Wilson interval 0.49-0.94)': a bimodal outcome as a count with its uncertainty."""
    lo, hi = wilson(k, n)
    return f"{k} of {n} {unit} (95 % Wilson interval {lo:.2f}-{hi:.2f})"


@dataclass
class Pair:
    """One scaled cell against its unscaled twin; ``p_holm`` is set over the table's family of pairs."""

    rest: dict[str, str]  # the other axes' values
    variant: str
    unscaled: list[float]
    scaled: list[float]
    test: Welch | None
    p_holm: float | None = None

    @property
    def diff(self) -> float:
        """mean(scaled) - mean(unscaled): negative when scaling lowers the loss."""
        return statistics.fmean(self.scaled) - statistics.fmean(self.unscaled)

    @property
    def significant(self) -> bool:
        """Beyond seed noise after the Holm correction over the table's pairs."""
        return self.p_holm is not None and self.p_holm < ALPHA

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
            pairs.append(
                Pair(
                    {a: cell.axes[a] for a in others},
                    cell.axes[SCALING_AXIS],
                    unscaled,
                    scaled,
                    welch(unscaled, scaled),
                )
            )
    for pair, adjusted in zip(pairs, holm([p.test.p if p.test else None for p in pairs])):
        pair.p_holm = adjusted
    return pairs


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else "< 0.001"


def _p_clause(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


@dataclass
class Effect:
    """One axis's level against its reference level, pooled over the strata of the other axes."""

    axis: str
    level: str
    reference: str
    diff: float  # mean over strata of mean(level) - mean(reference)
    strata: int
    test: Welch | None
    p_holm: float | None = None
    se: float | None = None  # of the pooled difference

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm < ALPHA

    @property
    def interval(self) -> tuple[float, float] | None:
        """The pooled difference's 95 % interval (Welch-Satterthwaite df)."""
        if self.test is None or self.se is None:
            return None
        half = t_critical(self.test.df) * self.se
        return self.diff - half, self.diff + half


def _reference(axis: str, levels: list[str]) -> str:
    """The level an axis's others are compared with: no scaling, no escape slot, off, else the first."""
    for ref in (BASELINE, "false", "False", "0"):
        if ref in levels:
            return ref
    return levels[0]


def factor_effects(cells: list[Cell], axes: list[str], metric: str = "val/loss") -> list[Effect]:
    """For a study crossing two or more axes: each axis's non-reference levels against its reference,
    the difference of cell means averaged over every combination of the other axes (a stratum), tested
    with a stratified Welch t (variance of the average from each cell's seed variance, Welch-Satterthwaite
    df). Needs every stratum at both levels with 2+ seeds; Holm-corrected over all the effects."""
    if len(axes) < 2:
        return []
    by_key = {tuple(c.axes[a] for a in axes): c for c in cells}
    effects = []
    for i, axis in enumerate(axes):
        levels = list(dict.fromkeys(c.axes[axis] for c in cells))
        ref = _reference(axis, levels)
        strata = sorted({tuple(c.axes[a] for a in axes if a != axis) for c in cells})
        for level in (lv for lv in levels if lv != ref):
            diffs, var_terms = [], []
            for stratum in strata:
                pair = [by_key.get(stratum[:i] + (lv,) + stratum[i:]) for lv in (level, ref)]
                if any(c is None for c in pair):
                    break
                values = [c.values(metric) for c in pair]
                if any(len(v) < 2 for v in values):
                    break
                diffs.append(statistics.fmean(values[0]) - statistics.fmean(values[1]))
                var_terms += [(statistics.variance(v) / len(v), len(v)) for v in values]
            else:
                k = len(strata)
                se2 = sum(v for v, _ in var_terms) / k**2
                test = None
                if se2 > 0:
                    from scipy.stats import t as student_t

                    diff = statistics.fmean(diffs)
                    df = sum(v for v, _ in var_terms) ** 2 / sum(v**2 / (n - 1) for v, n in var_terms)
                    t = diff / math.sqrt(se2)
                    test = Welch(t, df, float(2 * student_t.sf(abs(t), df)))
                effects.append(
                    Effect(axis, level, ref, statistics.fmean(diffs), k, test, se=math.sqrt(se2) if se2 > 0 else None)
                )
    for effect, adjusted in zip(effects, holm([e.test.p if e.test else None for e in effects])):
        effect.p_holm = adjusted
    return effects


@dataclass
class Contrast:
    """Two cells that differ on one axis only: ``level`` against the axis's ``reference`` level, the other
    axes at ``rest``; ``p_holm`` is set over the table's family of contrasts of one metric."""

    axis: str
    level: str
    reference: str
    rest: dict[str, str]
    ref_values: list[float]
    values: list[float]
    test: Welch | None
    p_holm: float | None = None

    @property
    def diff(self) -> float:
        """mean(level) - mean(reference)."""
        return statistics.fmean(self.values) - statistics.fmean(self.ref_values)

    @property
    def se(self) -> float | None:
        if self.test is None:
            return None
        return math.sqrt(
            statistics.variance(self.ref_values) / len(self.ref_values)
            + statistics.variance(self.values) / len(self.values)
        )

    @property
    def interval(self) -> tuple[float, float] | None:
        """Welch's 95 % interval of the difference: diff ± t_{0.975, df} · √(s_a²/n_a + s_b²/n_b)."""
        if self.test is None:
            return None
        half = t_critical(self.test.df) * self.se
        return self.diff - half, self.diff + half

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm < ALPHA

    @property
    def direction(self) -> str:
        """'higher', 'lower' (beyond seed noise after Holm), 'none' (within it) or 'untested'."""
        if self.test is None:
            return "untested"
        return ("higher" if self.diff > 0 else "lower") if self.significant else "none"

    @property
    def where(self) -> str:
        return ", ".join(f"{short(k)}={v}" for k, v in self.rest.items()) or "all"

    @property
    def why_untested(self) -> str:
        return (
            "1 seed" if min(len(self.ref_values), len(self.values)) < 2 else "no spread: every seed gave the same value"
        )


def contrasts(
    cells, axes: list[str], metric: str = "val/loss", contrast_axes: list[str] | None = None
) -> list[Contrast]:
    """The comparisons a study is run for: with a scaling axis, every scaled cell against its unscaled twin
    (``scaling_pairs``); else, per axis, every cell off the axis's reference level against the cell that
    differs from it on that axis only. Welch's test each, Holm-corrected over the family."""
    if contrast_axes is None:
        contrast_axes = [SCALING_AXIS] if SCALING_AXIS in axes else list(axes)
    by_key = {tuple(c.axes[a] for a in axes): c for c in cells}
    out = []
    for axis in contrast_axes:
        i = axes.index(axis)
        levels = list(dict.fromkeys(c.axes[axis] for c in cells))
        if len(levels) < 2:
            continue
        ref = _reference(axis, levels)
        for cell in cells:
            if cell.axes[axis] == ref:
                continue
            key = tuple(cell.axes[a] for a in axes)
            twin = by_key.get(key[:i] + (ref,) + key[i + 1 :])
            if twin is None:
                continue
            a, b = twin.values(metric), cell.values(metric)
            if a and b:
                out.append(
                    Contrast(
                        axis, cell.axes[axis], ref, {x: cell.axes[x] for x in axes if x != axis}, a, b, welch(a, b)
                    )
                )
    for c, adjusted in zip(out, holm([c.test.p if c.test else None for c in out])):
        c.p_holm = adjusted
    return out
