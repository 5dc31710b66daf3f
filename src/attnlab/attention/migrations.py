"""Checkpoint keys of earlier layouts, read as the attention modules name them: each function renames
``state_dict``'s entries under ``prefix`` in place, before the module loads them."""

from __future__ import annotations

import torch

QKV_NAMES = ("q", "k", "v")


def attention_keys(state_dict: dict, prefix: str) -> None:
    """``Attention``: the escape slot's logit saved as ``sink.logit`` is ``escape.logit``."""
    if prefix + "sink.logit" in state_dict:
        state_dict[prefix + "escape.logit"] = state_dict.pop(prefix + "sink.logit")


def layer_keys(state_dict: dict, prefix: str) -> None:
    """``AttentionLayer``: ``attn.*`` (a learned scale or escape logit) is ``attention.*``, and separate
    ``q_proj``, ``k_proj``, ``v_proj`` weights are the rows of ``qkv_proj``, in that order."""
    for key in [k for k in state_dict if k.startswith(prefix + "attn.")]:
        state_dict[prefix + "attention." + key[len(prefix) + 5 :]] = state_dict.pop(key)
    parts = [prefix + f"{name}_proj.weight" for name in QKV_NAMES]
    if all(key in state_dict for key in parts):
        state_dict[prefix + "qkv_proj.weight"] = torch.cat([state_dict.pop(key) for key in parts])
