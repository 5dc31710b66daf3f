"""Runs every reproduction for a mode and writes the report.

One module per theme: numerics_claims (claims 1-3, 9, 10), equivalence_claims (4, 5), mask_claims (7, 11),
memory_claims (6, 14, 15), streaming_claims (16), judge and training_claims (8, 12, 13), study_claims (the
committed studies' head types); verdict holds the checks and the verdict rule, record writes repro.json and
renders the pages.

Full mode writes reports/repro/ (the committed report); fast mode, which leaves the training claims
out, writes beside it (reports/repro/fast/, ignored by git), so a quick check never replaces it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from attnlab.analysis import plot_heads
from attnlab.data.text import VAL_SEED
from attnlab.repro import (
    equivalence_claims,
    figures,
    jacobian_claims,
    mask_claims,
    memory_claims,
    numerics_claims,
    streaming_claims,
    study_claims,
    training_claims,
)
from attnlab.repro.record import write_reports
from attnlab.repro.verdict import Claim
from attnlab.studies.report.baseline import attention_free_levels

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
OUT = {"full": Path("reports/repro"), "fast": Path("reports/repro/fast")}
TRAINING_IDS = (8, 12, 13)
JAC_STDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 11.3, 16.0, 32.0)
JAC_N = 64


def reproduce(mode: str, out: Path, log=print, reports: Path | None = None) -> tuple[list[Claim], dict]:
    """All claims the mode covers, figures written into ``out``; returns (claims, meta). Claims 8, 12, 13
    and 16 cite the studies' reports under ``reports`` (default: reports/)."""
    reports = Path("reports") if reports is None else Path(reports)
    cfg = MODES[mode]
    # Shared CPUs: one thread is faster than two fighting over a busy core, and nothing here is timed.
    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def step(name, fn):
        t = time.perf_counter()
        result = fn()
        log(f"{name}: {time.perf_counter() - t:.1f} s")
        return result

    claims = [
        step("claim 1", lambda: numerics_claims.claim_1(cfg["samples"])),
        step("claim 2", numerics_claims.claim_2),
        step("claim 3", lambda: numerics_claims.claim_3(cfg["trials"])),
        step("claim 4", equivalence_claims.claim_4),
        step("claim 5", lambda: equivalence_claims.claim_5(cfg["copy_trials"])),
        step("claim 9", lambda: numerics_claims.claim_9(cfg["samples"])),
    ]
    grid = step("mask grid (claims 7, 11)", mask_claims.mask_grid)
    claims += [mask_claims.claim_7(grid), mask_claims.claim_11(grid)]
    mem = step(
        "memory (claims 6, 14, 15)",
        lambda: memory_claims.memory_measurements(list(cfg["mem_ts"]), bench=reports / "bench" / "bench.json"),
    )
    claims += [memory_claims.claim_6(mem), memory_claims.claim_14(mem), memory_claims.claim_15(mem)]
    figures.memory(mem["rows"], out / "memory.png")
    claims.append(step("claim 16 (the streaming studies' reports)", lambda: streaming_claims.claim_16(reports)))
    stds = [2 ** (i / 2) for i in range(-4, 11)]
    figures.saturation(
        {n: numerics_claims.saturation_curve(n, stds) for n in (4, 16, 64, 256)}, stds, out / "saturation.png"
    )
    c1 = claims[0]
    big = {int(d): v for d, v in c1.measured[next(k for k in c1.measured if k.startswith("large_sample"))].items()}
    c1.figures.append(figures.dot_std(c1.measured["as_written"], big, out / "dot_std.png"))

    training_10 = None
    if cfg["training"]:
        jac_rows = step(
            "softmax Jacobian (claim 8)",
            lambda: jacobian_claims.jacobian_vs_logit_std(JAC_STDS, n=JAC_N, rows=cfg["jac_rows"]),
        )
        with tempfile.TemporaryDirectory(prefix="attnlab-repro-") as work:
            res = step(
                "training runs (claims 8, 10, 12, 13)",
                lambda: training_claims.run_all(Path(work), cfg["ablation_steps"], cfg["heads_steps"], log=log),
            )
        level = step(
            "attention-free level (claim 8)",
            lambda: attention_free_levels(window_seeds=(VAL_SEED,), batches=training_claims.probe_batches()),
        )
        study = study_claims.dk_scaling_measurements(reports)
        claims += [
            training_claims.claim_8(training_claims.claim_8_measurements(res, jac_rows, JAC_N, level, study)),
            training_claims.claim_12(training_claims.claim_12_measurements(res, reports)),
            training_claims.claim_13(training_claims.claim_13_measurements(res, reports)),
        ]
        training_10 = training_claims.claim_10_training(res)
        plot_heads(res["heads"]["heads"], out / "heads.png", "Head scores and types, tiny GPT (claim 12)")
        figures.jacobian(jac_rows, out / "jacobian.png")
    claims.append(step("claim 10", lambda: numerics_claims.claim_10(cfg["samples"], training_10)))
    claims.sort(key=lambda c: c.id)
    meta = {
        "mode": mode,
        "torch": torch.__version__,
        "device": "CPU",
        "threads": torch.get_num_threads(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "omitted": [] if cfg["training"] else list(TRAINING_IDS),
    }
    return claims, meta


def main(mode: str, out: Path | None = None, log=print, reports: Path | None = None) -> list[Claim]:
    out = OUT[mode] if out is None else Path(out)
    claims, meta = reproduce(mode, out, log, reports)
    paths = write_reports(claims, out, meta, root=(Path("reports") if reports is None else Path(reports)).parent)
    for c in claims:
        log(f"claim {c.id:>2}: {c.verdict:<8} {c.claim}")
    log(f"wrote {', '.join(map(str, paths))} ({meta['wall_s']:.0f} s)")
    return claims
