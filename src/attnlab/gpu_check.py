"""``make gpu-check``: one prepared command for the day a GPU is at hand.

On a CUDA machine it runs, in about 8 minutes on one H100-class GPU:
- every backend x precision {32, bf16-mixed, 16-mixed} x qk_norm {false, true}, ~30 steps of the
  tiny preset with the default callbacks (statistics, maps, memory, head analysis, guard), each
  cell in-process through ``train()``, as ``make train`` would;
- a 2-GPU DDP smoke run when two GPUs exist;
- the kernel benchmark up to T = 16384 (bf16);
- compiled vs eager tokens/s for sdpa and flash (``model.compile``);
and writes ``reports/gpu/gpu_check.json`` and ``gpu_check.md``: device, torch/CUDA versions, and
per cell the kernel that ran, tokens/s, peak memory and pass / refused / fail with the one-line
error. "refused" is a clean one-line refusal (e.g. flash with fp32 inputs), "fail" anything else.

Without CUDA it prints one line and exits 0. ``--device cpu`` runs the same matrix on CPU (tests
use it with a few steps) so the script itself is checked before a GPU ever runs it.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from .attention import BACKENDS
from .cli import command_parser
from .markdown import markdown_table
from .errors import AttnlabError

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
QK_NORM = (False, True)
# every callback fires within the check's few steps
CALLBACK_CADENCE = ["callbacks.attention_stats.every_n_steps=10", "callbacks.attention_maps.every_n_steps=30",
                    "callbacks.heads.every_n_steps=15", "callbacks.peak_memory.every_n_steps=10"]


def cells(backends=BACKENDS) -> list[dict]:
    return [{"backend": b, "precision": p, "qk_norm": q} for b, p, q in itertools.product(backends, PRECISIONS, QK_NORM)]


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


def run_cell(cell: dict, device: str, steps: int, out_dir: Path, extra: list[str] = (), label: str = "") -> dict:
    """Train one cell in-process; never raises: the outcome is in the returned row."""
    from .config import compose_config
    from .train import train

    name = f"{cell['backend']}-{cell['precision']}-qknorm{int(cell['qk_norm'])}{label}"
    overrides = [f"attention={cell['backend']}", f"trainer.precision={cell['precision']}",
                 f"model.attention.qk_norm={str(cell['qk_norm']).lower()}", f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
                 f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "logger=csv",
                 "trainer.enable_progress_bar=false", *CALLBACK_CADENCE, *extra]
    row = {**cell, "name": name, "overrides": overrides, "status": "fail", "error": None}
    started = time.perf_counter()
    try:
        metrics = train(compose_config(overrides, out_dir / name))
        results = json.loads((out_dir / name / "results.json").read_text())
        row.update(status="pass", kernel=results["attention"]["kernel"], tokens_per_s=metrics.get("perf/tokens_per_s"),
                   peak_bytes=metrics.get("mem/peak_bytes"), cuda_max_allocated_bytes=metrics.get("mem/cuda_max_allocated_bytes"),
                   val_loss=metrics.get("val/loss"))
    except AttnlabError as err:
        row.update(status="refused", error=str(err).splitlines()[0])
    except Exception as err:  # noqa: BLE001 - the report must list every failure, not stop at the first
        row.update(error=one_line(err))
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    row["wall_s"] = round(time.perf_counter() - started, 2)
    return row


def ddp_smoke(out_dir: Path, timeout: int = 300) -> dict:
    """Two ranks, one job: the same command a user would type."""
    run_dir = out_dir / "ddp-smoke"
    cmd = [sys.executable, "-m", "attnlab.train", "trainer=ddp", "trainer.devices=2", "debug=smoke", "logger=csv",
           f"hydra.run.dir={run_dir}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
        ok = proc.returncode == 0 and results.get("status") == "ok"
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return {"status": "pass" if ok else "fail", "error": None if ok else (results.get("error") or tail),
                "kernel": results.get("attention", {}).get("kernel")}
    except subprocess.TimeoutExpired:
        return {"status": "fail", "error": f"no result within {timeout} s (ranks waiting in a collective?)"}


def kernel_bench(device: torch.device, max_t: int) -> list[dict]:
    from .bench.kernels import KernelPlan, run_kernels

    seq_lens = tuple(t for t in (512, 1024, 2048, 4096, 8192, 16384, 32768) if t <= max_t)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plan = KernelPlan(seq_lens, (), batch=2, heads=16, head_dim=64, dtype=dtype, repeats=5, warmup=2, min_sample_s=0.01,
                      matmul_n=8192 if device.type == "cuda" else 256)
    return run_kernels(plan, device, log=lambda line: print("  " + line, flush=True))


def environment(device: str) -> dict:
    env = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(), gpus=torch.cuda.device_count(), bf16=torch.cuda.is_bf16_supported(),
                   capability=".".join(map(str, torch.cuda.get_device_capability())))
        from importlib.metadata import PackageNotFoundError, version

        from .attention.backends import flash_attn_package
        from .errors import KernelUnavailable

        try:  # the same import attention=flash goes through
            env["flash_attn"] = version("flash-attn") if flash_attn_package() is not None else "not installed"
        except KernelUnavailable as err:
            env["flash_attn"] = str(err)
        except PackageNotFoundError:
            env["flash_attn"] = "installed (version unknown)"
    return env


def _fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.0f}{unit}" if abs(v) >= 100 else f"{v:.3f}{unit}"
    return f"{v}{unit}"


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    from .results import json_safe, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    atomic_write_text(json_path, json.dumps(json_safe(report), indent=2))
    env = report["environment"]
    lines = ["# GPU check", "", "Generated by `make gpu-check` (`python -m attnlab.gpu_check`). "
             + ", ".join(f"{k}: {v}" for k, v in env.items()), ""]
    counts = {s: sum(r["status"] == s for r in report["cells"]) for s in ("pass", "refused", "fail")}
    lines += [f"Cells: {counts['pass']} pass, {counts['refused']} refused (one-line error), {counts['fail']} fail; "
              f"{report['steps']} steps each, tiny preset, default callbacks. Wall time {report['wall_s']:.0f} s.", ""]
    rows = []
    for r in report["cells"] + report.get("compile", []):
        peak = r.get("peak_bytes") / 2**20 if r.get("peak_bytes") else None
        mode = {"-compiled": " (compiled)", "-eager": " (eager)"}.get(r["name"][r["name"].rfind("-"):], "")
        rows.append([f"{r['backend']}{mode}", r["precision"], r["qk_norm"], r["status"], r.get("kernel") or "–",
                     _fmt(r.get("tokens_per_s")), _fmt(peak), _fmt(r.get("val_loss")), r["error"] or ""])
    lines.append(markdown_table(["backend", "precision", "qk_norm", "status", "kernel", "tokens/s", "peak MiB", "val loss", "error"], rows))
    if report.get("ddp"):
        lines += ["", f"DDP smoke (2 GPUs): {report['ddp']['status']} {report['ddp'].get('error') or ''}"]
    if report.get("kernels"):
        kernels = [[r["backend"], r["T"], _fmt(r.get("fwd_bwd_ms")), _fmt(r["peak_bytes"] / 2**20 if r.get("peak_bytes") else None),
                    r.get("error") or ""] for r in report["kernels"]]
        lines += ["", "Kernel benchmark (fwd+bwd, bf16, B=2, H=16, d=64):", "",
                  markdown_table(["backend", "T", "fwd+bwd ms", "peak MiB", "error"], kernels)]
    atomic_write_text(md_path, "\n".join(lines) + "\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    p = command_parser("gpu-check", __doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of " + ", ".join(BACKENDS))
    p.add_argument("--max-t", type=int, default=16384, help="longest sequence of the kernel benchmark (0: skip it)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled-vs-eager rows")
    p.add_argument("--out", default="reports/gpu")
    p.add_argument("--runs", default="logs/gpu_check", help="where the cells' run dirs go")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("attnlab: gpu-check: no CUDA device here, nothing to check (run it on a GPU machine)")
        return 0
    backends = tuple(b.strip() for b in args.backends.split(","))
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        print(f"attnlab: error: --backends {','.join(bad)}: expected a subset of {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    runs = Path(args.runs) / time.strftime("%Y-%m-%d_%H-%M-%S")
    report = {"environment": environment(args.device), "steps": args.steps, "cells": []}
    for cell in cells(backends):
        row = run_cell(cell, args.device, args.steps, runs)
        print(f"attnlab: gpu-check {row['name']}: {row['status']} {row.get('kernel') or ''} {row['error'] or ''}", flush=True)
        report["cells"].append(row)
    for backend in [b for b in ("sdpa", "flash") if b in backends and not args.no_compile]:
        precision = "bf16-mixed" if args.device == "cuda" else "32"
        for compiled in (False, True):
            row = run_cell({"backend": backend, "precision": precision, "qk_norm": False}, args.device, args.steps, runs,
                           extra=[f"model.compile={str(compiled).lower()}"], label="-compiled" if compiled else "-eager")
            report.setdefault("compile", []).append(row)
            print(f"attnlab: gpu-check {row['name']}: {row['status']} {row.get('tokens_per_s') or ''} {row['error'] or ''}", flush=True)
    if args.device == "cuda" and torch.cuda.device_count() >= 2:
        report["ddp"] = ddp_smoke(runs)
    if args.max_t:
        report["kernels"] = kernel_bench(torch.device(args.device), args.max_t)
    report["wall_s"] = time.perf_counter() - started
    json_path, md_path = write_report(report, Path(args.out))
    failed = sum(r["status"] == "fail" for r in report["cells"] + report.get("compile", []))
    print(f"attnlab: gpu-check: {failed} failed; report in {md_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
