"""Benchmarks: what each attention backend costs (time, memory, FLOP/s) against this machine's own limits.

``python -m attnlab.bench --mode full|fast|tiny [--out DIR]`` (``make bench``) writes
``bench.json``, ``bench.md`` and log-log plots into ``reports/bench/``.
"""
from .kernels import attention_flops, matmul_peak_gflops
from .memory import fit_exponent, peak_bytes
from .timing import paired_ratios, median_and_range

__all__ = ["attention_flops", "fit_exponent", "matmul_peak_gflops", "paired_ratios", "peak_bytes", "median_and_range"]
