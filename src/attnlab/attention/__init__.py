"""The heart of attnlab: attention backends, scaling rules, the weight rule, masks and streaming statistics."""

from .backends import BACKENDS, DEFAULT_SCALING, attend
from .masks import MASK_FILLS, Visibility, allowed_mask, fill_value
from .module import GATES, Attention, AttentionConfig, AttentionLayer, Intermediates, Knockout
from .scaling import SCALINGS, Scale, qk_component_std, static_scale
from .weights import NORMALIZATIONS, WeightRule, Weights

__all__ = [
    "BACKENDS",
    "DEFAULT_SCALING",
    "GATES",
    "MASK_FILLS",
    "NORMALIZATIONS",
    "SCALINGS",
    "Attention",
    "AttentionConfig",
    "AttentionLayer",
    "Intermediates",
    "Knockout",
    "Scale",
    "Visibility",
    "WeightRule",
    "Weights",
    "allowed_mask",
    "attend",
    "fill_value",
    "qk_component_std",
    "static_scale",
]
