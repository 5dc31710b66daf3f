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
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}" if abs(value) < 0.01 else f"{value:.{digits}f}"


def std_decimals(std: float) -> int:
    """Decimal places that show ``std`` to two significant digits (negative: round to tens, hundreds, ...)."""
    places = 1 - math.floor(math.log10(abs(std)))
    if abs(round(std, places)) >= 10 ** (2 - places):  # 0.0996 rounds to 0.10: one place fewer
        places -= 1
    return places


def _fixed(value: float, places: int) -> str:
    return f"{round(value, places) + 0.0:.{max(places, 0)}f}"  # + 0.0 turns -0.0 into 0.0


def mean_pm_std(mean: float | None, std: float | None, n: int) -> str:
    """"mean ± std" over ``n`` seeds; with one seed (or no spread measured) the mean alone."""
    if mean is None or not math.isfinite(mean):
        return "-"
    if n < 2 or std is None or not math.isfinite(std):
        return plain(mean)
    if std == 0:
        return f"{plain(mean)} ± 0"
    places = std_decimals(std)
    return f"{_fixed(mean, places)} ± {_fixed(std, places)}"
