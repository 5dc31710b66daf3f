"""Every test and interval the reports print, as thin calls into scipy.stats.

One module so a reviewer can check each number against scipy's documentation: Welch's t-test with
its interval (``ttest_ind(equal_var=False)``, ``ttest_ind_from_stats`` where only a cell's mean, std
and count exist), the one-sample t-test, t intervals, Wilson intervals for k of n, Holm's step-down
correction, and the smallest difference a pair of cells could detect (two-sided, 80 % power).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class Contrast:
    """level minus reference: the difference, its (1 - alpha) interval, the two-sided p, Welch's df,
    the seed counts, and the smallest true difference these seeds detect with 80 % power."""

    diff: float
    lo: float
    hi: float
    p: float
    df: float
    n_ref: int
    n_level: int
    detectable: float
    std_ref: float = math.nan
    std_level: float = math.nan

    def seeds_needed(self, difference: float) -> int | None:
        """Seeds a side at which a difference of ``difference`` is detectable, at these cells' spread."""
        return seeds_needed(self.std_ref, self.std_level, difference)

    def resolved(self, p_adjusted: float | None = None, alpha: float = ALPHA) -> bool:
        """Beyond seed noise: the (adjusted, when given) p is below alpha."""
        p = self.p if p_adjusted is None else p_adjusted
        return bool(p < alpha)


def _finite(values: Sequence[float]) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    return a[np.isfinite(a)]


def t_power(noncentrality: float, df: float, alpha: float = ALPHA) -> float:
    """The power of a two-sided t test at ``alpha`` with ``df`` degrees of freedom, where the true effect
    is ``noncentrality`` standard errors: the noncentral t's mass beyond the critical values (scipy.stats.nct)."""
    crit = stats.t.ppf(1 - alpha / 2, df)
    # the lower tail as the upper tail of the mirrored distribution: nct.cdf is NaN far out in its tail
    # (a gap of many standard errors), where nct.sf returns the same value finitely
    return float(stats.nct.sf(crit, df, noncentrality) + stats.nct.sf(crit, df, -noncentrality))


