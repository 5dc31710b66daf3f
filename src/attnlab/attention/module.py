"""The attention layer the model calls: backend, scaling, normalisation, ALiBi bias, escape slot and
key/value groups chosen by config (``AttentionConfig``, passed whole)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .backends import BACKENDS, attend
from .masks import MASK_FILLS
from .position import alibi_bias, alibi_slopes
from .scaling import SCALINGS, Scale
from .sink import ESCAPES, SinkLogit
from .weights import NORMALIZATIONS, WeightRule, Weights, expand_kv


def choice(default, choices: tuple, doc: str):
    """A config field with its accepted values: config_checks and the W&B axes read them here."""
    return field(default=default, metadata={"choices": choices, "doc": doc})


@dataclass
class AttentionConfig:
    """``model.attention``, the schema: how each head turns q, k, v into its output. The config
    checks (config_checks.py) and the W&B grouping axes (train.AXES) are derived from these fields."""

    backend: str = choice("scaled", BACKENDS, "the kernel; the attention= group sets it with its default scaling")
    scaling: str = choice("inv_sqrt_d", SCALINGS, "the factor s in s * q.k")
    qk_norm: bool = choice(False, (False, True), "LayerNorm on q and k per head")
    mask_fill: str = field(default="-inf", metadata={"doc": "what masked logits hold: " + ", ".join(MASK_FILLS)
                                                        + " or another negative number"})
    normalize: str = choice("softmax", NORMALIZATIONS, "how a row of logits becomes weights; sigmoid on naive and scaled only")
    escape: str = choice("none", ESCAPES, "an escape slot per head: zero_logit (softmax plus one) or learned")
    sink: str | None = field(default=None, metadata={"renamed_to": "escape", "doc": "the escape slot's old name, "
                                                     "read until the next release"})

    def __post_init__(self):
        if self.sink is not None:  # the old key (checkpoints and configs written before the rename)
            self.escape, self.sink = self.sink, None


@dataclass
class Knockout:
    """Edges to cut in one head (None: every head) of a layer: (B, T, T) bool, True = cut. The
    head's weights are recomputed without them, in fp32, as the layer normalises (a softmax row
    renormalises over the keys left, a sigmoid row keeps its other weights); other heads' outputs
    are left as the kernel computed them."""

    edges: torch.Tensor
    head: int | None = None


class Attention(nn.Module):
    """normalize(s * q.k^T + bias + M) v over (B, H, T, d_k) queries and (B, H_kv, T, d_k) keys and
    values, with an optional escape slot.

    ``weight_rule()`` is everything besides q and k that decides the weights, and ``weights(q, k,
    rows)`` computes them for any block of query rows (attention/weights.py): the explicit kernels,
    the statistics, the maps and the head analysis all read them from there. Set ``knockout`` to
    cut edges on that same path. ``kernel`` names the kernel that ran in the last forward.
    """

    def __init__(self, cfg: AttentionConfig, n_head: int, d_k: int, n_kv_head: int | None = None,
                 sigma_q: float = 1.0, sigma_k: float = 1.0, dropout: float = 0.0, causal: bool = True,
                 alibi: bool = False):
        super().__init__()
        if cfg.normalize not in NORMALIZATIONS:
            raise ValueError(f"model.attention.normalize={cfg.normalize!r}; expected one of {', '.join(NORMALIZATIONS)}")
        self.cfg, self.dropout, self.causal = cfg, dropout, causal
        self.n_head, self.n_kv_head = n_head, n_kv_head or n_head
        self.scale = Scale(cfg.scaling, d_k, n_head, sigma_q, sigma_k)
        if alibi:  # not persistent: fixed by n_head, so checkpoints hold only what trains
            self.register_buffer("alibi_slopes", alibi_slopes(n_head), persistent=False)
        else:
            self.alibi_slopes = None
        self.sink = SinkLogit(cfg.escape, n_head) if cfg.escape != ESCAPES[0] else None
        self.knockout: Knockout | None = None
        self.kernel: str | None = None  # the last forward's kernel (a probe's too)
        self.training_kernels: list[str] = []  # kernels of the training forwards, in order of first use

    @property
    def backend(self) -> str:
        return self.cfg.backend

    def softmax_scale(self) -> float | torch.Tensor:
        return self.scale.forward()  # called as a method: a module call's hook machinery, every layer every step, buys nothing here

    def logit_bias(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """The additive logit bias (H, len(rows), len(keys)) for these query and key positions
        (ALiBi), or None."""
        if self.alibi_slopes is None:
            return None
        return alibi_bias(self.alibi_slopes.to(rows.device), rows, keys)

    def sink_logit(self) -> torch.Tensor | None:
        """The per-head escape logit (H,), or None without an escape slot."""
        return None if self.sink is None else self.sink()

    def weight_rule(self, fp32: bool = False) -> WeightRule:
        """The scale, bias, mask and normalisation of this layer as it is now (``fp32``: detached
        fp32 parameters, for measurements)."""
        rule = WeightRule(self.softmax_scale(), self.causal, self.cfg.mask_fill, self.cfg.normalize, self.sink_logit(),
                          self.logit_bias if self.alibi_slopes is not None else None)
        return rule.detached() if fp32 else rule

    @torch.no_grad()
    def weights(self, q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, cut: torch.Tensor | None = None) -> Weights:
        """The layer's weights for query rows ``rows`` in fp32 (autocast off: a probe under
        bf16-mixed captures bf16 q, k, but the weights are measured in fp32)."""
        with torch.autocast(q.device.type, enabled=False):
            return self.weight_rule(fp32=True)(q.float(), k.float(), rows, key_padding_mask, cut)

    def probabilities(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """fp32 weights (B, H, Tq, Tk) on the real keys; a row sums to what the rule makes it (1
        for softmax, 1 - escape with an escape slot, anything for sigmoid); rows with no visible
        key are zero."""
        return self.weights(q, k).p

    def forward(self, q, k, v, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.cfg
        bias = None if self.alibi_slopes is None else self.logit_bias(
            torch.arange(k.shape[-2] - q.shape[-2], k.shape[-2], device=q.device), torch.arange(k.shape[-2], device=q.device))
        out, kernel = attend(cfg.backend, q, k, v, self.softmax_scale(), causal=self.causal,
                             key_padding_mask=key_padding_mask, mask_fill=cfg.mask_fill,
                             dropout_p=self.dropout if self.training else 0.0, bias=bias,
                             normalize=cfg.normalize, escape=self.sink_logit())
        if self.knockout is not None:
            if q.shape[-2] != k.shape[-2]:
                raise ValueError("Attention.knockout cuts (B, T, T) edges of a full forward; it takes no KV cache")
            out = self._knocked_out(out, q, k, v, key_padding_mask)
        self.kernel = kernel
        if self.training and torch.is_grad_enabled() and kernel not in self.training_kernels:
            self.training_kernels.append(kernel)  # probes run in eval mode under no_grad: never counted
        return out

    @torch.no_grad()
    def _knocked_out(self, out, q, k, v, key_padding_mask) -> torch.Tensor:
        """``out`` with the knocked-out head's (or every head's) output recomputed without the cut
        edges; only those heads' weights are computed."""
        cut = self.knockout.edges.to(q.device).unsqueeze(1)  # (B, 1, T, T)
        h = self.knockout.head
        rule = self.weight_rule(fp32=True)
        if h is not None:  # one query head and the key/value head of its group
            group = h // (self.n_head // self.n_kv_head)
            q, k, v, rule = q[:, h:h + 1], k[:, group:group + 1], v[:, group:group + 1], rule.head(h)
        out = out.clone()
        with torch.autocast(q.device.type, enabled=False):
            p = rule(q.float(), k.float(), key_padding_mask=key_padding_mask, cut=cut).p
            edited = (p @ expand_kv(v.float(), q.shape[1])).to(out.dtype)
        out[:, slice(None) if h is None else slice(h, h + 1)] = edited
        return out

    def extra_repr(self) -> str:
        cfg = self.cfg
        extras = "".join([", alibi" if self.alibi_slopes is not None else "",
                          f", normalize={cfg.normalize}" if cfg.normalize != "softmax" else "",
                          f", n_kv_head={self.n_kv_head}" if self.n_kv_head != self.n_head else ""])
        return f"backend={cfg.backend}, mask_fill={cfg.mask_fill}, causal={self.causal}{extras}"
