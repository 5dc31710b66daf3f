"""Every test and interval the reports print, as thin calls into scipy.stats.

One module so a reviewer can check each number against scipy's documentation. Each outcome kind has
its own test, chosen by what the data are (``OUTCOMES``):

- continuous: Welch's t-test with its interval (``ttest_ind(equal_var=False)``; ``ttest_ind_from_stats``
  where only a cell's mean, std and count exist), beside the exact permutation test of the difference of
  means (``permutation_test``) where a side has ``EXACT_UP_TO`` seeds or fewer or no spread; the exact
  test decides where a side has no spread and wherever its seeds can reach alpha (``exact_decides``):
  it assumes no distribution, which two to five seeds cannot show;
- learned (reached a threshold or not): k of n with Wilson intervals, Fisher's exact test, its exact power;
- onset (the step a run learned, right-censored at its budget): Kaplan-Meier curves (``ecdf`` on
  ``CensoredData``), the median onset with its interval, the log-rank statistic with its p by
  permutation of the arm labels (exact at the few runs an arm has), its power by simulation;
- skewed ratios: the median with a bootstrap interval, the sign test and Wilcoxon's signed-rank test on
  the log ratios.

Holm's step-down correction counts every comparison of a family, untestable ones as p = 1. Planning
reads a spread no smaller than the metric's resolution and, at few seeds, its upper confidence bound.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8
EXACT_UP_TO = 5  # seeds a side at or below which a continuous contrast is tested exactly (permutation)
EXACT_ENUMERATION = 200_000  # arrangements enumerated exactly; beyond, a fixed-seed Monte Carlo
RESAMPLES = 9_999
OUTCOMES = {  # what a run's result is (question.outcome); the report names its tests by it
    "continuous": "a final value per seed",
    "learned": "learned or not: whether a run's final value reaches question.learned",
    "onset": "the step a run first reaches question.learned, censored at its budget",
    "ratio": "a ratio per seed, skewed",
}


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


def percentile_interval(values: Sequence[float], confidence: float = 1 - ALPHA) -> tuple[float, float]:
    """The percentile-bootstrap interval of the mean (``scipy.stats.bootstrap``, RESAMPLES fixed-seed
    resamples): it lies within the values' own range, so a bounded metric's interval stays in its bounds."""
    v = _finite(values)
    if len(v) < 2 or np.ptp(v) == 0:
        return float(v.mean()), float(v.mean())
    return _bootstrap(v, np.mean, confidence)


def _bootstrap(values: np.ndarray, statistic, confidence: float) -> tuple[float, float]:
    """The percentile-bootstrap interval of ``statistic`` over RESAMPLES fixed-seed resamples."""
    res = stats.bootstrap(
        (values,),
        statistic,
        confidence_level=confidence,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


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
    """Holm's step-down adjustment over a family. A comparison without a p-value (None or NaN: no test
    possible) still counts in the family's size, as p = 1, and stays None: dropping it would shrink
    the correction of the others."""
    m = len(pvalues)
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * m
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
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


# ---------------------------------------------------------------- continuous: the exact test
@dataclass(frozen=True)
class Exact:
    """The permutation test of mean(level) - mean(reference): its two-sided p and the smallest p any
    arrangement of these seed counts can give (2 / C(n_ref + n_level, n_ref) when enumerated)."""

    diff: float
    p: float
    p_min: float
    n_ref: int
    n_level: int
    enumerated: bool

    def reachable(self, alpha: float = ALPHA) -> bool:
        """Whether these seed counts can reach ``alpha`` at all."""
        return self.p_min < alpha


def exact_shown(reference: Sequence[float], level: Sequence[float]) -> bool:
    """Whether a continuous contrast gets the exact test beside Welch's: a side with EXACT_UP_TO seeds or
    fewer, or without spread."""
    ref, lvl = _finite(reference), _finite(level)
    return bool(min(len(ref), len(lvl)) <= EXACT_UP_TO or _flat(ref) or _flat(lvl))


def _flat(values: np.ndarray) -> bool:
    return len(values) > 1 and np.ptp(values) == 0


def exact_decides(reference: Sequence[float], level: Sequence[float]) -> bool:
    """Which test decides a continuous contrast: the exact test wherever it is shown (a side of EXACT_UP_TO
    seeds or fewer, or without spread), Welch's t from EXACT_UP_TO + 1 seeds a side. Below that Welch's
    false-positive rate exceeds its level where the sides' spreads differ (at 3 a side and an sd ratio of
    4, two to three times alpha at Holm's small thresholds), and a sd from so few seeds cannot show they
    do not; where the exact test cannot reach alpha, the comparison is not resolved."""
    ref, lvl = _finite(reference), _finite(level)
    return min(len(ref), len(lvl)) >= 2 and exact_shown(ref, lvl)


def exact_seeds_for(comparisons: int, alpha: float = ALPHA) -> int:
    """Seeds a side at which an exact two-sample test can reach ``alpha`` after Holm over ``comparisons``
    (its smallest p, 2 / C(2n, n), below alpha / comparisons)."""
    n = 2
    while 2 / math.comb(2 * n, n) >= alpha / max(comparisons, 1):
        n += 1
    return n


def _mean_difference(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def permutation(reference: Sequence[float], level: Sequence[float]) -> Exact | None:
    """The two-sided permutation test of the difference of means (``scipy.stats.permutation_test``,
    independent samples): exact over every arrangement where they number EXACT_ENUMERATION or fewer,
    else RESAMPLES fixed-seed resamples. None below two values a side."""
    ref, lvl = _finite(reference), _finite(level)
    if len(ref) < 2 or len(lvl) < 2:
        return None
    arrangements = math.comb(len(ref) + len(lvl), len(ref))
    enumerated = arrangements <= EXACT_ENUMERATION
    res = stats.permutation_test(
        (lvl, ref),
        _mean_difference,
        permutation_type="independent",
        vectorized=True,
        n_resamples=np.inf if enumerated else RESAMPLES,
        alternative="two-sided",
        rng=np.random.default_rng(0),
    )
    p_min = min(1.0, 2 / arrangements) if enumerated else 2 / (RESAMPLES + 1)
    return Exact(float(lvl.mean() - ref.mean()), float(res.pvalue), p_min, len(ref), len(lvl), enumerated)


# ---------------------------------------------------------------- spread for planning
def sd_upper(sd: float, n: int, confidence: float = 1 - ALPHA) -> float:
    """The one-sided upper confidence bound of a population sd from a sample sd of ``n`` values (the
    chi-square bound): at 2 seeds it is 16x the sample sd, at 3 4.4x. NaN below two values."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return float(sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1)))


