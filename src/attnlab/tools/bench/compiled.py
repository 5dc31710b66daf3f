"""Eager against ``torch.compile`` per backend: tokens/s of the training step, compile time in and out.

Both arms run the same plain training step (forward, backward, clipping, AdamW, schedule) on the
same batches from the same initial weights, one after the other in one process; the compiled arm
wraps the model as ``model.compile=true`` does (``torch.compile(model)``). "Excluding compile" is
the median step after ``warmup`` steps; "including" is all steps' tokens over their total time,
the first (compiling) step included. The losses of the two arms are compared step by step.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.tools.bench.throughput import PlainUpdate, device_overrides, make_setup


def step_times(setup, compile_model: bool) -> tuple[list[float], list[float]]:
    """Per-step seconds and losses of a plain loop over the setup's batches (eager or compiled model)."""
    update = PlainUpdate(setup)
    forward = torch.compile(update.model) if compile_model else update.model
    seconds, losses = [], []
    for step, (x, y) in enumerate(setup.datamodule.train_dataloader()):
        if step >= setup.steps:
            break
        t0 = time.perf_counter()
        _, loss = forward(x.to(setup.device), y.to(setup.device))
        update(loss)
        losses.append(float(loss.detach()))
        seconds.append(time.perf_counter() - t0)
    return seconds, losses


def compile_throughput(
    backends: tuple[str, ...], steps: int, warmup: int, device: torch.device, log: Callable[[str], None] = print
) -> list[dict]:
    rows, datamodule = [], None
    base = ["logger=none", "callbacks=none", f"trainer.max_steps={steps}", *device_overrides(device)]
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as out:
        for backend in backends:
            setup = make_setup([*base, f"attention={backend}"], Path(out), device, datamodule)
            datamodule = setup.datamodule
            row = {
                "backend": backend,
                "steps": steps,
                "warmup_steps": warmup,
                "tokens_per_step": setup.tokens_per_step,
                "error": None,
            }
            eager_s, eager_loss = step_times(setup, compile_model=False)
            row.update(
                eager_tokens_per_s=setup.tokens_per_step / statistics.median(eager_s[warmup:]),
                eager_tokens_per_s_incl=setup.tokens_per_step * len(eager_s) / sum(eager_s),
            )
            torch._dynamo.reset()
            try:
                comp_s, comp_loss = step_times(setup, compile_model=True)
            except Exception as err:  # no C++ compiler, an unsupported op: say so in the table
                row["error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
                rows.append(row)
                log(f"  compile {backend}: failed ({row['error']})")
                continue
            steady = statistics.median(comp_s[warmup:])
            row.update(
                compiled_tokens_per_s=setup.tokens_per_step / steady,
                compiled_tokens_per_s_incl=setup.tokens_per_step * len(comp_s) / sum(comp_s),
                compile_s=sum(comp_s[:warmup]) - warmup * steady,
                max_loss_diff=max(abs(a - b) for a, b in zip(eager_loss, comp_loss)),
            )
            row["speedup"] = row["compiled_tokens_per_s"] / row["eager_tokens_per_s"]
            row["speedup_incl"] = row["compiled_tokens_per_s_incl"] / row["eager_tokens_per_s_incl"]
            rows.append(row)
            log(
                f"  compile {backend}: eager {row['eager_tokens_per_s']:.0f} tok/s, compiled {row['compiled_tokens_per_s']:.0f} "
                f"tok/s (x{row['speedup']:.2f}), compile {row['compile_s']:.1f} s, max |loss diff| {row['max_loss_diff']:.2e}"
            )
            torch._dynamo.reset()
    return rows
