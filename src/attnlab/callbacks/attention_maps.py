"""Attention heatmaps (layers x heads) of one probe sequence, every M steps and at the end.

Saved as ``attention_maps/step{N}.png`` in the run dir and logged as an image to W&B.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from .cadence import should_run
from .probe import probe, probe_batch, training_precision


def plot_attention_maps(probs: list[torch.Tensor], path: Path, title: str) -> Path:
    """One heatmap per layer (rows) and head (columns); ``probs[i]`` is (H, T, T)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layer, n_head = len(probs), probs[0].shape[0]
    width, height = 2.2 * n_head, 2.2 * n_layer
    fig, axes = plt.subplots(n_layer, n_head, figsize=(width, height), squeeze=False)
    for i, layer in enumerate(probs):
        for h in range(n_head):
            ax = axes[i][h]
            ax.imshow(layer[h].cpu().numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"L{i} H{h}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    # fixed margins in inches (titles only, no ticks): tight_layout would draw the figure twice
    fig.subplots_adjust(left=0.1 / width, right=1 - 0.1 / width, bottom=0.1 / height, top=1 - 0.65 / height,
                        wspace=0.1, hspace=0.25)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


class AttentionMaps(L.Callback):
    def __init__(self, every_n_steps: int = 500, max_tokens: int = 64):
        self.every_n_steps, self.max_tokens = every_n_steps, max_tokens
        self.saved_step: int | None = None

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Path | None:
        if not trainer.is_global_zero or not trainer.default_root_dir:
            return None
        x = probe_batch(trainer, 1)[:, : self.max_tokens].to(pl_module.device)
        probs = [rec.layer.probabilities(rec.q, rec.k)[0] for rec in probe(pl_module.model, x, training_precision(trainer))]
        step = trainer.global_step
        path = plot_attention_maps(probs, Path(trainer.default_root_dir) / "attention_maps" / f"step{step}.png", f"step {step}")
        self.saved_step = step
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="attn/maps", images=[str(path)], step=step)
        return path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > 1 and should_run(trainer, self.every_n_steps):
            self.save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        if self.saved_step != trainer.global_step:  # the last step's maps may be drawn already
            self.save(trainer, pl_module)
