"""Stop at the first NaN/Inf in a loss, the logits or an attention output, keeping the last finite state.

Checks run in forward hooks and before the optimizer step, so the parameters are still those of
the last finite step when the guard fires: it saves them to ``checkpoints/last-finite.ckpt`` and
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
        self._handles: list = []
        self.checkpoint_path: Path | None = None

    def _active(self, trainer) -> bool:
        return trainer.training and self.every > 0 and trainer.global_step % self.every == 0

    def _fire(self, trainer: L.Trainer, where: str, tensor: torch.Tensor):
        step = trainer.global_step
        path = Path(trainer.default_root_dir) / "checkpoints" / "last-finite.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(path)
        self.checkpoint_path = path
        raise NonFiniteError(f"{_kind(tensor)} in {where} at step {step}; last finite state saved to {path}")

    def on_fit_start(self, trainer, pl_module):
        model = pl_module.model

        def attn_hook(index):
            def hook(module, args, output):
                if self._active(trainer) and not torch.isfinite(output).all():
                    self._fire(trainer, f"layer {index} attention output (attn/L{index})", output)
            return hook

        def logits_hook(module, args, output):
            if self._active(trainer) and not torch.isfinite(output).all():
                self._fire(trainer, "logits (lm_head output)", output)

        self._handles = [layer.register_forward_hook(attn_hook(i)) for i, layer in enumerate(model.attention_layers())]
        self._handles.append(model.lm_head.register_forward_hook(logits_hook))

    def on_before_backward(self, trainer, pl_module, loss):
        if self._active(trainer) and not torch.isfinite(loss).all():
            self._fire(trainer, "train/loss", loss)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if not self._active(trainer):
            return
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads or torch.isfinite(torch.nn.utils.get_total_norm(grads)):
            return  # one fused norm over all gradients: a single check per step
        for name, p in pl_module.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                self._fire(trainer, f"gradient of {name}", p.grad)

    def teardown(self, trainer, pl_module, stage):
        for handle in self._handles:
            handle.remove()
        self._handles = []
