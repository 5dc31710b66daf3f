"""Scaling rules: the factor s in softmax(s * q.k^T).

The rule is orthogonal to the backend: explicit kernels multiply the logits by s, SDPA takes
``scale=s``, flash-attn takes ``softmax_scale=s``. A learned (per-head) scale is a tensor and is
folded into q instead, since the fused kernels accept only a float.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SCALINGS = ("none", "inv_sqrt_d", "inv_d", "sigma", "learned")


def qk_component_std(init_std: float | str, d_model: int, qk_norm: bool) -> float:
    """Std of one q (or k) component at initialisation, for inputs of unit variance.

    The input to the q/k projections is LayerNorm'd (unit variance per component), so
    q_j = sum_i W_ji x_i has variance d_model * init_std^2. With ``fan_in`` init
    (std 1/sqrt(d_model)) that is 1; with qk_norm, q itself is LayerNorm'd, so also 1.
    """
    if qk_norm or init_std == "fan_in":
        return 1.0
    return float(init_std) * math.sqrt(d_model)


def static_scale(rule: str, d_k: int, sigma_q: float = 1.0, sigma_k: float = 1.0) -> float:
    """The fixed scale of a rule (``learned`` starts at 1/sqrt(d_k))."""
    if rule == "none":
        return 1.0
    if rule in ("inv_sqrt_d", "learned"):
        return 1.0 / math.sqrt(d_k)
    if rule == "inv_d":
        return 1.0 / d_k
    if rule == "sigma":
        return 1.0 / (sigma_q * sigma_k * math.sqrt(d_k))
    raise ValueError(f"unknown scaling rule {rule!r}; expected one of {', '.join(SCALINGS)}")


class Scale(nn.Module):
    """Returns the softmax scale: a float, or a (n_head,) tensor for ``learned``.

    The learned temperature is parametrised in log space so it stays positive.
    """

    def __init__(self, rule: str, d_k: int, n_head: int, sigma_q: float = 1.0, sigma_k: float = 1.0):
        super().__init__()
        self.rule = rule
        self.value = static_scale(rule, d_k, sigma_q, sigma_k)
        if rule == "learned":
            self.log_scale = nn.Parameter(torch.full((n_head,), math.log(self.value)))

    def forward(self) -> float | torch.Tensor:
        return self.log_scale.exp() if self.rule == "learned" else self.value

    def extra_repr(self) -> str:
        return f"rule={self.rule}, init={self.value:.4g}"
