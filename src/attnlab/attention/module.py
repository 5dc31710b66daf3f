"""The attention layer: input -> fused q/k/v projection -> q/k norms -> positions -> weights and
kernel -> gate -> output projection, every variant a field of ``AttentionConfig`` (passed whole).

``AttentionLayer`` owns the layer (its input and output are the residual stream's width);
``Attention`` inside it owns what turns q, k, v into the heads' outputs (backend, scaling,
normalisation, window, ALiBi bias, escape slot, key/value groups, the differential map). What a
measurement reads is written once, where it is computed, into one ``Intermediates`` record per
forward when the layer is asked to record (analysis/probe.py asks). Latent attention's projections and
its two decode forms are attention/latent.py; checkpoint keys of earlier layouts, attention/migrations.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention import migrations
from attnlab.attention.backends import attend
from attnlab.attention.config import AttentionConfig, latent_refusal
from attnlab.attention.latent import LatentAttention
from attnlab.attention.masks import Visibility
from attnlab.attention.position import POS_ENCODINGS, Rotary, alibi_bias, alibi_slopes
from attnlab.attention.scaling import Scale, qk_component_std
from attnlab.attention.sink import ESCAPES, EscapeLogit
from attnlab.attention.weights import WeightRule, Weights, expand_kv


class Intermediates:
    """What one layer saw and did in one forward, written where each is computed (``Attention``
    and ``AttentionLayer`` record when asked; ``Block`` adds ``residual``), detached:

      x         (B, T, d_model) the layer input (after the block's LayerNorm)
      q         (B, H, T, d) as it reaches the kernel: normed, rotated with RoPE
      k, v      (B, H_kv, T_k, d) the same, every cached key included
      attended  (B, H, T, d) the heads' outputs from the kernel, before the gate
      gate      (B, H, T, 1|d) the gate's values, or None
      out       (B, H, T, d) the heads' outputs as they enter the output projection (after the gate)
      y         (B, T, d_model) the layer's contribution to the residual stream
      residual  (B, T, d_model) the block's output
    ``layer`` is the ``Attention`` (``weight_rule()``, ``weights(q, k, rows)``), ``index`` its depth.
    """

    def __init__(self, layer: Attention, q, k, v, attended):
        self.layer, self.index = layer, layer.index
        self.q, self.k, self.v, self.attended = q, k, v, attended
        self.x = self.gate = self.gated = self.y = self.residual = None

    @property
    def out(self) -> torch.Tensor:
        return self.attended if self.gated is None else self.gated

    @property
    def scale(self) -> float | torch.Tensor:
        s = self.layer.softmax_scale()
        return s.detach() if torch.is_tensor(s) else s


@dataclass
class Knockout:
    """Edges to cut in one head (None: every head) of a layer: (B, T, T) bool, True = cut. The
    head's weights are recomputed without them, in fp32, as the layer normalises (a softmax row
    renormalises over the keys left, a sigmoid row keeps its other weights); other heads' outputs
    are left as the kernel computed them."""

    edges: torch.Tensor
    head: int | None = None


def differential_lambda_init(index: int) -> float:
    """lambda_init of the layer at depth ``index`` (0 first): 0.8 - 0.6 exp(-0.3 index) (Ye et al. 2024)."""
    return 0.8 - 0.6 * math.exp(-0.3 * index)


class Attention(nn.Module):
    """normalize(s * q.k^T + bias + M) v over (B, H, T, d_k) queries and (B, H_kv, T, d_k) keys and
    values, with an optional escape slot; M the causal mask, the sliding window and key padding.

    ``weight_rule()`` is everything besides q and k that decides the weights, and ``weights(q, k,
    rows)`` computes them for any block of query rows (attention/weights.py): the explicit kernels,
    the statistics, the maps and the head analysis all read them from there (a differential head's
    weights are its signed map A1 - lambda A2, each map by the rule; ``maps`` splits q, k into the
    two). Set ``knockout`` to cut edges on that same path. ``kernel`` names the kernel that ran in the last forward. With
    ``differential``, q and k hold the two maps' halves (d_k / 2 each) and the output is
    RMSNorm(A1 v - lambda A2 v) (1 - lambda_init). Set ``record_to`` (a list) and each forward
    appends its ``Intermediates``.
    """

    def __init__(
        self,
        cfg: AttentionConfig,
        n_head: int,
        d_k: int,
        n_kv_head: int | None = None,
        sigma_q: float = 1.0,
        sigma_k: float = 1.0,
        dropout: float = 0.0,
        causal: bool = True,
        alibi: bool = False,
        index: int = 0,
        context: int | None = None,
    ):
        super().__init__()
        self.cfg, self.dropout, self.causal, self.index = cfg, dropout, causal, index
        self.context = context  # the keys a query sees at most (the block size): sigmoid's n
        self.n_head, self.n_kv_head = n_head, n_kv_head or n_head
        if cfg.differential and d_k % 2:
            raise ValueError(
                f"model.attention.differential=true splits q and k in two halves; model.d_k={d_k} "
                "is odd; expected an even d_k"
            )
        # a differential map's logits are over d_k / 2 components: its scale is that of d_k / 2
        self.scale = Scale(cfg.scaling, d_k // 2 if cfg.differential else d_k, n_head, sigma_q, sigma_k)
        if alibi:  # not persistent: fixed by n_head, so checkpoints hold only what trains
            self.register_buffer("alibi_slopes", alibi_slopes(n_head), persistent=False)
        else:
            self.alibi_slopes = None
        self.escape = EscapeLogit(cfg.escape, n_head) if cfg.escape != ESCAPES[0] else None
        if cfg.differential:
            half = d_k // 2
            self.lambda_init = differential_lambda_init(index)
            # lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init; the vectors start at N(0, 0.1^2) as in the
            # paper, one-dimensional each so the optimizer leaves them undecayed
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, name, nn.Parameter(torch.randn(half) * 0.1))
            self.head_norm = nn.RMSNorm(d_k, eps=1e-5)
        self.knockout: Knockout | None = None
        self.record_to: list[Intermediates] | None = None
        self.intermediates: Intermediates | None = None  # the last recorded forward's
        self.kernel: str | None = None  # the last forward's kernel (a probe's too)
        self.training_kernels: list[str] = []  # kernels of the training forwards, in order of first use

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        migrations.attention_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def ran(self, kernel: str) -> None:
        """Note the kernel of this forward (``kernel``; ``training_kernels`` in a training forward)."""
        self.kernel = kernel
        if self.training and torch.is_grad_enabled() and kernel not in self.training_kernels:
            self.training_kernels.append(kernel)  # probes run in eval mode under no_grad: never counted

    @property
    def backend(self) -> str:
        return self.cfg.backend

    def softmax_scale(self) -> float | torch.Tensor:
        return (
            self.scale.forward()
        )  # called as a method: a module call's hook machinery, every layer every step, buys nothing here

    def differential_lambda(self) -> torch.Tensor:
        """The layer's lambda (a 0-dim tensor): exp(lq1.lk1) - exp(lq2.lk2) + lambda_init."""
        return (
            torch.exp((self.lambda_q1 * self.lambda_k1).sum())
            - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
            + self.lambda_init
        )

    def logit_bias(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """The additive logit bias (H, len(rows), len(keys)) for these query and key positions
        (ALiBi), or None."""
        if self.alibi_slopes is None:
            return None
        return alibi_bias(self.alibi_slopes.to(rows.device), rows, keys)

    @property
    def visibility(self) -> Visibility:
        """The keys a query sees: causality, the sliding window and its kept first tokens."""
        return Visibility(self.causal, self.cfg.window, self.cfg.window_sinks)

    def visible(self, t: int) -> torch.Tensor:
        """(t, t) bool: the keys each query of a t-token forward sees (masks.Visibility), for
        measurements that need the layer's visibility without its weights."""
        mask = self.visibility.mask(t, t)
        return torch.ones(t, t, dtype=torch.bool) if mask is None else mask[0, 0]

    def escape_logit(self) -> torch.Tensor | None:
        """The per-head escape logit (H,), or None without an escape slot."""
        return None if self.escape is None else self.escape()

    def weight_rule(self, fp32: bool = False) -> WeightRule:
        """The scale, bias, mask and normalisation of this layer as it is now (``fp32``: detached
        fp32 parameters, for measurements); a differential head applies it to each of its two maps."""
        cfg = self.cfg
        rule = WeightRule(
            scale=self.softmax_scale(),
            visibility=self.visibility,
            mask_fill=cfg.mask_fill,
            normalize=cfg.normalize,
            escape=self.escape_logit(),
            bias=self.logit_bias if self.alibi_slopes is not None else None,
            context_keys=self.context_keys(),
        )
        return rule.detached() if fp32 else rule

    def maps(self, q: torch.Tensor, k: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (q, k) of each map the weight rule makes: one, or a differential head's two halves."""
        if not self.cfg.differential:
            return [(q, k)]
        return list(zip(q.chunk(2, dim=-1), k.chunk(2, dim=-1)))

    def context_keys(self) -> int | None:
        """The n a normalization gets (sigmoid's -log n, say): the keys a query sees at the full context
        (the block, or the window and its kept first tokens), or None (the keys of each forward) without one."""
        return self.visibility.keys_seen(self.context)

    @torch.no_grad()
    def weights(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        rows: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        cut: torch.Tensor | None = None,
    ) -> Weights:
        """The layer's weights for query rows ``rows`` in fp32 (autocast off: a probe under
        bf16-mixed captures bf16 q, k, but the weights are measured in fp32)."""
        return self._weights_by(self.weight_rule(fp32=True), q, k, rows, key_padding_mask, cut)

    def _weights_by(self, rule: WeightRule, q, k, rows=None, key_padding_mask=None, cut=None) -> Weights:
        """``rule``'s weights in fp32; a differential head's are its signed map A1 - lambda A2 (the
        logits and visibility those of A1)."""
        with torch.autocast(q.device.type, enabled=False):
            maps = [rule(qm.float(), km.float(), rows, key_padding_mask, cut) for qm, km in self.maps(q, k)]
            if len(maps) == 1:
                return maps[0]
            lam = self.differential_lambda().detach().float()
            return Weights(maps[0].p - lam * maps[1].p, maps[0].logits, maps[0].visible)

    def probabilities(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """fp32 weights (B, H, Tq, Tk) on the real keys; a row sums to what the rule makes it (1
        for softmax, 1 - escape with an escape slot, anything for sigmoid); rows with no visible
        key are zero."""
        return self.weights(q, k).p

    def _attend(self, q, k, v, key_padding_mask) -> tuple[torch.Tensor, str]:
        cfg = self.cfg
        bias = (
            None
            if self.alibi_slopes is None
            else self.logit_bias(
                torch.arange(k.shape[-2] - q.shape[-2], k.shape[-2], device=q.device),
                torch.arange(k.shape[-2], device=q.device),
            )
        )
        return attend(
            cfg.backend,
            q,
            k,
            v,
            self.softmax_scale(),
            visibility=self.visibility,
            key_padding_mask=key_padding_mask,
            mask_fill=cfg.mask_fill,
            dropout_p=self.dropout if self.training else 0.0,
            bias=bias,
            normalize=cfg.normalize,
            escape=self.escape_logit(),
            context_keys=self.context_keys(),
        )

    def _map_times_v(self, q, k, v, key_padding_mask) -> tuple[torch.Tensor, str]:
        """One differential map times v (d_k wide) from q, k of d_k / 2: flash kernels want one head
        dim for q, k and v, so there v goes in two halves (the paper's flash route)."""
        if self.cfg.backend != "flash":
            return self._attend(q, k, v, key_padding_mask)
        (a, kernel), (b, _) = (self._attend(q, k, half, key_padding_mask) for half in v.chunk(2, dim=-1))
        return torch.cat([a, b], dim=-1), kernel

    def _attend_narrow_v(self, q, k, v, key_padding_mask) -> tuple[torch.Tensor, str]:
        """Flash kernels want one head dim for q, k and v: a narrower v (latent attention's, whose q
        and k also hold the RoPE part) goes in padded with zeros, and the padding is cut from the output."""
        pad = q.shape[-1] - v.shape[-1]
        if self.cfg.backend != "flash" or pad <= 0:
            return self._attend(q, k, v, key_padding_mask)
        out, kernel = self._attend(q, k, F.pad(v, (0, pad)), key_padding_mask)
        return out[..., : v.shape[-1]], kernel

    def forward(self, q, k, v, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.cfg.differential:
            (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)
            out1, kernel = self._map_times_v(q1, k1, v, key_padding_mask)
            out2, _ = self._map_times_v(q2, k2, v, key_padding_mask)
            out = self.head_norm(out1 - self.differential_lambda().to(out1.dtype) * out2) * (1 - self.lambda_init)
        else:
            out, kernel = self._attend_narrow_v(q, k, v, key_padding_mask)
        if self.knockout is not None:
            if q.shape[-2] != k.shape[-2]:
                raise ValueError("Attention.knockout cuts (B, T, T) edges of a full forward; it takes no KV cache")
            out = self._knocked_out(out, q, k, v, key_padding_mask)
        self.ran(kernel)
        if self.record_to is not None:
            self.intermediates = Intermediates(self, q.detach(), k.detach(), v.detach(), out.detach())
            self.record_to.append(self.intermediates)
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
            q, k, v, rule = q[:, h : h + 1], k[:, group : group + 1], v[:, group : group + 1], rule.head(h)
        out = out.clone()
        with torch.autocast(q.device.type, enabled=False):
            p = self._weights_by(rule, q, k, key_padding_mask=key_padding_mask, cut=cut).p
            edited = p @ expand_kv(v.float(), q.shape[1])
            if self.cfg.differential:  # as the forward: the head-wise RMSNorm of the signed map times v
                edited = self.head_norm(edited) * (1 - self.lambda_init)
            edited = edited.to(out.dtype)
        out[:, slice(None) if h is None else slice(h, h + 1)] = edited
        return out

    def extra_repr(self) -> str:
        cfg = self.cfg
        extras = "".join(
            [
                ", alibi" if self.alibi_slopes is not None else "",
                f", normalize={cfg.normalize}" if cfg.normalize != "softmax" else "",
                f", n_kv_head={self.n_kv_head}" if self.n_kv_head != self.n_head else "",
                f", window={cfg.window}" if cfg.window is not None else "",
                f", window_sinks={cfg.window_sinks}" if cfg.window_sinks else "",
                ", differential" if cfg.differential else "",
            ]
        )
        return f"backend={cfg.backend}, mask_fill={cfg.mask_fill}, causal={self.causal}{extras}"


class QKV(NamedTuple):
    """Something over the fused projection's output rows (its weight, its gradient), by name."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


class AttentionLayer(LatentAttention, nn.Module):
    """The whole attention layer: (B, T, d_model) in, its residual contribution (B, T, d_model) out.

    x -> qkv_proj (one matmul) -> heads -> q_norm, k_norm (qk_norm) -> RoPE -> KV cache ->
    ``attention`` (weights and kernel) -> gate (sigmoid of a projection of x) -> out_proj.
    A variant acting on the input or the output is a branch here; one deciding the weights is a
    branch of ``Attention`` / ``WeightRule``.
    """

    def __init__(
        self,
        cfg: AttentionConfig,
        d_model: int,
        n_head: int,
        d_k: int,
        n_kv_head: int | None = None,
        *,
        dropout: float = 0.0,
        init_std: float | str = 0.02,
        pos_encoding: str = "learned",
        index: int = 0,
        context: int | None = None,
        bias: bool = False,
        rope_base: float = 10000.0,
    ):
        super().__init__()
        if pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"model.pos_encoding={pos_encoding!r}; expected one of {', '.join(POS_ENCODINGS)}")
        if (refusal := latent_refusal(cfg, n_head, n_kv_head, pos_encoding)) is not None:
            raise refusal
        n_kv_head = n_kv_head or n_head
        inner, kv_inner = n_head * d_k, n_kv_head * d_k
        self.n_head, self.n_kv_head, self.d_k = n_head, n_kv_head, d_k
        # q, k and v in one matmul (nanoGPT's c_attn; 3.7 % faster a tiny-preset step than three
        # projections on the 2-core CPU, docs/performance.md); its rows are q's, then k's, then v's
        # (grouped-query: n_kv_head heads of k and v). ``qkv_parts`` names the parts of a tensor of its rows.
        self.qkv_sizes = (inner, kv_inner, kv_inner)
        self.latent = cfg.latent if cfg.latent.d_c is not None else None
        d_rope = self.latent.d_rope if self.latent is not None else 0
        if self.latent is not None:  # attention/latent.py
            self._build_latent(d_model, n_head, d_k)
        self.qkv_proj = nn.Linear(d_model, sum(self.qkv_sizes), bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.out_proj.is_residual = True
        # modules that would do nothing are None, not Identity or Dropout(0): a module call costs a few
        # microseconds of Python, and a tiny-preset forward makes dozens (docs/performance.md)
        self.q_norm = nn.LayerNorm(d_k) if cfg.qk_norm else None
        self.k_norm = nn.LayerNorm(d_k) if cfg.qk_norm else None
        sigma = qk_component_std(init_std, d_model, cfg.qk_norm)
        self.attention = Attention(
            cfg,
            n_head,
            d_k + d_rope,
            n_kv_head,
            sigma_q=sigma,
            sigma_k=sigma,
            dropout=dropout,
            alibi=pos_encoding == "alibi",
            index=index,
            context=context,
        )
        # RoPE rotates q and k before the kernel: every backend and every statistic recomputed from
        # the q, k recorded sees the rotated vectors
        rope_dim = d_rope or (d_k // 2 if cfg.differential else d_k)
        self.rotary = Rotary(rope_dim, rope_base) if pos_encoding == "rope" else None
        # the gate reads the layer input; a plain Linear, so it starts at the model's init std, not at
        # zero: a zero gate would be a constant 0.5 at init, and a test at init could not tell it from no gate
        self.gate_proj = (
            None if cfg.gate == "none" else nn.Linear(d_model, n_head if cfg.gate == "headwise" else inner, bias=False)
        )
        self.resid_dropout = nn.Dropout(dropout) if dropout > 0 else None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        migrations.layer_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def qkv_parts(self, rows: torch.Tensor) -> QKV:
        """A tensor over ``qkv_proj``'s output rows (its weight, its gradient) as its q, k, v parts."""
        return QKV(*rows.split(self.qkv_sizes, dim=0))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, n * d) -> (B, n, T, d)."""
        b, t, _ = x.shape
        return x.view(b, t, -1, self.d_k).transpose(1, 2)

    def _rotate(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """RoPE on q or k; a differential head's two halves are rotated alike, each its own map's vectors."""
        if not self.attention.cfg.differential:
            return self.rotary(x, offset)
        return torch.cat([self.rotary(part, offset) for part in x.chunk(2, dim=-1)], dim=-1)

    def forward(self, x, key_padding_mask=None, cache=None):
        """``cache`` (attention/cache.py): x continues the positions cached there; its keys and
        values are appended and its queries attend to every cached one."""
        if self.latent is not None and self._absorbs(cache, x.shape[1]):
            y = self._absorbed_forward(x, cache, key_padding_mask)  # attention/latent.py
            return y if self.resid_dropout is None else self.resid_dropout(y)
        q, k, v = self._qkv(x, cache) if self.latent is None else self._latent_qkv(x, cache)
        attended = self.attention(q, k, v, key_padding_mask=key_padding_mask)  # (B, H, T, d_k)
        out = attended
        if self.gate_proj is not None:
            gate = torch.sigmoid(self._heads_gate(self.gate_proj(x)))  # (B, H, T, 1) or (B, H, T, d_k)
            out = attended * gate.to(attended.dtype)
        b, _, t, _ = out.shape
        y = self.out_proj(out.transpose(1, 2).reshape(b, t, -1))
        record = self.attention.intermediates if self.attention.record_to is not None else None
        if record is not None:
            record.x, record.y = x.detach(), y.detach()
            if self.gate_proj is not None:
                record.gate, record.gated = gate.detach(), out.detach()
        return y if self.resid_dropout is None else self.resid_dropout(y)

    def _qkv(self, x, cache):
        """q (B, H, T, d_k) and k, v (B, H_kv, T_k, d_k) as the kernel takes them, the cache updated."""
        q, k, v = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)  # (B, H, T, d_k), (B, H_kv, T, d_k) twice
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self._rotated_and_cached(q, k, v, cache, self._rotate)

    def _rotated_and_cached(self, q, k, v, cache, rotate):
        """q and k rotated by RoPE (``rotate``; none without it) and k, v appended to the cache, in the
        order the cache takes them: a plain cache stores keys rotated at their position in the text, a
        rolling one before RoPE, every key then rotated at its index in the cache and the queries last."""
        rope_in_cache = cache is not None and cache.keys_before_rope
        if self.rotary is not None and not rope_in_cache:
            start = 0 if cache is None else cache.length
            q, k = rotate(q, start), rotate(k, start)
        if cache is not None:
            k, v = cache.update(k, v)
        if self.rotary is not None and rope_in_cache:
            q, k = rotate(q, k.shape[-2] - q.shape[-2]), rotate(k)
        return q, k, v

    @torch.no_grad()
    def clip_qk(self, max_logit: torch.Tensor, threshold: float) -> int:
        """QK-clip (Kimi K2's MuonClip): each head h whose largest logit ``max_logit[h]`` passed
        ``threshold`` gets its logits multiplied by gamma_h = threshold / max_logit[h], through its
        q and k rows of the projection; returns how many heads were clipped.

        A logit is bilinear in W_q and W_k, so sqrt(gamma) on each row set scales it by gamma
        exactly. A key head shared by a group of query heads (GQA, MQA) takes sqrt of the group's
        smallest gamma and each query head the rest of its own, so a head below the threshold keeps
        its logits. An additive bias (ALiBi) is not scaled."""
        over = max_logit > threshold
        gamma = torch.where(over, threshold / max_logit.clamp_min(1e-30), torch.ones_like(max_logit)).float()
        if self.latent is not None:
            self._clip_latent(gamma)
            return int(over.sum())
        key_scale = gamma.view(self.n_kv_head, -1).amin(1).sqrt()  # (H_kv,)
        query_scale = gamma / key_scale.repeat_interleave(self.n_head // self.n_kv_head)  # (H,)
        q_rows, k_rows, _ = self.qkv_parts(self.qkv_proj.weight)  # views of the weight
        q_rows.view(self.n_head, self.d_k, -1).mul_(query_scale.view(-1, 1, 1).to(q_rows.dtype))
        k_rows.view(self.n_kv_head, self.d_k, -1).mul_(key_scale.view(-1, 1, 1).to(k_rows.dtype))
        return int(over.sum())

    def _heads_gate(self, g: torch.Tensor) -> torch.Tensor:
        """The gate projection's output (B, T, H or H * d_k) -> (B, H, T, 1 or d_k)."""
        b, t, n = g.shape
        return g.view(b, t, self.n_head, n // self.n_head).transpose(1, 2)
