"""The heart of attnlab: attention backends, scaling rules, masks and streaming statistics."""
from .backends import BACKENDS, DEFAULT_SCALING, attend, attention_logits, attention_probs
from .masks import MASK_FILLS, allowed_mask, fill_value
from .module import Attention
from .scaling import SCALINGS, Scale, qk_component_std, static_scale

__all__ = [
    "BACKENDS", "DEFAULT_SCALING", "MASK_FILLS", "SCALINGS", "Attention", "Scale", "allowed_mask",
    "attend", "attention_logits", "attention_probs", "fill_value", "qk_component_std", "static_scale",
]
