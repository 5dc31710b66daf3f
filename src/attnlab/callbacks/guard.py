"""Stop at the first NaN/Inf in a loss, the logits or an attention output, keeping the last finite state.

The loss is checked every step (a NaN or Inf in any attention output or in the logits reaches
it; the offending layer is then found by re-running the step's forward with hooks), and the
gradients before the optimizer step, so the parameters are still those of the last finite step
when the guard fires: it saves them to ``checkpoints/last-finite.ckpt`` and
raises ``NonFiniteError`` naming the step, the layer and the tensor. train() turns that into
results.json status "failed" and one line on stderr; loggers are finalised by Lightning as usual.

With a gradient scaler (``trainer.precision=16-mixed``) non-finite gradients are expected now and
then: the scaler skips that optimizer step and lowers its scale. Such a step is not a failure; the
guard fails on a non-finite loss, or after ``max_skipped_steps`` skipped steps in a row.

Under DDP every rank takes the same decision at the same step (one all-reduce of a flag), so no
rank is left waiting in a collective while another stops.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch

from attnlab.analysis.probe import training_precision
from attnlab.util.errors import AttnlabError


class NonFiniteError(AttnlabError):
    pass


def _kind(t: torch.Tensor) -> str:
    return "NaN" if torch.isnan(t).any() else "Inf"


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite. A scalar (the loss, the total gradient norm) is read
    as one number: one op, where ``torch.isfinite(t).all()`` runs five (isfinite is composite)."""
    return math.isfinite(t.item()) if t.numel() == 1 else bool(torch.isfinite(t).all())


class NonFiniteGuard(L.Callback):
    def __init__(self, check_every_n_steps: int = 1, max_skipped_steps: int = 10):
        self.every = check_every_n_steps
        self.max_skipped_steps = max_skipped_steps
        self.skipped_in_a_row = 0  # optimizer steps a gradient scaler skipped, consecutively
        self._batch = None
        self._kind: str | None = None
        self.checkpoint_path: Path | None = None

    def _active(self, trainer) -> bool:
        return trainer.training and self.every > 0 and trainer.global_step % self.every == 0

    def _fire(self, trainer: L.Trainer, where: str, tensor: torch.Tensor):
        step = trainer.global_step
        path = Path(trainer.default_root_dir) / "checkpoints" / "last-finite.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(path)
        self.checkpoint_path = path
        kind, self._kind = self._kind or _kind(tensor), None
        raise NonFiniteError(f"{kind} in {where} at step {step}; last finite state saved to {path}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch = batch  # kept to locate the first bad tensor if this step's loss is non-finite

    @staticmethod
    def _any_rank(trainer, bad: bool) -> bool:
        """True on every rank if it is true on any (a no-op on one device)."""
        return trainer.strategy.reduce_boolean_decision(bad, all=False)

    def on_before_backward(self, trainer, pl_module, loss):
        if not self._active(trainer):
            return
        here = not all_finite(loss)
        if not self._any_rank(trainer, here):
            return
        if not here:
            self._kind = "NaN/Inf"
            self._fire(trainer, "train/loss on another rank", loss)
        self._fire(trainer, self._locate(trainer, pl_module) or "train/loss", loss)

    @torch.no_grad()
    def _locate(self, trainer, pl_module) -> str | None:
        """Re-run this step's forward with hooks and name the first layer whose output is non-finite.

        Checking only the loss each step is cheap (one scalar); a NaN or Inf in any attention output
        or in the logits reaches the loss, so nothing is missed, and the search runs only on failure.
        """
        model, found = pl_module.model, []

        def watch(name):
            def hook(module, args, output):
                if not found and not torch.isfinite(output).all():
                    found.append((name, output))

            return hook

        names = [(layer, f"layer {i} attention output (attn/L{i})") for i, layer in enumerate(model.attention_layers())]
        names.append((model.lm_head, "logits (lm_head output)"))
        handles = [module.register_forward_hook(watch(name)) for module, name in names]
        try:
            x, y = self._batch
            with training_precision(trainer)():  # the step's own dtypes and kernels
                model(x, y)
        finally:
            for handle in handles:
                handle.remove()
        if found:
            self._kind = _kind(found[0][1])
            return found[0][0]
        return None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if not self._active(trainer):
            return
        # one fused norm over all gradients, the one the gradient clipping uses too: a single check per step
        # (no gradients: a norm of zero)
        bad = not all_finite(pl_module.gradient_norm())
        if not self._any_rank(trainer, bad):
            self.skipped_in_a_row = 0
            return
        grads = pl_module.step_gradients()
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            self.skipped_in_a_row += 1  # the scaler skips this step and lowers its scale
            if self.skipped_in_a_row < self.max_skipped_steps:
                return
            self._kind = "NaN/Inf"
            self._fire(
                trainer,
                f"the gradients of {self.skipped_in_a_row} steps in a row (the 16-mixed scaler "
                f"skipped them all; callbacks.nonfinite_guard.max_skipped_steps={self.max_skipped_steps})",
                grads[0],
            )
        for name, p in pl_module.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                self._fire(trainer, f"gradient of {name}", p.grad)
        self._kind = "NaN/Inf"
        self._fire(trainer, "the gradients on another rank", grads[0] if grads else torch.zeros(()))