PLANNING_CONFIDENCE = 0.8  # Browne (1995): plan from the sd's 80 % upper bound, so 80 % power is had 80 % of the time


def planning_sd(sd: float, n: int, resolution: float = 0.0, confidence: float = PLANNING_CONFIDENCE) -> float:
    """The spread a plan assumes: the sd's upper confidence bound, never below the metric's resolution
    (for an accuracy, one scored query): zero spread at two seeds is not a known zero."""
    upper = sd_upper(sd, n, confidence)
    return max(upper, resolution) if math.isfinite(upper) else math.nan


# ---------------------------------------------------------------- learned: k of n
@dataclass(frozen=True)
class Proportions:
    """k of n learned in the reference and in the level, with Wilson intervals and Fisher's exact p."""

    k_ref: int
    n_ref: int
    k_level: int
    n_level: int
    p: float
    ci_ref: tuple[float, float]
    ci_level: tuple[float, float]

    @property
    def diff(self) -> float:
        return self.k_level / self.n_level - self.k_ref / self.n_ref

    @property
    def p_min(self) -> float:
        """Fisher's smallest p at these counts (all of one side learned, none of the other)."""
        return fisher_p(self.n_ref, self.n_ref, 0, self.n_level)


def fisher_p(k_ref: int, n_ref: int, k_level: int, n_level: int) -> float:
    """Fisher's exact two-sided p of a 2x2 table of learned / not learned."""
    table = [[k_ref, n_ref - k_ref], [k_level, n_level - k_level]]
    return float(stats.fisher_exact(table).pvalue)


def proportions(k_ref: int, n_ref: int, k_level: int, n_level: int) -> Proportions | None:
    if n_ref < 1 or n_level < 1:
        return None
    return Proportions(
        k_ref,
        n_ref,
        k_level,
        n_level,
        fisher_p(k_ref, n_ref, k_level, n_level),
        wilson(k_ref, n_ref),
        wilson(k_level, n_level),
    )


def fisher_power(p_ref: float, p_level: float, n_ref: int, n_level: int, alpha: float = ALPHA) -> float:
    """Fisher's exact test's power, exactly: the binomial probability of every table it rejects at ``alpha``."""
    k1, k2 = np.arange(n_ref + 1), np.arange(n_level + 1)
    w1, w2 = stats.binom.pmf(k1, n_ref, p_ref), stats.binom.pmf(k2, n_level, p_level)
    return float(sum(w1[a] * w2[b] for a in k1 for b in k2 if fisher_p(int(a), n_ref, int(b), n_level) < alpha))


def fisher_seeds_needed(
    p_ref: float, p_level: float, alpha: float = ALPHA, power: float = POWER, most: int = 40
) -> int | None:
    """The fewest seeds a side at which Fisher's test finds learning probabilities ``p_ref`` against
    ``p_level`` with ``power``; None if more than ``most``."""
    for n in range(2, most + 1):
        if fisher_power(p_ref, p_level, n, n, alpha) >= power:
            return n
    return None


