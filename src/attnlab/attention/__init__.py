"""The heart of attnlab: attention backends, scaling rules, the weight rule, masks and streaming statistics."""

from attnlab.attention.backends import BACKENDS, DEFAULT_SCALING, attend
from attnlab.attention.config import GATES, AttentionConfig, LatentConfig
from attnlab.attention.masks import MASK_FILLS, Visibility, allowed_mask, fill_value
from attnlab.attention.module import Attention, AttentionLayer, Intermediates, Knockout
from attnlab.attention.normalizations import NORMALIZATIONS
from attnlab.attention.scaling import SCALINGS, Scale, qk_component_std, static_scale
from attnlab.attention.weights import WeightRule, Weights

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
    "LatentConfig",
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
