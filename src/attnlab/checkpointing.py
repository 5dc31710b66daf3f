"""Checkpoints that survive being killed mid-write, and the state needed to resume bit for bit.

Lightning's TorchCheckpointIO writes the target file in place, so a kill during a save leaves a
truncated ``last.ckpt``. ``AtomicCheckpointIO`` writes to a temp file in the same directory, fsyncs
it and renames it over the target: a reader sees the old checkpoint or the new one, never half.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .results import atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_file(path, "wb") as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        # everything attnlab stores is tensors and plain Python values: no pickled objects needed
        return super().load_checkpoint(path, map_location=map_location, weights_only=True if weights_only is None else weights_only)


def rng_state() -> dict[str, Any]:
    """Global RNG states as tensors and plain values (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
