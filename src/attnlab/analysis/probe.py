"""The probe pass shared by the measurement callbacks: one ``ProbeRecord`` per layer.

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

from attnlab.attention import Intermediates
from attnlab.model import GPT

# What one attention layer saw and did in a probe forward; what every measurement reads: q, k, v
# as they reach the kernel, ``out`` the heads' outputs entering the output projection,
# ``residual`` the block's output, ``layer`` the Attention module (attention/module.py, Intermediates).
ProbeRecord = Intermediates


@contextmanager
def capture(model: GPT):
    """Collect one ProbeRecord per attention layer of each forward, in layer order: every layer
    records its own intermediates into one list while the block is open."""
    records: list[ProbeRecord] = []
    layers = model.attention_layers()
    for layer in layers:
        layer.record_to = records
    try:
        yield records
    finally:
        for layer in layers:
            layer.record_to, layer.intermediates = None, None


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
def probe_with_logits(
    model: GPT, x: torch.Tensor, precision: Precision = nullcontext
) -> tuple[list[ProbeRecord], torch.Tensor]:
    """Run ``x`` through the model in eval mode (restored afterwards) and in ``precision``: one
    ProbeRecord per layer, and the logits."""
    with eval_mode(model), capture(model) as records, precision():
        logits, _ = model(x)
    return records, logits


def probe(model: GPT, x: torch.Tensor, precision: Precision = nullcontext) -> list[ProbeRecord]:
    """One ProbeRecord per layer for ``x``, in eval mode."""
    return probe_with_logits(model, x, precision)[0]


def probe_plan(
    probe_size: int, t: int, max_tokens: int | None, max_rows: int | None
) -> tuple[int, torch.Tensor | None]:
    """How many probe sequences, and which query positions (None: all), keep a measurement's cost
    bounded at any block size: at most ``max_tokens`` probe tokens (never fewer than one sequence)
    and ``max_rows`` evenly spaced query positions per sequence, so its cost grows like T, as a
    fused training step's does, not like T^2. Up to T = max_tokens / probe_size and T = max_rows
    nothing changes."""
    n = probe_size if max_tokens is None else max(1, min(probe_size, max_tokens // t))
    if max_rows is None or t <= max_rows:
        return n, None
    return n, torch.linspace(0, t - 1, max_rows).round().long().unique()


def probe_batch(trainer: L.Trainer, size: int) -> torch.Tensor:
    """A fixed probe batch from the data module (the same for every run of a data config).

    Built from the datasets directly: iterating a DataLoader would draw from the global RNG.
    """
    return trainer.datamodule.probe_batch(size)
