"""How peak memory grows with sequence length. The measurement itself is ``attnlab.profiling.peak_bytes``
(CPU: profiler allocation events summed in time order; CUDA: the allocator's peak counter)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from ..profiling import peak_bytes

__all__ = ["fit_exponent", "peak_bytes"]


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x): the p in y ~ c x^p."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len(pairs) < 2:
        return math.nan
    mx = sum(p[0] for p in pairs) / len(pairs)
    my = sum(p[1] for p in pairs) / len(pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    if sxx == 0:
        return math.nan
    return sum((x - mx) * (y - my) for x, y in pairs) / sxx
