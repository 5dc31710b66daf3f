"""bench.json, bench.md and the log-log plots, from the measurements ``__main__`` collects."""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..results import atomic_write_text
from .memory import fit_exponent

MIB = 2**20


def memory_summary(kernels: list[dict], min_fit_T: int = 1024) -> dict:
    """Per backend: exponent p of peak ~ T^p (fit over T >= min_fit_T where there are two such points) and peak(8192)/peak(1024)."""
    exponents, ratios, fit_ranges = {}, {}, {}
    for backend in dict.fromkeys(r["backend"] for r in kernels):
        pts = sorted((r["T"], r["peak_bytes"]) for r in kernels if r["backend"] == backend and r.get("peak_bytes"))
        large = [p for p in pts if p[0] >= min_fit_T]
        used = large if len(large) >= 2 else pts
        exponents[backend] = fit_exponent([t for t, _ in used], [b for _, b in used])
        fit_ranges[backend] = [used[0][0], used[-1][0]] if used else None
        by_t = dict(pts)
        ratios[backend] = by_t[8192] / by_t[1024] if 8192 in by_t and 1024 in by_t else None
    return {"memory_exponent": exponents, "memory_ratio_8192_1024": ratios, "memory_fit_T": fit_ranges}


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(bench: dict, out: Path) -> Path:
    path = Path(out) / "bench.json"
    atomic_write_text(path, json.dumps(_json_safe(bench), indent=1) + "\n")
    return path


def _f(value, fmt: str = ".2f", none: str = "-") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _range(pair, fmt: str = ".2f") -> str:
    return "" if not pair else f" ({_f(pair[0], fmt)}-{_f(pair[1], fmt)})"


