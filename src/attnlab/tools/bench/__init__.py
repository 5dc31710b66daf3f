"""Benchmarks: what each attention backend costs (time, memory, FLOP/s) against this machine's own limits.

``python -m attnlab.tools.bench --mode full|fast|tiny [--out DIR]`` (``make bench``) writes
``bench.json``, ``bench.md`` and log-log plots into ``reports/bench/``.

The names below are imported on first use (PEP 562): ``python -m attnlab.tools.bench.longctx`` imports
this package before its own first line and only then starts a training run, so an eager ``import
torch`` here would add torch's import to every module of the package that needs none.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "attention_flops": "kernels",
    "matmul_peak_gflops": "kernels",
    "paired_ratios": "timing",
    "median_and_range": "timing",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