# ---------------------------------------------------------------- onset: censored times
@dataclass(frozen=True)
class Survival:
    """A Kaplan-Meier curve of the fraction of runs not yet learned, with its pointwise interval, and the
    median onset with its interval (None where the curve, or its band, never falls to one half)."""

    times: tuple[float, ...]  # every step a run ended at (learned or censored), ascending
    survival: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    n: int
    events: int
    cap: float  # the last step any run was followed to
    median: float | None
    median_lo: float | None
    median_hi: float | None


def censored(times: Sequence[float], censored: Sequence[bool]) -> stats.CensoredData:
    t, c = np.asarray(times, dtype=float), np.asarray(censored, dtype=bool)
    return stats.CensoredData(uncensored=t[~c], right=t[c])


def _first_at_or_below(times: np.ndarray, curve: np.ndarray, level: float = 0.5) -> float | None:
    hit = np.nonzero(curve <= level + 1e-12)[0]
    return float(times[hit[0]]) if len(hit) else None


def kaplan_meier(times: Sequence[float], censored_: Sequence[bool], confidence: float = 1 - ALPHA) -> Survival:
    """The fraction not yet learned over steps (``scipy.stats.ecdf`` on ``CensoredData``, its survival
    function, log-log interval). The median's interval is the steps where the band's lower and upper
    curves first reach one half (the band inverted, Brookmeyer and Crowley's construction)."""
    t, c = np.asarray(times, dtype=float), np.asarray(censored_, dtype=bool)
    cap = float(t.max()) if len(t) else math.nan
    if not (~c).any():  # no run learned: the curve stays at 1
        return Survival((), (), (), (), len(t), 0, cap, None, None, None)
    sf = stats.ecdf(censored(t, c)).sf
    with warnings.catch_warnings():  # the log-log band is undefined where the curve is 0 or 1: NaN, filled below
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(confidence, method="log-log")
    steps, surv = sf.quantiles, sf.probabilities
    low = np.where(np.isnan(band.low.probabilities), surv, band.low.probabilities)  # at S = 0 or 1 the band is S
    high = np.where(np.isnan(band.high.probabilities), surv, band.high.probabilities)
    return Survival(
        tuple(map(float, steps)),
        tuple(map(float, surv)),
        tuple(map(float, low)),
        tuple(map(float, high)),
        len(t),
        int((~c).sum()),
        cap,
        _first_at_or_below(steps, surv),
        _first_at_or_below(steps, low),
        _first_at_or_below(steps, high),
    )


def _logrank_statistic(labels: np.ndarray, at_risk: np.ndarray, events: np.ndarray) -> np.ndarray:
    """(O - E)^2 / V of the group marked 1 in each row of ``labels`` (arrangements x runs), with
    ``at_risk`` and ``events`` (runs x distinct event steps) the pooled runs' risk sets and events."""
    n = at_risk.sum(axis=0)
    d = events.sum(axis=0)
    n1 = labels @ at_risk
    o1 = (labels @ events).sum(axis=1)
    share = n1 / n
    e1 = (d * share).sum(axis=1)
    ties = np.where(n > 1, (n - d) / np.maximum(n - 1, 1), 0.0)  # the hypergeometric variance's tie term
    v = (d * share * (1 - share) * ties).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, (o1 - e1) ** 2 / v, 0.0)


def logrank_p(
    ref_times,
    ref_censored,
    level_times,
    level_censored,
    enumerate_up_to: int = EXACT_ENUMERATION,
    draws: int = RESAMPLES,
) -> float:
    """The log-rank statistic's two-sided p by permutation of the arm labels over the pooled runs: exact
    over every arrangement where they number EXACT_ENUMERATION or fewer, else RESAMPLES fixed-seed
    resamples (each counted with the observed one, so p >= 1/(RESAMPLES + 1)). At the few runs an arm
    has here the chi-square limit (``scipy.stats.logrank``) is not reached: it can promise a p that no
    arrangement of the runs gives. NaN where neither arm has an event."""
    ref_c, lvl_c = np.asarray(ref_censored, bool), np.asarray(level_censored, bool)
    if ref_c.all() and lvl_c.all():
        return math.nan
    times = np.concatenate([np.asarray(level_times, float), np.asarray(ref_times, float)])
    event = ~np.concatenate([lvl_c, ref_c])
    steps = np.unique(times[event])
    at_risk = (times[:, None] >= steps[None, :]).astype(float)
    events = ((times[:, None] == steps[None, :]) & event[:, None]).astype(float)
    k, total = len(lvl_c), len(times)
    observed = np.zeros((1, total))
    observed[0, :k] = 1
    stat = _logrank_statistic(observed, at_risk, events)[0]
    null = _logrank_statistic(_arrangements(total, k, enumerate_up_to, draws), at_risk, events)
    at_least = np.sum(null >= stat - 1e-9 * max(stat, 1.0))
    if math.comb(total, k) <= enumerate_up_to:
        return float(at_least / len(null))
    return float((1 + at_least) / (draws + 1))


