"""The composed config settled before it is recorded and gated: old key names moved to their new
ones, and ``trainer.precision=auto`` written as what this device supports. The run's results.json, its
training fingerprint and the report's view of a cell all read the settled config, so they agree."""

from __future__ import annotations

from omegaconf import DictConfig, open_dict

from attnlab.config.schema import apply_renamed_keys
from attnlab.training.devices import resolve_precision


def settle(cfg: DictConfig) -> list[str]:
    """Settle ``cfg`` in place; one notice line per change a user should hear of."""
    notes = apply_renamed_keys(cfg)
    precision, note = resolve_precision(cfg.trainer.get("precision", "32"), str(cfg.trainer.get("accelerator", "auto")))
    with open_dict(cfg):
        cfg.trainer.precision = precision
    return [*notes, *([note] if note else [])]
