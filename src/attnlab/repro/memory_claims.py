"""Claims 6, 14 and 15: the attention matrix's memory, analytic and measured (peak bytes vs T).

Measured on this machine's CPU: fwd+bwd of one causal attention through attnlab's own backends, naive
(explicit T x T softmax) vs SDPA vs the forced FlashAttention kernel, the same step the kernel benchmark
(attnlab.tools.bench.kernels, reports/bench/bench.md) measures: q, k, v and the output gradient exist before the
count starts, and the peak is the tensor memory allocated above them. Anything beyond the measured T is
labelled extrapolation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from attnlab.attention import attend
from attnlab.repro.verdict import DETAIL, Check, Claim, Table, within
from attnlab.util.profiling import fit_exponent
from attnlab.util.profiling import peak_bytes as cpu_peak_bytes

GB, MiB = 1e9, 2**20


def _inputs(t: int, d: int, heads: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(1, heads, t, d, generator=g, requires_grad=True) for _ in range(3)]
    return qkv, torch.randn(1, heads, t, d, generator=g)


def attention_step(kind: str, t: int, d: int = 64, heads: int = 4):
    """A closure running fwd+bwd of one causal attention through attnlab's ``kind`` backend, as the kernel
    benchmark does: the output gradient is drawn beforehand, so only the step's own tensors are counted, and
    nothing the closure keeps in a local outlives the step (a held logits tensor would add a T x T matrix)."""
    (q, k, v), grad_out = _inputs(t, d, heads)

    def run():
        out, _ = attend(kind, q, k, v, 1 / math.sqrt(d), causal=True)
        out.backward(grad_out)

    return run


def peak_vs_t(ts, kinds=("naive", "sdpa", "flash"), d: int = 64, heads: int = 4) -> list[dict]:
    return [{"T": t, "d": d, **{kind: cpu_peak_bytes(attention_step(kind, t, d, heads)) for kind in kinds}} for t in ts]


def attention_matrix_bytes(batch: int, heads: int, t: int, bytes_per: int) -> int:
    """Bytes of one (batch, heads, t, t) attention matrix."""
    return batch * heads * t * t * bytes_per


# FlashAttention (Dao et al. 2022, Theorem 2): HBM accesses, N tokens, head dim d, SRAM size M (elements).
def hbm_standard(n: int, d: int) -> float:
    return n * d + n * n


def hbm_flash(n: int, d: int, m: int) -> float:
    return n * n * d * d / m


def memory_measurements(ts, d: int = 64, heads: int = 4, bench: Path | None = None) -> dict:
    """Peak bytes per kind and T, the naive peak at the largest T for three d, and (``bench``: a bench.json)
    the kernel benchmark's peaks for the same shapes, to set beside ours."""
    rows = peak_vs_t(ts, d=d, heads=heads)
    t_mid = ts[-1]
    by_d = {dd: cpu_peak_bytes(attention_step("naive", t_mid, dd, heads)) for dd in (16, 64, 256)}
    peaks = bench_peaks(bench, heads, d) if bench is not None else None
    return {"rows": rows, "naive_by_d": by_d, "t_by_d": t_mid, "heads": heads, "d": d, "bench": peaks}


def bench_peaks(path: Path, heads: int, d: int) -> dict | None:
    """The kernel benchmark's fwd+bwd peaks {backend: {T: bytes}} from its bench.json, when it measured the
    same shapes (batch 1, ``heads`` heads, head dim ``d``, float32, causal); None otherwise."""
    try:
        data = json.loads(Path(path).read_text())
        setup = data["kernel_setup"]
        shape = (setup["batch"], setup["heads"], setup["head_dim"], setup["dtype"], setup["causal"])
        if shape != (1, heads, d, "float32", True):
            return None
        peaks: dict = {}
        for r in data["kernels"]:
            if r.get("peak_bytes") is not None:
                peaks.setdefault(r["backend"], {})[int(r["T"])] = int(r["peak_bytes"])
        return {"source": str(path), "peaks": peaks, "machine": data.get("machine")}
    except (OSError, ValueError, KeyError, TypeError):  # no benchmark report, or another shape: nothing to compare
        return None


