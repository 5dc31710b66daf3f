"""Gradient norms reaching the query and key projections, per layer (before clipping).

A saturated softmax has a Jacobian diag(p) - pp^T close to zero, which starves exactly these
gradients (source claim 8): ``grad/L{i}/q_norm`` and ``grad/L{i}/k_norm`` show it during training.
"""

from __future__ import annotations

import lightning as L

from attnlab.callbacks.cadence import log_metrics


class QKGradNorms(L.Callback):
    def __init__(self, every_n_steps: int = 100):
        self.every_n_steps = every_n_steps
        self.last: dict[str, float] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.every_n_steps <= 0 or trainer.global_step % self.every_n_steps:
            return
        norms = {}
        for i, block in enumerate(pl_module.model.blocks):
            grad = block.attn.qkv_proj.weight.grad
            if grad is not None:
                parts = block.attn.qkv_parts(grad.detach())
                norms[f"grad/L{i}/q_norm"], norms[f"grad/L{i}/k_norm"] = float(parts.q.norm()), float(parts.k.norm())
        self.last = norms
        log_metrics(trainer, norms)

    def summary(self) -> dict[str, float]:
        return dict(self.last)