@functools.lru_cache(maxsize=32)
def _arrangements(total: int, k: int, enumerate_up_to: int = EXACT_ENUMERATION, draws: int = RESAMPLES) -> np.ndarray:
    """Every way to mark k of ``total`` runs as one arm (rows of 0/1), or ``draws`` fixed-seed draws of
    them where they number more than ``enumerate_up_to``."""
    if math.comb(total, k) <= enumerate_up_to:
        chosen = np.array(list(itertools.combinations(range(total), k)), dtype=int).reshape(-1, k)
    else:
        chosen = np.random.default_rng(0).random((draws, total)).argsort(axis=1)[:, :k]
    labels = np.zeros((len(chosen), total))
    np.put_along_axis(labels, chosen, 1.0, axis=1)
    labels.setflags(write=False)
    return labels


def logrank_p_min(n_ref: int, n_level: int) -> float:
    """The smallest p the permutation log-rank can give at these runs an arm (its two most extreme
    arrangements, as for the permutation test of means)."""
    return min(1.0, 2 / math.comb(n_ref + n_level, n_ref))


def logrank_power(
    ref_times, ref_censored, level_times, level_censored, n: int, alpha: float = ALPHA, draws: int = 400, seed: int = 0
) -> float:
    """The log-rank test's power at ``n`` seeds a side by simulation: each arm's onsets resampled from its
    own runs (censored where they were), the test run on each draw. NaN where neither arm has an event."""
    rng = np.random.default_rng(seed)
    ref = np.column_stack([np.asarray(ref_times, float), np.asarray(ref_censored, bool)])
    lvl = np.column_stack([np.asarray(level_times, float), np.asarray(level_censored, bool)])
    if ref[:, 1].all() and lvl[:, 1].all():
        return math.nan
    hits = 0
    for _ in range(draws):  # each draw's p from at most 5,000 arrangements: enough to tell p from alpha
        a, b = ref[rng.integers(0, len(ref), n)], lvl[rng.integers(0, len(lvl), n)]
        p = logrank_p(a[:, 0], a[:, 1].astype(bool), b[:, 0], b[:, 1].astype(bool), 5_000, 1_999)
        hits += bool(math.isfinite(p) and p < alpha)
    return hits / draws


def logrank_seeds_needed(
    ref_times, ref_censored, level_times, level_censored, alpha: float = ALPHA, start: int = 2, most: int = 30
) -> int | None:
    """The fewest runs an arm (from ``start``) at which the log-rank's simulated power against the difference
    these runs show reaches POWER at ``alpha``; None beyond ``most`` (the difference is too small for a
    plan) or where neither arm has an event."""
    for n in range(max(start, 2), most + 1):
        power = logrank_power(ref_times, ref_censored, level_times, level_censored, n, alpha, draws=200)
        if math.isnan(power):
            return None
        if power >= POWER:
            return n
    return None


# ---------------------------------------------------------------- skewed ratios
@dataclass(frozen=True)
class Ratios:
    """Per-seed ratios (level over reference): their median with a percentile-bootstrap interval, how many
    lie above 1, the sign test's p and Wilcoxon's signed-rank p on the log ratios (both two-sided)."""

    n: int
    median: float
    lo: float
    hi: float
    above: int
    p_sign: float
    p_wilcoxon: float

    @property
    def p(self) -> float:
        """The verdict's p: the sign test's, which assumes neither symmetry nor a distribution."""
        return self.p_sign


MIN_RATIOS = 3  # a bootstrap of two values is those values


def ratios(values: Sequence[float], confidence: float = 1 - ALPHA) -> Ratios | None:
    """None below MIN_RATIOS finite positive ratios."""
    r = _finite(values)
    r = r[r > 0]
    if len(r) < MIN_RATIOS:
        return None
    lo, hi = _bootstrap(r, np.median, confidence)
    logs = np.log(r)
    nonzero = logs[logs != 0]
    above = int((r > 1).sum())
    p_sign = float(stats.binomtest(above, len(nonzero), 0.5).pvalue) if len(nonzero) else 1.0
    p_wilcoxon = float(stats.wilcoxon(nonzero).pvalue) if len(nonzero) else 1.0
    return Ratios(
        len(r),
        float(np.median(r)),
        lo,
        hi,
        above,
        p_sign,
        p_wilcoxon,
    )
