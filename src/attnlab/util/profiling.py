"""Peak tensor memory of a piece of work, on CPU and CUDA.

CPU: every allocation and free is recorded by ``torch.profiler`` (profile_memory=True); summing
them in time order gives the running total of tensor memory, and its maximum is the peak above
the level at the start. psutil's RSS is too coarse (allocator caching, page granularity) and
tracemalloc does not see tensor storage. CUDA: the caching allocator's own peak counter.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

# c10's CPU allocator logs this (the first time, then every 1000th) when a block allocated before the
# profiler started is freed inside its window: every measured training step frees the previous step's
# gradients. The peak counts the window's own allocations, so the line says nothing about the number
# and nothing a user can change; it is a C++ log, out of reach of Python's warning filters.
UNKNOWN_BLOCK = "Memory block of unknown size was allocated before the profiling started"


@contextmanager
def stderr_without(*fragments: str):
    """File descriptor 2 held in a temp file while the block runs, then written back without the lines
    that hold one of ``fragments`` (without any line when none is given). At the descriptor because the
    profiler's C++ side writes there directly."""
    drop = [f.encode() for f in fragments]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held if drop and not any(f in line for f in drop)]
            if kept:
                os.write(2, b"".join(kept))


class PeakMemory:
    """``with PeakMemory(device) as m: work()`` then ``m.peak_bytes``: peak tensor bytes above the start level."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes: int | None = None
        self.cuda_max_allocated: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            # the window's stderr comes back at __exit__ without the allocator's line; the profiler's own
            # start and stop lines are dropped whole
            self._stderr = stderr_without(UNKNOWN_BLOCK)
            self._stderr.__enter__()
            try:
                with stderr_without():
                    self._prof.__enter__()
            except BaseException:
                self._stderr.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.cuda_max_allocated = torch.cuda.max_memory_allocated(self.device)
            self.peak_bytes = self.cuda_max_allocated - self._start
            return
        try:
            with stderr_without():
                self._prof.__exit__(*exc)
        finally:
            self._stderr.__exit__(None, None, None)
        events = [
            e
            for e in self._prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        ]
        events.sort(key=lambda e: e.start_ns())
        running = peak = 0
        for event in events:
            running += event.nbytes()
            peak = max(peak, running)
        self.peak_bytes = peak


def peak_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak tensor memory (bytes above the start level) while ``fn()`` runs."""
    with PeakMemory(device) as mem:
        fn()
    return mem.peak_bytes


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
