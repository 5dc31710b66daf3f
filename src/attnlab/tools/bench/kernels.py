"""Kernel benchmark: one causal attention, forward and forward+backward, per backend and sequence length.

Time (median and range of repeats), FLOP/s and its fraction of this machine's matmul rate
measured in the same run, and peak tensor memory. The FLOP count is the useful work of causal
attention, the same for every backend (FlashAttention's benchmark convention): 4 B T^2 H d for
QK^T and PV, halved for the causal mask, backward counted as 2.5x forward. An explicit kernel
computes the masked half as well, so its rate here is what it delivers, not what it executes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.attention import DEFAULT_SCALING, attend, static_scale
from attnlab.attention.backends import flash_attn_package
from attnlab.tools.bench.timing import measure, median_and_range
from attnlab.util.errors import AttnlabError
from attnlab.util.profiling import peak_bytes

BACKWARD_FACTOR = 2.5  # backward = 2.5 x forward FLOPs (two matmuls for dV/dP, two for dQ/dK, plus recompute)


def attention_flops(
    batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True, backward: bool = False
) -> float:
    """FLOPs of attention: 4 B T^2 H d (QK^T and PV, 2 per multiply-add), /2 if causal, x3.5 with backward."""
    flops = 4.0 * batch * seq_len**2 * heads * head_dim
    if causal:
        flops /= 2
    return flops * (1 + BACKWARD_FACTOR) if backward else flops


class MatmulProbe:
    """GFLOP/s of an n x n matmul: the rate this machine's BLAS sustains, our yardstick for attention.

    Measured once at the start for the record and again right before every kernel row, so each
    row's fraction compares two measurements taken under the same load (the machine is shared).
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, n: int):
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.device, self.n = device, n
        self.a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        self.b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)

    def measure(self, repeats: int = 5, warmup: int = 2) -> dict[str, float]:
        seconds = measure(lambda: self.a @ self.b, self.device, repeats=repeats, warmup=warmup, min_sample_s=0.1)
        rates = [2.0 * self.n**3 / s / 1e9 for s in seconds]
        return {"n": self.n, "dtype": str(self.a.dtype).removeprefix("torch."), **median_and_range(rates)}


def matmul_peak_gflops(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> dict[str, float]:
    """Median and range of an n x n matmul's GFLOP/s (see MatmulProbe)."""
    return MatmulProbe(device, dtype, n).measure(repeats)


@dataclass(frozen=True)
class KernelPlan:
    """What to run: shapes, and which sequence lengths are timed and which only measured for memory."""

    timed_seq_lens: tuple[int, ...]
    memory_seq_lens: tuple[int, ...]
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    dtype: torch.dtype = torch.float32
    repeats: int = 5
    warmup: int = 1
    min_sample_s: float = 0.05
    causal: bool = True
    matmul_n: int = 1024  # the yardstick measured beside every timed row

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.timed_seq_lens) | set(self.memory_seq_lens)))


def kernel_variants(device: torch.device) -> dict[str, Callable]:
    """Benchmark rows: the four backends, plus PyTorch's own flash kernel on CUDA when ``flash`` means flash_attn."""
    variants: dict[str, Callable] = {
        name: functools.partial(attend, name) for name in ("naive", "scaled", "sdpa", "flash")
    }
    if device.type == "cuda" and flash_attn_package() is not None:

        def torch_flash(q, k, v, scale, causal=True):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), "sdpa:flash"

        variants["flash_torch"] = torch_flash
    return variants


def _scale_for(backend: str, head_dim: int) -> float:
    return static_scale(DEFAULT_SCALING.get(backend, "inv_sqrt_d"), head_dim)


def _available_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _too_big(backend: str, plan: KernelPlan, seq_len: int, device: torch.device) -> str | None:
    """Refuse an explicit kernel whose T x T matrices would crowd a shared CPU machine (CUDA reports OOM itself)."""
    if device.type != "cpu" or backend not in ("naive", "scaled"):
        return None
    elem = torch.tensor([], dtype=plan.dtype).element_size()
    need = 6 * plan.batch * plan.heads * seq_len**2 * elem  # logits, mask fill, probs and their grads, with slack
    avail = _available_bytes()
    if avail is not None and need > 0.6 * avail:
        return f"skipped: needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"
    return None


def _is_oom(err: BaseException) -> bool:
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def empty_row(name: str, seq_len: int, plan: KernelPlan, timed: bool, error: str | None = None) -> dict:
    return {
        "backend": name,
        "T": seq_len,
        "batch": plan.batch,
        "heads": plan.heads,
        "head_dim": plan.head_dim,
        "dtype": str(plan.dtype).removeprefix("torch."),
        "kernel": None,
        "timed": timed,
        "fwd_ms": None,
        "fwd_ms_range": None,
        "fwd_bwd_ms": None,
        "fwd_bwd_ms_range": None,
        "fwd_gflops": None,
        "gflops": None,
        "matmul_gflops": None,
        "peak_fraction": None,
        "peak_bytes": None,
        "fwd_peak_bytes": None,
        "error": error,
    }


