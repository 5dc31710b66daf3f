"""Runs every reproduction for a mode and writes the reports."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from ...analysis import plot_heads
from ...data.text import VAL_SEED
from ..report.baseline import attention_free_levels
from . import equivalence, jacobian, masks, memory, numerics, plots, streaming
from .report import write_reports
from .verdict import Claim

# How much each mode measures. fast: under a minute, no training (what the tests run).
MODES = {
    "fast": dict(
        samples=20_000, trials=50, copy_trials=200, mem_ts=(128, 256, 512, 1024), jac_rows=1000, training=False
    ),
    "full": dict(
        samples=100_000,
        trials=200,
        copy_trials=1000,
        mem_ts=(256, 512, 1024, 2048, 4096),
        jac_rows=2000,
        training=True,
        ablation_steps=150,
        heads_steps=800,
    ),
}
TRAINING_IDS = (8, 12, 13)
JAC_STDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 11.3, 16.0, 32.0)
JAC_N = 64


def reproduce(mode: str, out: Path, log=print, reports: Path | None = None) -> tuple[list[Claim], dict]:
    """All claims the mode covers, figures written into ``out``; returns (claims, meta). Claims 12,
    13 and 16 cite the studies' reports under ``reports`` (default: reports/)."""
    reports = Path("reports") if reports is None else Path(reports)
    cfg = MODES[mode]
    # Shared CPUs: one thread is faster than two fighting over a busy core, and nothing here is timed.
    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    claims: list[Claim] = []

    def step(name, fn):
        t = time.perf_counter()
        result = fn()
        log(f"{name}: {time.perf_counter() - t:.1f} s")
        return result

    claims.append(step("claim 1", lambda: numerics.claim_1(cfg["samples"])))
    claims.append(step("claim 2", numerics.claim_2))
    claims.append(step("claim 3", lambda: numerics.claim_3(cfg["trials"])))
    claims.append(step("claim 4", equivalence.claim_4))
    claims.append(step("claim 5", lambda: equivalence.claim_5(cfg["copy_trials"])))
    claims.append(step("claim 9", lambda: numerics.claim_9(cfg["samples"])))
    grid = step("mask grid (claims 7, 11)", masks.mask_grid)
    claims += [masks.claim_7(grid), masks.claim_11(grid)]
    mem = step(
        "memory (claims 6, 14, 15)",
        lambda: memory.memory_measurements(list(cfg["mem_ts"]), bench=reports / "bench" / "bench.json"),
    )
    for c in (memory.claim_6(mem), memory.claim_14(mem), memory.claim_15(mem)):
        c.tables.insert(0, memory.memory_table(mem)) if c.id == 14 else None
        claims.append(c)
    next(c for c in claims if c.id == 14).figures.append(plots.memory(mem["rows"], out / "memory.png"))
    claims.append(step("claim 16 (the streaming studies' reports)", lambda: streaming.claim_16(reports)))

    # figures of the fast claims
    stds = [2 ** (i / 2) for i in range(-4, 11)]
    curves = {n: numerics.saturation_curve(n, stds) for n in (4, 16, 64, 256)}
    plots.saturation(curves, stds, out / "saturation.png")
    c1 = next(c for c in claims if c.id == 1)
    big = {int(d): v for d, v in c1.measured[next(k for k in c1.measured if k.startswith("large_sample"))].items()}
    c1.figures.append(plots.dot_std(c1.measured["as_written"], big, out / "dot_std.png"))

    if cfg["training"]:
        from . import training

        jac_rows = step(
            "softmax Jacobian (claim 8)",
            lambda: jacobian.jacobian_vs_logit_std(JAC_STDS, n=JAC_N, rows=cfg["jac_rows"]),
        )
        with tempfile.TemporaryDirectory(prefix="attnlab-repro-") as work:
            res = step(
                "training runs (claims 8, 10, 12, 13)",
                lambda: training.run_all(Path(work), cfg["ablation_steps"], cfg["heads_steps"], log=log),
            )
        level = step(
            "attention-free level (claim 8)",
            lambda: attention_free_levels(window_seeds=(VAL_SEED,), batches=training.probe_batches()),
        )
        claims += [
            training.claim_8(res, jac_rows, JAC_N, level, reports),
            training.claim_10_full(res, cfg["samples"]),
            training.claim_12(res, reports),
            training.claim_13(res, reports),
        ]
        plot_heads(res["heads"]["heads"], out / "heads.png", "Head scores and types, tiny GPT (claim 12)")
        plots.jacobian(jac_rows, out / "jacobian.png")
    else:
        claims.append(step("claim 10 (math)", lambda: numerics.claim_10_fast(cfg["samples"])))
    claims.sort(key=lambda c: c.id)
    meta = {
        "mode": mode,
        "torch": torch.__version__,
        "device": "CPU",
        "threads": torch.get_num_threads(),
        "wall_s": time.perf_counter() - t0,
        "omitted": [] if cfg["training"] else list(TRAINING_IDS),
    }
    return claims, meta


def main(mode: str, out: Path, log=print, reports: Path | None = None) -> list[Claim]:
    claims, meta = reproduce(mode, out, log, reports)
    paths = write_reports(claims, out, meta)
    for c in claims:
        log(f"claim {c.id:>2}: {c.verdict:<8} {c.claim}\n           {c.summary}")
    log(f"wrote {paths['md']}, {paths['json']}, {paths['readme']} ({meta['wall_s']:.0f} s)")
    return claims
