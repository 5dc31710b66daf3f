"""Wall-clock timing that means the same thing on CPU and CUDA: warm-up, repeats, median and range.

CUDA kernels run asynchronously, so there each sample is bracketed by CUDA events and read after a
synchronize; on CPU ``time.perf_counter`` around the call is exact. A sample of a very short call
averages several back-to-back calls, so timer resolution and Python overhead do not dominate it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device: torch.device, calls: int = 1) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn``."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def measure(
    fn: Callable[[], object],
    device: torch.device,
    repeats: int = 5,
    warmup: int = 1,
    min_sample_s: float = 0.0,
) -> list[float]:
    """``repeats`` samples of seconds per call, after ``warmup`` calls.

    The warm-up call also sizes the samples: a call shorter than ``min_sample_s`` is repeated
    within one sample until the sample lasts about that long.
    """
    first = math.inf
    for _ in range(max(1, warmup)):
        first = min(first, time_calls(fn, device))
    calls = 1 if first >= min_sample_s else min(1000, math.ceil(min_sample_s / max(first, 1e-7)))
    return [time_calls(fn, device, calls) for _ in range(repeats)]


def median_and_range(values: Sequence[float]) -> dict[str, float]:
    """Median and range of repeated measurements (the median resists a neighbour's burst of load)."""
    values = [float(v) for v in values]
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, float]:
    """Summary of a_i / b_i over pairs measured side by side (load drift cancels within a pair)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired_ratios needs equal lengths, got {len(numerators)} and {len(denominators)}")
    return median_and_range([a / b for a, b in zip(numerators, denominators)])


def against_target(low: float, high: float, target: float) -> str:
    """A target ("at most ``target``") read with the spread of the repeats, [low, high]: "met" when
    every repeat is within it, "missed" when none is, "open" when the repeats fall on both sides.
    This machine switches speeds between processes; a median on one side of the target, with
    repeats on the other, is no finding either way."""
    return "met" if high <= target else "missed" if low > target else "open"