def memory_table(mem: dict) -> Table:
    rows, heads = mem["rows"], mem["heads"]
    ts = [r["T"] for r in rows]
    slopes = [fit_exponent(ts, [r[k] for r in rows]) for k in ("naive", "sdpa", "flash")]
    bench = (mem.get("bench") or {}).get("peaks", {}).get("naive", {})
    matrix = {t: attention_matrix_bytes(1, heads, t, 4) for t in ts}
    return Table(
        f"Measured CPU peak memory (MiB), fwd+bwd of one causal attention, B=1, H={heads}, d={mem['d']}, fp32",
        "T | naive | SDPA | flash (forced) | one T x T fp32 matrix x H | naive / matrix | kernel benchmark naive",
        [
            [
                r["T"],
                r["naive"] / MiB,
                r["sdpa"] / MiB,
                r["flash"] / MiB,
                matrix[r["T"]] / MiB,
                r["naive"] / matrix[r["T"]],
                bench[r["T"]] / MiB if r["T"] in bench else None,
            ]
            for r in rows
        ]
        + [["log-log slope", *slopes, 2.0, None, None]],
        note=f"Naive peak at T={mem['t_by_d']} for d = "
        + ", ".join(f"{dd}: {b / MiB:.1f} MiB" for dd, b in mem["naive_by_d"].items())
        + ". Measured with cpu_peak_bytes (profiler allocation events in time order): the tensor memory a step allocates "
        "above q, k, v and the output gradient. The last column: the kernel benchmark's peak of the same step "
        "(reports/bench/bench.md, 'peak MiB (fwd+bwd)'), where it measured the same shape.",
    )


def claim_6(mem: dict) -> Claim:
    per_layer = attention_matrix_bytes(2, 32, 4096, 2)
    total = 32 * per_layer
    last = mem["rows"][-1]
    held = last["naive"] / attention_matrix_bytes(1, mem["heads"], last["T"], 4)
    t = Table(
        "LLaMA-7B attention matrix, batch 2, 32 heads, 4096 tokens, fp16",
        "quantity | source | ours",
        [
            ["one layer's attention matrix", "2.1 GB", f"{per_layer / GB:.3f} GB = {per_layer / 2**30:.2f} GiB"],
            ["32 layers", "68 GB", f"{total / GB:.1f} GB = {total / 2**30:.1f} GiB"],
            ["naive fwd+bwd peak / one matrix (measured, CPU fp32)", "-", f"{held:.2f}"],
            ["extrapolation: naive training, one layer's T x T tensors", "-", f"about {held * per_layer / GB:.1f} GB"],
        ],
        note="The source counts one matrix per layer; all 32 layers' matrices are alive together only in training. The "
        "last row applies the measured ratio of peak to one matrix (fp32, CPU) to the fp16 LLaMA shape.",
    )
    return Claim(
        6,
        "LLaMA-7B, 4096 tokens, batch 2, 32 heads, fp16: 2.1 GB per layer for the attention matrix, 68 GB over 32 layers",
        {"per_layer_GB": 2.1, "all_layers_GB": 68},
        {"per_layer_GB": per_layer / GB, "all_layers_GB": total / GB, "naive_peak_over_one_matrix": held},
        [
            Check(
                "kv-per-layer",
                "2 x 32 x 4096^2 x 2 B per layer (GB, within 0.05)",
                per_layer / GB,
                2.1,
                within(2.1, per_layer / GB, abs_tol=0.05),
            ),
            Check("kv-32-layers", "over 32 layers (GB, within 1)", total / GB, 68, within(68, total / GB, abs_tol=1.0)),
        ],
        [t],
        method="The arithmetic, and the measured ratio of a naive step's peak to one matrix.",
    )


def claim_14(mem: dict) -> Claim:
    head_mib = 8192 * 8192 * 2 / MiB
    slope = fit_exponent([r["T"] for r in mem["rows"]], [r["naive"] for r in mem["rows"]])
    d_ratio = mem["naive_by_d"][256] / mem["naive_by_d"][16]
    t = Table(
        "Naive attention cost",
        "quantity | source | ours",
        [
            ["8192^2 x 2 B, one head", "about 128 MB", f"{head_mib:.0f} MiB = {head_mib * MiB / 1e6:.0f} MB"],
            ["time", "O(n^2 d)", "O(n^2 d): 4 n^2 d multiply-adds forward (QK^T and PV)"],
            [
                "memory",
                "O(n^2 d)",
                f"measured exponent of T {slope:.2f}; peak x{d_ratio:.2f} from d=16 to d=256 at T={mem['t_by_d']}",
            ],
        ],
    )
    return Claim(
        14,
        "Naive attention is O(n^2 d) in time and memory; n = 8192 gives a 128 MB attention matrix per head (fp16)",
        {"matrix_per_head_MB": 128, "time": "O(n^2 d)", "memory": "O(n^2 d)"},
        {"matrix_per_head_MiB": head_mib, "naive_peak_exponent_T": slope, "naive_peak_ratio_d256_over_d16": d_ratio},
        [
            Check(
                "matrix-128mb",
                "an n = 8192 fp16 matrix is 128 MB per head (MiB, within 0.5)",
                head_mib,
                128,
                within(128, head_mib, abs_tol=0.5),
            ),
            Check(
                "memory-n-squared",
                "naive memory grows as n^2 (measured exponent of T, within 0.25)",
                slope,
                2,
                abs(slope - 2) < 0.25,
            ),
            Check(
                "memory-grows-with-d",
                "naive memory grows with d, O(n^2 d) (peak ratio d = 256 / d = 16, above)",
                d_ratio,
                4,
                d_ratio > 4,
                DETAIL,
            ),
        ],
        [memory_table(mem), t],
        ["memory.png"],
        method="The matrix size counted; naive fwd+bwd peak memory measured against T and d.",
    )


