"""The softmax escape: one extra logit per head whose value vector is zero, so a head may put
weight nowhere (the sink's cause under test: "softmax must sum to one"; MECHANISMS.md).

``model.attention.escape`` picks one of ESCAPES (``model.attention.sink``, its old name, is read
until the next release: every metric called sink means the first-token phenomenon, not this slot):
  none        plain softmax over the visible keys
  zero_logit  p_ij = exp(s_ij) / (1 + sum_j' exp(s_ij'))  (softmax plus one: the slot's logit is 0)
  learned     the same with a learned per-head logit b_h in place of 0 (initialised at 0)
The weight that goes nowhere, exp(b) / (exp(b) + sum_j exp(s_ij)), is the escape mass; the weights
on the real keys then sum to 1 - escape.

Routes, one per kind of kernel (each tested against a float64 reference, gradients included):
  naive, scaled  the escape is part of the weight rule (weights.with_escape): b appended to each
                 row of logits, softmax, column dropped
  sdpa, flash    an extra key (``slot_key_attention``): q gains a component fixed at 1, k a component
                 that is 0 for real keys and b / s for the slot key (value 0), padded to a head dim
                 that is a multiple of 8; the slot key goes first, behind a dummy query row, so a
                 square top-left causal mask (is_causal, no explicit mask: the forced flash kernel
                 takes none) lets query i see the slot and keys 0..i; the dummy row's output is
                 dropped. Fewer queries than keys (new queries over a KV cache) stay right:
                 every kernel aligns causal bottom-right, so the last query still sees every key
                 and the slot. With key/value groups, k and v are expanded to every query head
                 first (the slot's logit is per query head). A single query (a cached decoding
                 step) takes the explicit route instead (backends.attend): the same
                 matrix-vector work, without copying the whole cache to pad it.
The log-sum-exp route (out * sigmoid(lse - b)) is not used: PyTorch's fused kernels return an lse
that carries no gradient (checked on torch 2.13 CPU), so b and q, k would not train through it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention.masks import CAUSAL
from attnlab.attention.weights import expand_kv, per_head

ESCAPES = ("none", "zero_logit", "learned")


class EscapeLogit(nn.Module):
    """The per-head escape logit b: a parameter for ``learned``, a fixed zero for ``zero_logit``
    (a non-persistent buffer, so checkpoints hold only what trains)."""

    def __init__(self, kind: str, n_head: int):
        super().__init__()
        if kind not in ESCAPES or kind == "none":
            raise ValueError(f"model.attention.escape={kind!r}; expected one of {', '.join(ESCAPES)}")
        self.kind = kind
        if kind == "learned":
            self.logit = nn.Parameter(torch.zeros(n_head))
        else:
            self.register_buffer("logit", torch.zeros(n_head), persistent=False)

    def forward(self) -> torch.Tensor:
        return self.logit

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


def slot_key_attention(
    kernel,
    q,
    k,
    v,
    scale,
    escape,
    visibility=CAUSAL,
    key_padding_mask=None,
    mask_fill="-inf",
    dropout_p=0.0,
    bias=None,
) -> tuple[torch.Tensor, str]:
    """A fused ``kernel`` (backends.KERNELS) with an escape slot of logit ``escape`` (H,) in every
    head, as an extra key: (output, kernel that ran). ``visibility`` (masks.Visibility) says how the
    padded keys are seen (``behind_slot``)."""
    if torch.is_tensor(scale):  # a per-head scale is folded into q, as the fused kernels want a float
        q, scale = q * per_head(scale, q), 1.0
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    b, h, t, d = q.shape
    t_k = k.shape[-2]
    # one query (a cached decoding step) sees every key: no mask, no dummy row
    visibility = replace(visibility, causal=visibility.causal and t > 1)
    lead = 1 if visibility.causal else 0  # the dummy query row in front of the queries
    width = d + 8 - d % 8  # d + 1 components, rounded up to a multiple of 8 (fused CUDA kernels need it)
    qp = q.new_zeros(b, h, t + lead, width)
    qp[:, :, lead:, :d], qp[:, :, lead:, d] = q, 1.0
    kp = k.new_zeros(b, h, t_k + 1, width)
    kp[:, :, 1:, :d] = k
    kp[:, :, 0, d] = (escape.to(k.dtype) / scale).view(1, h)
    vp = v.new_zeros(b, h, t_k + 1, width)
    vp[:, :, 1:, : v.shape[-1]] = v
    if key_padding_mask is not None:
        key_padding_mask = F.pad(key_padding_mask.to(torch.bool), (1, 0), value=True)
    if bias is not None:
        bias = F.pad(bias, (1, 0, lead, 0))  # the slot's logit comes from its key alone
    out, name = kernel(
        qp,
        kp,
        vp,
        scale,
        visibility=visibility.behind_slot(),
        key_padding_mask=key_padding_mask,
        mask_fill=mask_fill,
        dropout_p=dropout_p,
        bias=bias,
    )
    return out[:, :, lead:, : v.shape[-1]], name