def kernels_table(bench: dict) -> list[str]:
    peak = bench["machine"].get("matmul_gflops")
    lines = [
        "| backend | kernel | T | fwd ms (min-max) | fwd+bwd ms (min-max) | fwd GFLOP/s | fwd+bwd GFLOP/s | % of matmul | peak MiB (fwd+bwd) | peak MiB (fwd) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in bench["kernels"]:
        if r.get("error") and r.get("peak_bytes") is None:
            lines.append(f"| {r['backend']} | {r.get('kernel') or '-'} | {r['T']} | {r['error']} | | | | | | |")
            continue
        frac = r["peak_fraction"] * 100 if r.get("peak_fraction") else (r["gflops"] / peak * 100 if r.get("gflops") and peak else None)
        lines.append(
            f"| {r['backend']} | {r.get('kernel') or '-'} | {r['T']} | {_f(r.get('fwd_ms'))}{_range(r.get('fwd_ms_range'))} | "
            f"{_f(r.get('fwd_bwd_ms'))}{_range(r.get('fwd_bwd_ms_range'))} | {_f(r.get('fwd_gflops'), '.1f')} | "
            f"{_f(r.get('gflops'), '.1f')} | {_f(frac, '.0f')} | {_f(_mib(r.get('peak_bytes')), '.1f')} | "
            f"{_f(_mib(r.get('fwd_peak_bytes')), '.1f')} |"
        )
    return lines


def _mib(value):
    return None if value is None else value / MIB


def memory_table(bench: dict) -> list[str]:
    lines = ["| backend | exponent p (peak ~ T^p) | fit over T | peak(8192) / peak(1024) |", "|---|---:|---|---:|"]
    for backend, p in bench["memory_exponent"].items():
        fit = bench.get("memory_fit_T", {}).get(backend)
        lines.append(f"| {backend} | {_f(p)} | {'-' if not fit else f'{fit[0]}-{fit[1]}'} | "
                     f"{_f(bench['memory_ratio_8192_1024'].get(backend), '.1f')} |")
    return lines


def train_table(bench: dict) -> list[str]:
    lines = [
        "| backend | Lightning tok/s (min-max) | plain tok/s (min-max) | Lightning / plain (min-max) | tok/s / scaled's (min-max) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in bench["train"]:
        lines.append(
            f"| {r['backend']} | {_f(r['lightning_tokens_per_s'], '.0f')}{_range(r.get('lightning_range'), '.0f')} | "
            f"{_f(r['plain_tokens_per_s'], '.0f')}{_range(r.get('plain_range'), '.0f')} | "
            f"{_f(r['ratio'], '.3f')}{_range(r.get('ratio_range'), '.3f')} | "
            f"{_f(r.get('ratio_to_scaled'), '.3f')}{_range(r.get('ratio_to_scaled_range'), '.3f')} |"
        )
    return lines


def write_markdown(bench: dict, out: Path) -> Path:
    m = bench["machine"]
    lines = [
        "# attnlab benchmarks",
        "",
        f"Mode `{bench['mode']}` on {m['device']} ({m.get('cpu') or m.get('gpu') or '?'}), {m['threads']} thread(s), "
        f"torch {m['torch']}; load average {_f(m['load_before'][0])} before, {_f((m.get('load_after') or [None])[0])} after "
        f"(the machine is shared: rerun when idle for clean numbers). Wall time {_f(bench.get('wall_s'), '.0f')} s.",
        "",
        *([f"Sections {', '.join(k for k in ('kernels', 'train', 'callbacks') if k not in bench['merged']['rerun'])} are kept "
           f"from the run of {bench['merged']['kept_from']} (`--merge`), load average "
           f"{_f(((bench['merged'].get('previous_load') or [None])[0] or [None])[0])} at its start.", ""]
          if bench.get("merged") else []),
        f"Matmul yardstick: {m['matmul_n']}x{m['matmul_n']} {m['matmul_dtype']} matmul, median {_f(m['matmul_gflops'], '.1f')} GFLOP/s "
        f"(range {_f(m['matmul_gflops_range'][0], '.1f')}-{_f(m['matmul_gflops_range'][1], '.1f')}).",
        "",
        "## Kernels",
        "",
        f"One causal attention, batch {bench['kernel_setup']['batch']}, {bench['kernel_setup']['heads']} heads, "
        f"d_k {bench['kernel_setup']['head_dim']}, {bench['kernel_setup']['dtype']}; median of "
        f"{bench['kernel_setup']['repeats']} repeats after warm-up. GFLOP/s counts the useful causal work, "
        "4 B T^2 H d / 2 (backward 2.5x forward), the same for every backend; % of matmul = fwd+bwd GFLOP/s over the matmul "
        "yardstick measured again right before that row (same load). Backends alternate within each T. "
        "Peak = tensor memory allocated above the inputs (CPU: profiler allocation events; CUDA: max_memory_allocated).",
        "",
        *kernels_table(bench),
        "",
        "![time vs T](time_vs_T.png) ![memory vs T](memory_vs_T.png)",
        "",
        "## Memory scaling",
        "",
        *memory_table(bench),
        "",
    ]
    if bench.get("train"):
        s = bench["train"][0]["setup"]
        lines += [
            "## Training throughput (tiny preset)",
            "",
            f"Batch {s['batch_size']} x block {s['block_size']} = {s['tokens_per_step']} tokens/step, precision {s['precision']}, "
            f"{s['steps']} steps of which the first {s['warmup_steps']} are not counted, {s['repeats']} repeats; Lightning "
            "(`Trainer.fit`, the project's trainer config, validation off) and a plain PyTorch loop (same model, seed, "
            "batches, AdamW, schedule and clipping) alternate in one process. Ratios are taken within each repeat.",
            "",
            *train_table(bench),
            "",
        ]
    cb = bench.get("callbacks")
    if cb:
        lines += [
            "## Callback cost",
            "",
            f"`callbacks=default` ({', '.join(cb.get('callbacks', []))}; intervals {cb.get('intervals')}) against "
            f"`callbacks=none`, {cb.get('measured_steps')} measured steps after {cb.get('warmup_steps')}, {cb.get('repeats')} "
            f"repeats, backend {cb.get('backend')}: step time ratio **{_f(cb.get('overhead_ratio'), '.3f')}**"
            f"{_range(cb.get('overhead_ratio_range'), '.3f')} ({_f(cb.get('step_ms_with'))} ms vs {_f(cb.get('step_ms_without'))} ms)."
            + (" Time inside each callback's own hooks, ms per step: "
               + ", ".join(f"{k} {v:.2f}" for k, v in cb["hook_ms_per_step"].items()) + "." if cb.get("hook_ms_per_step") else "")
            + ("" if cb.get("representative") else
               " Not representative: the window is shorter than the callbacks' common period, so rare callbacks are over- or under-counted."),
            "",
        ]
    path = Path(out) / "bench.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def write_plots(bench: dict, out: Path) -> list[Path]:
    """Two small log-log PNGs: fwd+bwd time vs T and peak memory vs T, one line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    specs = [
        ("time_vs_T.png", "fwd_bwd_ms", 1.0, "forward+backward time (ms)"),
        ("memory_vs_T.png", "peak_bytes", 1 / MIB, "peak memory, fwd+bwd (MiB)"),
    ]
    for name, key, factor, label in specs:
        fig, ax = plt.subplots(figsize=(5, 3.6), dpi=100)
        for backend in dict.fromkeys(r["backend"] for r in bench["kernels"]):
            pts = sorted((r["T"], r[key] * factor) for r in bench["kernels"] if r["backend"] == backend and r.get(key))
            if pts:
                style = "--" if backend in ("naive", "flash") else "-"  # naive/scaled and sdpa/flash may coincide
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=backend)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(out) / name
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