def detectable(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true effect a two-sided t test of this standard error and df finds with ``power``."""
    if not (math.isfinite(se) and math.isfinite(df)):
        return math.nan
    if se == 0:
        return 0.0
    gap = lambda nc: t_power(nc, df, alpha) - power  # noqa: E731
    high = stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df) + 1  # the t approximation, plus a margin
    while gap(high) < 0:
        high *= 2
    return float(optimize.brentq(gap, 0.0, high, xtol=1e-10) * se)


def welch_power(
    difference: float, std_ref: float, n_ref: int, std_level: float, n_level: int, alpha: float = ALPHA
) -> float:
    """The power of a two-sided Welch test at ``alpha`` to find a true difference ``difference`` with these
    seed counts, were the cells' spread what ``std_ref`` and ``std_level`` estimate (``t_power`` at
    Welch's df)."""
    se, df = _welch_se_df(std_ref, n_ref, std_level, n_level)
    if not math.isfinite(se) or not math.isfinite(df):
        return math.nan
    if se == 0:
        return 1.0 if difference else alpha
    return t_power(abs(difference) / se, df, alpha)


def detectable_difference(
    std_ref: float, n_ref: int, std_level: float, n_level: int, alpha: float = ALPHA, power: float = POWER
) -> float:
    """The smallest true difference a two-sided Welch test at ``alpha`` finds with ``power``. With 2-3 seeds
    it is the honest size of "no difference": a smaller effect could be there unseen."""
    return detectable(*_welch_se_df(std_ref, n_ref, std_level, n_level), alpha, power)


def seeds_needed(
    std_ref: float, std_level: float, difference: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """The fewest seeds a side (at least 2) at which a two-sided Welch test finds a true difference of
    ``difference`` with ``power`` (``welch_power``), were the cells' spread what ``std_ref`` and
    ``std_level`` estimate; None where the spread is unknown.

    The normal approximation's count is a lower bound (t quantiles exceed z), so the search starts there.
    """
    if not (math.isfinite(std_ref) and math.isfinite(std_level)) or difference <= 0:
        return None
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n = max(2, math.ceil(z**2 * (std_ref**2 + std_level**2) / difference**2))
    while welch_power(difference, std_ref, n, std_level, n, alpha) < power:
        n += 1
    return n


def _welch_se_df(s1: float, n1: int, s2: float, n2: int) -> tuple[float, float]:
    if n1 < 2 or n2 < 2:
        return math.nan, math.nan
    v1, v2 = s1**2 / n1, s2**2 / n2
    se = math.sqrt(v1 + v2)
    if se == 0:
        return 0.0, float(n1 + n2 - 2)
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
    return se, df


def welch(reference: Sequence[float], level: Sequence[float], alpha: float = ALPHA) -> Contrast | None:
    """Welch's two-sample t-test of mean(level) - mean(reference); None below two values a side."""
    ref, lvl = _finite(reference), _finite(level)
    if len(ref) < 2 or len(lvl) < 2:
        return None
    res = stats.ttest_ind(lvl, ref, equal_var=False)
    ci = res.confidence_interval(confidence_level=1 - alpha)
    return Contrast(
        diff=float(lvl.mean() - ref.mean()),
        lo=float(ci.low),
        hi=float(ci.high),
        p=float(res.pvalue),
        df=float(res.df),
        n_ref=len(ref),
        n_level=len(lvl),
        detectable=detectable_difference(ref.std(ddof=1), len(ref), lvl.std(ddof=1), len(lvl), alpha),
        std_ref=float(ref.std(ddof=1)),
        std_level=float(lvl.std(ddof=1)),
    )


def welch_from_stats(
    mean_ref: float,
    std_ref: float,
    n_ref: int,
    mean_level: float,
    std_level: float,
    n_level: int,
    alpha: float = ALPHA,
) -> Contrast | None:
    """Welch's test from two cells' mean, sample std and count, where the per-seed values are not kept."""
    if n_ref < 2 or n_level < 2:
        return None
    res = stats.ttest_ind_from_stats(mean_level, std_level, n_level, mean_ref, std_ref, n_ref, equal_var=False)
    se, df = _welch_se_df(std_ref, n_ref, std_level, n_level)
    diff = mean_level - mean_ref
    half = float(stats.t.ppf(1 - alpha / 2, df) * se) if se > 0 else 0.0
    return Contrast(
        diff=float(diff),
        lo=float(diff - half),
        hi=float(diff + half),
        p=float(res.pvalue) if se > 0 else (1.0 if diff == 0 else 0.0),
        df=float(df),
        n_ref=int(n_ref),
        n_level=int(n_level),
        detectable=detectable_difference(std_ref, n_ref, std_level, n_level, alpha),
        std_ref=float(std_ref),
        std_level=float(std_level),
    )


def t_interval(values: Sequence[float], confidence: float = 1 - ALPHA) -> tuple[float, float, float]:
    """(mean, lo, hi): the t interval of the mean; lo = hi = mean for a single value."""
    a = _finite(values)
    if len(a) == 0:
        return math.nan, math.nan, math.nan
    mean = float(a.mean())
    if len(a) < 2:
        return mean, mean, mean
    sem = float(stats.sem(a))
    if sem == 0:
        return mean, mean, mean
    lo, hi = stats.t.interval(confidence, len(a) - 1, loc=mean, scale=sem)
    return mean, float(lo), float(hi)


def t_interval_from_stats(mean: float, std: float, n: int, confidence: float = 1 - ALPHA) -> tuple[float, float]:
    """The t interval of a mean known only by its sample std and count."""
    if n < 2 or not math.isfinite(std) or std == 0:
        return mean, mean
    lo, hi = stats.t.interval(confidence, n - 1, loc=mean, scale=std / math.sqrt(n))
    return float(lo), float(hi)


def wilson(k: int, n: int, confidence: float = 1 - ALPHA) -> tuple[float, float]:
    """Wilson's score interval of a proportion k of n (``binomtest(...).proportion_ci("wilson")``)."""
    if n == 0:
        return 0.0, 1.0
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment over the p-values that are not None (which stay None)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (len(idx) - rank) * pvalues[i]))
        out[i] = running
    return out


def interaction(
    cells: Sequence[tuple[float, float, int, int]], alpha: float = ALPHA, power: float = POWER
) -> Contrast | None:
    """A contrast of cell means, sum of sign * mean over (mean, sample std, count, sign) cells, e.g. the
    difference of two differences (+1, -1, -1, +1): Welch's t with the Welch-Satterthwaite df of the
    cells' variances, the t interval and the detectable size. None when a cell has under two values."""
    if any(n < 2 for _, _, n, _ in cells):
        return None
    terms = [std**2 / n for _, std, n, _ in cells]
    se = math.sqrt(sum(terms))
    diff = float(sum(sign * mean for mean, _, _, sign in cells))
    if se == 0:
        return None
    df = sum(terms) ** 2 / sum(v**2 / (n - 1) for v, (_, _, n, _) in zip(terms, cells))
    half = float(stats.t.ppf(1 - alpha / 2, df) * se)
    return Contrast(
        diff=diff,
        lo=diff - half,
        hi=diff + half,
        p=float(2 * stats.t.sf(abs(diff / se), df)),
        df=float(df),
        n_ref=sum(n for _, _, n, sign in cells if sign < 0),
        n_level=sum(n for _, _, n, sign in cells if sign > 0),
        detectable=detectable(se, df, alpha, power),
    )
