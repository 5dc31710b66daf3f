"""Stop at the first NaN/Inf in a loss, the logits or an attention output, keeping the last finite state.

The loss is checked every step (a NaN or Inf in any attention output or in the logits reaches
it; the offending layer is then found by re-running the step's forward with hooks), and the
gradients before the optimizer step, so the parameters are still those of the last finite step
when the guard fires: it saves them to ``checkpoints/last-finite.ckpt`` and
raises ``NonFiniteError`` naming the step, the layer and the tensor. train() turns that into
results.json status "failed" and one line on stderr; loggers are finalised by Lightning as usual.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from ..errors import AttnlabError


class NonFiniteError(AttnlabError):
    pass


def _kind(t: torch.Tensor) -> str:
    return "NaN" if torch.isnan(t).any() else "Inf"


class NonFiniteGuard(L.Callback):
    def __init__(self, check_every_n_steps: int = 1):
        self.every = check_every_n_steps
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

    def on_before_backward(self, trainer, pl_module, loss):
        if self._active(trainer) and not torch.isfinite(loss).all():
            where = self._locate(pl_module) or "train/loss"
            self._fire(trainer, where, loss)

    @torch.no_grad()
    def _locate(self, pl_module) -> str | None:
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
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads or torch.isfinite(torch.nn.utils.get_total_norm(grads)):
            return  # one fused norm over all gradients: a single check per step
        for name, p in pl_module.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                self._fire(trainer, f"gradient of {name}", p.grad)