def bound_exponents(n: int = 8192, d: int = 128, m: int = 192 * 1024 // 2) -> dict:
    """Exponents of FlashAttention's HBM bound in n, M and d, read off the formula evaluated at doubled arguments."""
    f = hbm_flash
    return {
        "n": math.log2(f(2 * n, d, m) / f(n, d, m)),
        "M": math.log2(f(n, d, 2 * m) / f(n, d, m)),
        "d": math.log2(f(n, 2 * d, m) / f(n, d, m)),
    }


def claim_15(mem: dict, sram_elems: int = 192 * 1024 // 2) -> Claim:
    rows = mem["rows"]
    slope = fit_exponent([r["T"] for r in rows], [r["flash"] for r in rows])
    last = rows[-1]
    n, d = 8192, 128
    reduction = hbm_standard(n, d) / hbm_flash(n, d, sram_elems)
    exps = bound_exponents(n, d, sram_elems)  # the published bound (Dao et al. 2022, Thm 2)
    t = Table(
        "FlashAttention: memory (measured) and HBM traffic (analytic, Dao et al. 2022 Thm 2)",
        "quantity | source | ours",
        [
            [
                "peak memory vs T (CPU flash kernel, measured)",
                "no T x T matrix",
                f"exponent {slope:.2f}; {last['flash'] / MiB:.1f} MiB vs naive {last['naive'] / MiB:.0f} MiB at T={last['T']}",
            ],
            ["HBM accesses, standard attention", "O(n^2)", "Theta(n d + n^2)"],
            ["HBM accesses, FlashAttention", "O(n^2 / M)", "Theta(n^2 d^2 / M)"],
            ["exponents of the bound in n, M, d", "2, -1, 0", f"{exps['n']:g}, {exps['M']:g}, {exps['d']:g}"],
            [
                f"reduction at n={n}, d={d}, M={sram_elems:,} fp16 elements (192 KB SRAM, A100)",
                "about M-fold",
                f"{reduction:.1f}x",
            ],
        ],
        note="HBM traffic cannot be measured on a CPU; the last rows are the published bound evaluated, not a measurement.",
    )
    return Claim(
        15,
        "FlashAttention never materialises the attention matrix; HBM traffic drops from O(n^2) to O(n^2/M)",
        {"materialises": False, "hbm": "O(n^2) -> O(n^2/M)"},
        {
            "flash_peak_exponent_T": slope,
            "flash_peak_MiB_at_Tmax": last["flash"] / MiB,
            "naive_peak_MiB_at_Tmax": last["naive"] / MiB,
            "bound_exponents": exps,
            "reduction_n8192_d128_M192KB": reduction,
        },
        [
            Check(
                "flash-linear",
                "no T x T matrix: flash peak memory linear in T (measured exponent, below)",
                slope,
                1.3,
                slope < 1.3,
            ),
            Check(
                "traffic-n2-over-m",
                "HBM traffic scales as n^2 / M (exponents of the published bound in n, M)",
                [exps["n"], exps["M"]],
                [2, -1],
                abs(exps["n"] - 2) < 1e-9 and abs(exps["M"] + 1) < 1e-9,
            ),
            Check(
                "traffic-no-d",
                "the traffic bound has no factor of d (its exponent in d)",
                exps["d"],
                0,
                abs(exps["d"]) < 1e-9,
                DETAIL,
            ),
            Check(
                "saving-m-fold",
                "the saving is about M-fold (bound's reduction at n = 8192, d = 128)",
                reduction,
                sram_elems / 2,
                reduction >= sram_elems / 2,
                DETAIL,
            ),
            Check(
                "traffic-measured",
                "HBM traffic measured",
                "-",
                "O(n^2 / M)",
                None,
                DETAIL,
                needs="a CUDA machine with a memory-traffic profiler; a CPU has no HBM to count",
            ),
        ],
        [t],
        method="Peak memory of the forced flash kernel measured against T; the HBM bound evaluated from Dao et al. 2022.",
    )
