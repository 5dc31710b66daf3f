"""When callbacks run and how they log, shared so every callback counts steps the same way."""

from __future__ import annotations

import lightning as L


def optimizer_stepped(trainer: L.Trainer, batch_idx: int) -> bool:
    """In on_train_batch_end: whether this batch ended an optimizer step. With gradient accumulation
    the hook runs once per micro-batch, and only the last of each group has updated the weights."""
    n = trainer.accumulate_grad_batches
    return n <= 1 or (batch_idx + 1) % n == 0


def should_run(trainer: L.Trainer, every_n_steps: int, batch_idx: int) -> bool:
    """In on_train_batch_end: true after steps 1, 1 + n, 1 + 2n, ... (global_step counts finished
    steps), once per step whatever the accumulation."""
    return (
        every_n_steps > 0 and (trainer.global_step - 1) % every_n_steps == 0 and optimizer_stepped(trainer, batch_idx)
    )


def log_metrics(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Write straight to every logger at the current step.

    ``LightningModule.log`` only flushes on multiples of ``log_every_n_steps``; callbacks that
    sample at their own cadence would otherwise lose most of their samples.
    """
    if not metrics or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
