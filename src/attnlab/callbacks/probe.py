"""The probe pass shared by the measurement callbacks: q, k and scale of every layer.

Measurement forwards run in the trainer's precision context (autocast for ``*-mixed``), so they
see the dtypes and kernels the training step sees: Lightning autocasts only inside its own
training and validation steps, and a forced flash kernel refuses fp32 inputs. The statistics
themselves are then computed in fp32 from the captured q and k (``full_precision``).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext

import lightning as L
import torch

from ..model import GPT


@contextmanager
def capture_qk(model: GPT):
    """Collect (q, k, scale) from each attention layer's forward, in layer order."""
    captured: list[tuple[torch.Tensor, torch.Tensor, float | torch.Tensor]] = []

    def hook(module, args, kwargs):
        q, k = args[0], args[1]
        captured.append((q.detach(), k.detach(), module.softmax_scale()))

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.attention_layers()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_streams(model: GPT):
    """Collect each attention layer's value vectors (B, H, T, d) and each block's output, the
    residual stream after it (B, T, d), in layer order: what the extreme-token metrics read."""
    values: list[torch.Tensor] = []
    residuals: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda m, args: values.append(args[2].detach()))
               for layer in model.attention_layers()]
    handles += [block.register_forward_hook(lambda m, args, out: residuals.append(out.detach())) for block in model.blocks]
    try:
        yield values, residuals
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def eval_mode(model: torch.nn.Module):
    """The model in eval mode (no dropout) within the block, its previous mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


Precision = Callable[[], AbstractContextManager]


def training_precision(trainer: L.Trainer | None) -> Precision:
    """The context the trainer runs its forwards in (autocast for ``*-mixed``; nothing for 32)."""
    plugin = getattr(trainer, "precision_plugin", None)
    return plugin.forward_context if plugin is not None else nullcontext


def full_precision(device: torch.device | str) -> AbstractContextManager:
    """Autocast off: probabilities and scores are computed in fp32 even inside a mixed-precision context."""
    return torch.autocast(torch.device(device).type, enabled=False)


@torch.no_grad()
def probe_with_logits(model: GPT, x: torch.Tensor, precision: Precision = nullcontext):
    """Run ``x`` through the model in eval mode (restored afterwards) and in ``precision``:
    per-layer (q, k, scale), and the logits."""
    with eval_mode(model), capture_qk(model) as captured, precision():
        logits, _ = model(x)
    return [(q, k, s.detach() if torch.is_tensor(s) else s) for q, k, s in captured], logits


def probe(model: GPT, x: torch.Tensor, precision: Precision = nullcontext) -> list[tuple[torch.Tensor, torch.Tensor, float | torch.Tensor]]:
    """Per-layer (q, k, softmax scale) of ``x`` in eval mode."""
    return probe_with_logits(model, x, precision)[0]


def probe_batch(trainer: L.Trainer, size: int) -> torch.Tensor:
    """A fixed probe batch from the data module (the same for every run of a data config).

    Built from the datasets directly: iterating a DataLoader would draw from the global RNG.
    """
    return trainer.datamodule.probe_batch(size)
