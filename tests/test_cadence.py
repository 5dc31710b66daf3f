"""When the measurement callbacks run: once per optimizer step, whatever the gradient accumulation."""

from __future__ import annotations

from types import SimpleNamespace

from attnlab.callbacks.cadence import optimizer_stepped, should_run


def test_cadence_runs_once_per_optimizer_step_under_accumulation():
    """With 4 micro-batches per step, on_train_batch_end runs 4 times per step; a measurement due at
    a step runs on the group's last micro-batch only, and without accumulation on every batch."""
    runs = []
    for batch_idx in range(16):
        trainer = SimpleNamespace(accumulate_grad_batches=4, global_step=(batch_idx + 1) // 4)  # steps finished so far
        if should_run(trainer, 2, batch_idx):
            runs.append((trainer.global_step, batch_idx))
    assert runs == [(1, 3), (3, 11)]
    plain = SimpleNamespace(accumulate_grad_batches=1, global_step=5)
    assert optimizer_stepped(plain, 0) and should_run(plain, 2, 0) and not should_run(plain, 3, 0)
