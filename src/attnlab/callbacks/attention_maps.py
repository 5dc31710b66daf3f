"""Attention heatmaps (layers x heads) of one probe sequence, every M steps and at the end.

Saved as ``attention_maps/step{N}.png`` in the run dir and logged as an image to W&B.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from attnlab.analysis.panels import colored, image_axes, new_figure, save, tile
from attnlab.analysis.probe import probe, probe_batch, training_precision
from attnlab.callbacks.cadence import should_run


def plot_attention_maps(probs: list[torch.Tensor], path: Path, title: str) -> Path:
    """One heatmap per layer (rows) and head (columns), 2 in square, in one image
    (``analysis.panels``); ``probs[i]`` is (H, T, T)."""

    n_head, t = probs[0].shape[0], probs[0].shape[-1]
    panels = [colored(layer[h].float().cpu().numpy(), "viridis", 0, 1) for layer in probs for h in range(n_head)]
    image, corners = tile(panels, n_head, 0.05 * t, 0.15 * t)  # below each row: room for the next row's labels
    scale = 2.0 / t  # inches per pixel of the probe
    left, right, bottom, top = 0.1, 0.1, 0.1, 0.65  # inches: the title and the first row's labels on top
    width, height = left + right + scale * image.shape[1], bottom + top + scale * image.shape[0]
    fig = new_figure(width, height)
    ax = image_axes(
        fig, image, (left / width, bottom / height, 1 - (left + right) / width, 1 - (bottom + top) / height)
    )
    for k, (x0, y0) in enumerate(corners):
        ax.text(
            x0 + (t - 1) / 2,
            y0 - 0.5 - 0.04 / scale,
            f"L{k // n_head} H{k % n_head}",
            fontsize=8,
            ha="center",
            va="bottom",
            clip_on=False,
        )
    fig.suptitle(title, fontsize=9)
    return save(fig, path, dpi=80)


class AttentionMaps(L.Callback):
    def __init__(self, every_n_steps: int = 500, max_tokens: int = 64):
        self.every_n_steps, self.max_tokens = every_n_steps, max_tokens
        self.saved_step: int | None = None

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Path | None:
        if not trainer.is_global_zero or not trainer.default_root_dir:
            return None
        x = probe_batch(trainer, 1)[:, : self.max_tokens].to(pl_module.device)
        probs = [
            rec.layer.probabilities(rec.q, rec.k)[0] for rec in probe(pl_module.model, x, training_precision(trainer))
        ]
        step = trainer.global_step
        path = plot_attention_maps(
            probs, Path(trainer.default_root_dir) / "attention_maps" / f"step{step}.png", f"step {step}"
        )
        self.saved_step = step
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="attn/maps", images=[str(path)], step=step, caption=[f"step {step}"])
        return path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > 1 and should_run(trainer, self.every_n_steps, batch_idx):
            self.save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        if self.saved_step != trainer.global_step:  # the last step's maps may be drawn already
            self.save(trainer, pl_module)
