"""Numbers for a results table: mean ± std over seeds, printed to the precision the seeds support.

The std is shown to two significant digits and the mean rounded to the same decimal place, so a
reader never sees digits that seed noise makes meaningless ("9597 ± 357.879" reads "9600 ± 360").
"""

from __future__ import annotations

import math


def plain(value: float | None, digits: int = 3) -> str:
    """A single value (no spread known): fixed digits, scientific-style for tiny ones, none for big ones."""
    if value is None or not math.isfinite(value):
        return "-"
    return (
        f"{value:.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}" if abs(value) < 0.01 else f"{value:.{digits}f}"
    )


def std_decimals(std: float) -> int:
    """Decimal places that show ``std`` to two significant digits (negative: round to tens, hundreds, ...)."""
    places = 1 - math.floor(math.log10(abs(std)))
    if abs(round(std, places)) >= 10 ** (2 - places):  # 0.0996 rounds to 0.10: one place fewer
        places -= 1
    return places


def _fixed(value: float, places: int) -> str:
    return f"{round(value, places) + 0.0:.{max(places, 0)}f}"  # + 0.0 turns -0.0 into 0.0


def mean_pm_std(mean: float | None, std: float | None, n: int) -> str:
    """ "mean ± std" over ``n`` seeds; with one seed (or no spread measured) the mean alone."""
    if mean is None or not math.isfinite(mean):
        return "-"
    if n < 2 or std is None or not math.isfinite(std):
        return plain(mean)
    if std == 0:
        return f"{plain(mean)} ± 0"
    places = std_decimals(std)
    return f"{_fixed(mean, places)} ± {_fixed(std, places)}"


T_LEVEL = 0.975  # two-sided 95 %


def t_quantile(df: float, level: float = T_LEVEL) -> float:
    """Student's t quantile (scipy): t_{0.975, df} for a two-sided 95 % interval."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(level, df))


def mean_interval(mean: float | None, std: float | None, n: int) -> tuple[float, float] | None:
    """The t-based 95 % interval of a mean over n seeds: mean ± t_{0.975, n-1} · s / √n; None below 2 seeds."""
    if mean is None or std is None or n < 2 or not math.isfinite(mean) or not math.isfinite(std):
        return None
    half = t_quantile(n - 1) * std / math.sqrt(n)
    return mean - half, mean + half


def interval_decimals(lo: float, hi: float) -> int | None:
    """Decimal places that show the interval's half-width to two significant digits (None: no width)."""
    half = (hi - lo) / 2
    return std_decimals(half) if half > 0 and math.isfinite(half) else None


def mean_ci(mean: float | None, interval: tuple[float, float] | None, scale: float = 1.0) -> str:
    """ "mean [lo, hi]": the interval's half-width to two significant digits and the mean and bounds to the same
    place; the mean alone without an interval (one seed), "-" without a value."""
    if mean is None or not math.isfinite(mean):
        return "-"
    if interval is None:
        return plain(mean * scale)
    lo, hi = interval[0] * scale, interval[1] * scale
    places = interval_decimals(lo, hi)
    if places is None:  # every seed gave the same value
        return f"{plain(mean * scale)} [all seeds equal]"
    return f"{_fixed(mean * scale, places)} [{_fixed(lo, places)}, {_fixed(hi, places)}]"


def signed_ci(diff: float, interval: tuple[float, float] | None) -> str:
    """A difference with its 95 % interval, "+0.115 [+0.103, +0.127]"; the difference alone without one."""
    if interval is None or not all(map(math.isfinite, interval)) or interval[1] <= interval[0]:
        return f"{diff:+.3f}"
    places = max(interval_decimals(*interval), 0)
    sign = lambda v: f"{round(v, places) + 0.0:+.{places}f}"  # noqa: E731
    return f"{sign(diff)} [{sign(interval[0])}, {sign(interval[1])}]"
