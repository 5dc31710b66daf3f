"""The attention weights: the one place where q and k become the weight each query puts on each key.

Every consumer calls ``WeightRule.__call__``: the explicit kernels (naive, scaled), the
probabilities the maps and the head analysis read, the streaming statistics (a block of query
rows at a time) and the knockout (an edit on the mask, ``cut``). A rule holds what decides the
weights besides q and k, as the layer is configured (``Attention.weight_rule()``):

  scale      folded into the logits: s * q.k (a float, or a per-head (H,) tensor)
  bias       an additive logit bias for (query rows, keys), e.g. ALiBi's, or None
  mask       the keys each query may see (``visibility``, masks.Visibility) and key padding,
             written with the run's ``mask_fill``; with ``cut``, the knocked-out edges too
  normalize  a name in the registry (attention/normalizations.py): softmax, sigmoid, ...; its
             function gets the masked logits and n, ``context_keys``: the keys a query sees at the
             layer's full context, fixed so that a token's weights do not depend on how long the
             forward is (a KV cache, a short prompt and a full training forward agree); None: the
             keys of this forward
  escape     with a normalization that takes one (softmax), (H,) logits of an extra slot whose value
             is zero: it takes exp(b) / (exp(b) + sum_j exp(s_ij)), so the real keys get 1 - escape
  groups     k with fewer heads than q (grouped-query attention) is broadcast: query head h reads
             key/value head h // (H / H_kv), as SDPA's ``enable_gqa`` does

Rows with no visible key get zero weight everywhere (SDPA outputs zeros there). Nothing here
assumes a row sums to 1: ``Weights.mass`` says what it sums to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from attnlab.attention.masks import CAUSAL, Visibility, fill_value
from attnlab.attention.normalizations import normalization

Bias = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def expand_kv(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, H_kv, T, d) -> (B, n_head, T, d): each key/value head repeated for its group of query heads."""
    groups = n_head // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def per_head(scale: float | torch.Tensor, like: torch.Tensor) -> float | torch.Tensor:
    """A per-head (H,) scale shaped to multiply (B, H, ., .) tensors; a float as it is."""
    return scale.to(like.dtype).view(1, -1, 1, 1) if torch.is_tensor(scale) else scale


def with_escape(logits: torch.Tensor, escape: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked logits (B, H, r, T) and (H,) escape logits -> (weights on the real keys, escape mass
    (B, H, r)). A row with no visible key puts all its weight on the escape."""
    column = escape.to(logits.dtype).view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    p = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)
    return p[..., :-1], p[..., -1]


class Weights(NamedTuple):
    p: torch.Tensor  # (B, H, r, T) the weight on each real key
    logits: torch.Tensor  # (B, H, r, T) s * q.k + bias; masked entries hold the fill value
    visible: torch.Tensor  # (B|1, 1, r, T) bool: the keys each query may see (before any cut)

    @property
    def mass(self) -> torch.Tensor:
        """(B, H, r): what each row's weights on the real keys sum to (1 for plain softmax)."""
        return self.p.sum(-1)


@dataclass(frozen=True, kw_only=True)
class WeightRule:
    """What decides the weights besides q and k (module docstring); call it on q, k."""

    scale: float | torch.Tensor = 1.0
    visibility: Visibility = CAUSAL  # the keys a query sees
    mask_fill: str = "-inf"
    normalize: str = "softmax"
    escape: torch.Tensor | None = None  # (H,) escape logits, softmax only
    bias: Bias | None = None
    context_keys: int | None = None  # the n every normalization gets (module docstring)

    def detached(self) -> WeightRule:
        """The same rule with its scale and escape logits detached in fp32: what measurements use."""
        if not torch.is_tensor(self.scale) and self.escape is None:
            return self
        return replace(
            self,
            scale=self.scale.detach().float() if torch.is_tensor(self.scale) else self.scale,
            escape=None if self.escape is None else self.escape.detach().float(),
        )

    def head(self, h: int) -> WeightRule:
        """The rule of head ``h`` alone, for q of one head (B, 1, r, d): its scale, escape logit
        and bias (a knockout of one head computes only that head's weights)."""

        def one_head(x):  # a per-head tensor (H, ...) or a bias (H, r, T); a float or None as it is
            return x[h : h + 1] if torch.is_tensor(x) and x.shape[0] > 1 else x

        bias = None if self.bias is None else (lambda rows, keys: one_head(self.bias(rows, keys)))
        return replace(self, scale=one_head(self.scale), escape=one_head(self.escape), bias=bias)

    @property
    def rows_sum_to_one(self) -> bool:
        return normalization(self.normalize).rows_sum_to_one and self.escape is None

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        rows: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        cut: torch.Tensor | None = None,
    ) -> Weights:
        """q (B, H, r, d) at positions ``rows`` (default: the last r of the T key positions),
        k (B, H_kv, T, d); ``cut`` (B, H|1, r, T) bool: edges to remove, as if masked."""
        t = k.shape[-2]
        keys = torch.arange(t, device=q.device)
        if rows is None:
            rows = keys[t - q.shape[-2] :]
        logits = (q @ expand_kv(k, q.shape[1]).transpose(-2, -1)) * per_head(self.scale, q)
        extra = self.bias(rows, keys) if self.bias is not None else None
        if extra is not None:
            logits = logits + extra.to(logits.dtype)
        mask = self.visibility.mask(q.shape[-2], t, key_padding_mask, q.device, rows)
        visible = mask if mask is not None else torch.ones(1, 1, len(rows), t, dtype=torch.bool, device=q.device)
        if mask is not None:
            logits = logits.masked_fill(~mask, fill_value(self.mask_fill, logits.dtype))
        scores = logits if cut is None else logits.masked_fill(cut, float("-inf"))
        if self.escape is not None:
            p = with_escape(scores, self.escape)[0]
        else:
            p = normalization(self.normalize).weights(scores, self.context_keys or t)
        if self.escape is None and (key_padding_mask is not None or cut is not None):
            kept = visible if cut is None else visible & ~cut
            p = p.masked_fill(~kept.any(-1, keepdim=True), 0.0)  # no key left: zero weight, not NaN
        return Weights(p, logits, visible)
