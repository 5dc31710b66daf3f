"""How a report prints numbers: a mean to the precision its seeds support, an interval, a p value.

The std (or an interval's half-width) is shown to two significant digits and the mean rounded to the
same decimal place, so a reader never sees digits that seed noise makes meaningless ("9600 ± 360").
These are the templates' filters; the statistics themselves are attnlab.studies.stats.
"""

from __future__ import annotations

import math

from ..stats import wilson


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


def _fixed(value: float, places: int, sign: str = "") -> str:
    return f"{round(value, places) + 0.0:{sign}.{max(places, 0)}f}"  # + 0.0 turns -0.0 into 0.0


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


def mean_ci(mean: float | None, interval: tuple[float, float] | None = None, scale: float = 1.0) -> str:
    """ "mean [lo, hi]" to the interval's precision; the mean alone without an interval, "-" without a value."""
    if mean is None or not math.isfinite(mean):
        return "-"
    if interval is None or not interval[1] > interval[0]:
        return plain(mean * scale)
    lo, hi = interval[0] * scale, interval[1] * scale
    places = std_decimals((hi - lo) / 2)
    return f"{_fixed(mean * scale, places)} [{_fixed(lo, places)}, {_fixed(hi, places)}]"


def signed_ci(diff: float, lo: float | None = None, hi: float | None = None) -> str:
    """A difference with its 95 % interval, "+0.115 [+0.103, +0.127]"; the difference alone without one."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return f"{diff:+.3f}"
    places = max(std_decimals((hi - lo) / 2), 0)
    return f"{_fixed(diff, places, '+')} [{_fixed(lo, places, '+')}, {_fixed(hi, places, '+')}]"


def p_text(p: float | None) -> str:
    return "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.2g}"


def k_of_n_text(k: int, n: int, unit: str = "seeds") -> str:
    """'8 of 10 seeds (95 % Wilson interval 0.49-0.94)': a bimodal outcome as a count with its uncertainty."""
    lo, hi = wilson(k, n)
    return f"{k} of {n} {unit} (95 % Wilson interval {lo:.2f}-{hi:.2f})"


def head_type_text(counts: dict[str, list[int]]) -> str:
    """{type: heads per seed} -> 'induction 1 (2/3 seeds), content 1' (mean heads per seed), as the claims quote it."""
    parts = []
    for kind, per_seed in sorted(counts.items(), key=lambda kv: -sum(kv[1])):
        having = sum(n > 0 for n in per_seed)
        share = f" ({having}/{len(per_seed)} seeds)" if having < len(per_seed) else ""
        parts.append(f"{kind} {sum(per_seed) / len(per_seed):.3g}{share}")
    return ", ".join(parts) or "-"