def bench_one(name: str, kernel: Callable, seq_len: int, plan: KernelPlan, device: torch.device, timed: bool) -> dict:
    """One row: kernel name, fwd and fwd+bwd time, GFLOP/s, peak bytes (fwd+bwd) and forward-only peak bytes."""
    row = empty_row(name, seq_len, plan, timed)
    skip = _too_big(name, plan, seq_len, device)
    if skip:
        row["error"] = skip
        return row
    gen = torch.Generator(device="cpu").manual_seed(seq_len)
    shape = (plan.batch, plan.heads, seq_len, plan.head_dim)
    q, k, v = [torch.randn(shape, generator=gen).to(device, plan.dtype).requires_grad_() for _ in range(3)]
    grad_out = torch.randn(shape, generator=gen).to(device, plan.dtype)
    scale = _scale_for(name, plan.head_dim)

    def clear_grads():
        q.grad = k.grad = v.grad = None

    def forward():
        with torch.no_grad():
            return kernel(q, k, v, scale, causal=plan.causal)

    def forward_backward():
        clear_grads()
        out, _ = kernel(q, k, v, scale, causal=plan.causal)
        out.backward(grad_out)

    try:
        row["kernel"] = forward()[1]
        if timed:
            fwd = median_and_range(measure(forward, device, plan.repeats, plan.warmup, plan.min_sample_s))
            fwd_bwd = median_and_range(measure(forward_backward, device, plan.repeats, plan.warmup, plan.min_sample_s))
            row.update(
                fwd_ms=fwd["median"] * 1e3,
                fwd_ms_range=[fwd["min"] * 1e3, fwd["max"] * 1e3],
                fwd_bwd_ms=fwd_bwd["median"] * 1e3,
                fwd_bwd_ms_range=[fwd_bwd["min"] * 1e3, fwd_bwd["max"] * 1e3],
                fwd_gflops=attention_flops(plan.batch, plan.heads, seq_len, plan.head_dim, plan.causal)
                / fwd["median"]
                / 1e9,
                gflops=attention_flops(plan.batch, plan.heads, seq_len, plan.head_dim, plan.causal, backward=True)
                / fwd_bwd["median"]
                / 1e9,
            )
        elif seq_len <= 2048:
            forward_backward()  # warm-up, so one-time buffers are not counted (negligible at large T, and costly)
        clear_grads()
        row["fwd_peak_bytes"] = peak_bytes(forward, device)
        row["peak_bytes"] = peak_bytes(forward_backward, device)
    except AttnlabError as err:
        row["error"] = str(err)
    except (RuntimeError, MemoryError) as err:
        if not _is_oom(err):
            raise
        row["error"] = "out of memory"
    finally:
        q = k = v = grad_out = None  # drop the inputs before the next T (the closures above are done with them)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def run_kernels(
    plan: KernelPlan,
    device: torch.device,
    log: Callable[[str], None] = print,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Every variant at every sequence length.

    Backends alternate within each T (shortest T first), so a change in the machine's load hits
    them alike; beside each timed row the matmul yardstick is measured again and the row's
    ``peak_fraction`` is its fwd+bwd GFLOP/s over that. A variant that runs out of memory stops growing.
    ``on_row`` sees each row as soon as it is measured (gpu-check saves it then: a later error or a
    kill keeps it).
    """
    rows, failed = [], set()
    probe = MatmulProbe(device, plan.dtype, plan.matmul_n)
    variants = kernel_variants(device)
    for seq_len in plan.seq_lens:
        timed = seq_len in plan.timed_seq_lens
        for name, kernel in variants.items():
            if name in failed:
                rows.append(empty_row(name, seq_len, plan, timed, "skipped: a shorter T failed"))
                if on_row is not None:
                    on_row(rows[-1])
                continue
            row = bench_one(name, kernel, seq_len, plan, device, timed=timed)
            if row["gflops"]:
                row["matmul_gflops"] = probe.measure(repeats=3, warmup=1)["median"]
                row["peak_fraction"] = row["gflops"] / row["matmul_gflops"]
            rows.append(row)
            if row["error"] and ("memory" in row["error"] or row["error"].startswith("skipped")):
                failed.add(name)
            log(_row_line(row))
            if on_row is not None:
                on_row(row)
    return rows


def _row_line(row: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v:9.2f}"

    mib = "-" if row.get("peak_bytes") is None else f"{row['peak_bytes'] / 2**20:8.1f}"
    frac = "" if row.get("peak_fraction") is None else f"  {row['peak_fraction'] * 100:.0f}% of matmul"
    tail = frac + (f"  ({row['error']})" if row.get("error") else "")
    return (
        f"  kernel {row['backend']:<11} T={row['T']:<6} fwd {ms(row['fwd_ms'])} ms  fwd+bwd {ms(row['fwd_bwd_ms'])} ms"
        f"  peak {mib} MiB  [{row['kernel']}]{tail}"
    )
