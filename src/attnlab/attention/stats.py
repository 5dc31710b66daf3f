"""Attention statistics computed from q and k in query blocks (DESIGN.md, "Metric definitions").

Fused kernels return no probabilities, so every backend is measured the same way: the
probabilities are recomputed from q, k and the softmax scale, ``block`` query rows at a time,
in fp32. Peak extra memory is O(B x H x block x T), never T x T.

Queries that see a single key (row 0 under a causal mask) are left out of every per-query
statistic: their row is one-hot whatever the model does, so counting it would pin max_prob_max at
1 and bias the means (uniform attention at T = 16 would read sink_mass 0.211 instead of 0.159).
The head analysis (``attnlab.analysis.heads``) uses the same rows.

Per head (tensors of shape (H,)), over the queries i with k_i > 1 visible keys:
  entropy       mean of H_i = -sum_j p_ij log p_ij (nats)
  entropy_norm  mean of H_i / log k_i (1 uniform, 0 one-hot)
  max_prob      mean of max_j p_ij;  max_prob_max: its max over those queries (1 = collapse)
  max_logit     max over (i, j) of the scaled logit s_ij among visible keys (every query:
                a logit is a logit, whatever the row's softmax makes of it)
  sink_mass     mean of p_i0, the weight on the first token
  escape_mass   with an escape slot (``sink``): mean of the weight that goes nowhere, 1 - sum_j p_ij
                (not reported without one)
  sink_mass_<c> with ``query_classes`` {c: (B, T) bool}: sink_mass over the queries of class c only,
                e.g. ``dormant`` (queries that need no attention) and ``active`` (those that do)

Extreme tokens (Guo et al. 2024), from the probe's value vectors and residual stream:
  value_drain   per head, ||v_0|| / mean_{t>0} ||v_t||: below 1 when the first token's value shrinks
  residual_peak per layer, ||h_0|| / mean_{t>0} ||h_t|| of the block's output: above 1 when the
                first token's residual state grows

With an escape slot the weights on the real keys sum to 1 - escape: max_prob, max_prob_max and
sink_mass are those weights as they are (what the head puts on a key), while entropy and
entropy_norm describe the real-key weights renormalised to sum to 1 (how the head spreads the weight
it does place). An ALiBi ``bias`` is added to the logits before all of this, and max_logit includes
it; with RoPE the captured q and k are already rotated.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .sink import with_escape

STATS = ("entropy", "entropy_norm", "max_prob", "max_prob_max", "max_logit", "sink_mass")  # + escape_mass with a sink
# How per-head values become one per-layer value.
LAYER_REDUCE = {"max_prob_max": "max", "max_logit": "max", "sink_mass_dormant": "max", "sink_mass_active": "max",
                "value_drain": "min"}  # a sink is one head's doing: the layer reports its strongest head


@torch.no_grad()
def attention_stats(
    q: torch.Tensor, k: torch.Tensor, scale, causal: bool = True, block: int = 128,
    bias: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
    sink: torch.Tensor | None = None, query_classes: dict[str, torch.Tensor] | None = None,
) -> dict:
    """Per-head statistics of softmax(scale * q k^T + bias) under a causal (or no) mask; q, k: (B, H, T, d).
    ``bias(rows, keys)`` gives an additive (H, rows, keys) logit bias (``Attention.logit_bias``) or
    None; ``sink`` the (H,) escape logits (``Attention.sink_logit()``) or None; ``query_classes``
    named (B, T) masks of queries whose first-token weight is also reported on its own."""
    q, k = q.float(), k.float()
    sink = sink.detach().float() if sink is not None else None
    if torch.is_tensor(scale):
        q = q * scale.float().view(1, -1, 1, 1)
        scale = 1.0
    b, h, t, _ = q.shape
    kt = k.transpose(-2, -1)
    sums = {name: torch.zeros(h, dtype=torch.float64, device=q.device) for name in ("entropy", "entropy_norm", "max_prob", "sink_mass", "escape_mass")}
    classes = {name: mask.to(q.device).bool() for name, mask in (query_classes or {}).items()}
    class_sums = {name: torch.zeros(h, dtype=torch.float64, device=q.device) for name in classes}
    class_rows = dict.fromkeys(classes, 0)
    n_rows = 0
    max_logit = torch.full((h,), float("-inf"), device=q.device)
    max_prob_max = torch.zeros(h, device=q.device)
    keys = torch.arange(t, device=q.device)
    for start in range(0, t, block):
        rows = torch.arange(start, min(start + block, t), device=q.device)
        logits = (q[:, :, rows] @ kt) * scale  # (B, H, r, T)
        extra = bias(rows, keys) if bias is not None else None
        if extra is not None:
            logits = logits + extra.float()
        visible = keys[None, :] <= rows[:, None] if causal else torch.ones(len(rows), t, dtype=torch.bool, device=q.device)
        logits = logits.masked_fill(~visible, float("-inf"))
        if sink is None:
            p, escape = torch.softmax(logits, dim=-1), torch.zeros(logits.shape[:-1], device=q.device)
            placed = p
        else:
            p, escape = with_escape(logits, sink)
            placed = p / (1 - escape).clamp_min(1e-30).unsqueeze(-1)  # where the placed weight goes
        ent = -torch.special.xlogy(placed, placed).sum(-1)  # (B, H, r)
        max_logit = torch.maximum(max_logit, logits.amax((0, 2, 3)))
        n_visible = visible.sum(-1)  # (r,)
        counted = n_visible > 1  # rows with a choice to make
        if not counted.any():
            continue
        for name, mask in classes.items():
            chosen = mask[:, rows] & counted[None, :]  # (B, r)
            class_sums[name] += (p[..., 0] * chosen[:, None]).sum((0, 2)).double()
            class_rows[name] += int(chosen.sum())
        ent, p, n_visible, escape = ent[..., counted], p[:, :, counted], n_visible[counted], escape[..., counted]
        row_max = p.amax(-1)  # (B, H, r')
        sums["entropy"] += ent.sum((0, 2)).double()
        sums["entropy_norm"] += (ent / n_visible.float().log()).sum((0, 2)).double()
        sums["max_prob"] += row_max.sum((0, 2)).double()
        sums["sink_mass"] += p[..., 0].sum((0, 2)).double()
        sums["escape_mass"] += escape.sum((0, 2)).double()
        max_prob_max = torch.maximum(max_prob_max, row_max.amax((0, 2)))
        n_rows += b * int(counted.sum())
    # no query with a choice (T = 1): every per-query statistic is undefined
    out = {name: (s / n_rows if n_rows else torch.full_like(s, float("nan"))).float() for name, s in sums.items()}
    out["max_prob_max"] = max_prob_max if n_rows else torch.full_like(max_prob_max, float("nan"))
    out["max_logit"] = max_logit
    if sink is None:
        del out["escape_mass"]  # logged only for models with an escape slot
    for name, total in class_sums.items():
        out[f"sink_mass_{name}"] = (total / class_rows[name] if class_rows[name] else torch.full_like(total, float("nan"))).float()
    return out


def first_token_norm_ratio(x: torch.Tensor) -> torch.Tensor:
    """||x_0|| / mean_{t>0} ||x_t|| over the batch, for x (B, H, T, d) -> (H,), or (B, T, d) -> scalar."""
    norms = x.float().norm(dim=-1)  # (B, H, T) or (B, T)
    first, rest = norms[..., 0].mean(0), norms[..., 1:].mean((0, -1))
    return first / rest.clamp_min(1e-30)


def uniform_sink_mass(t: int) -> float:
    """sink_mass of uniform causal attention over T positions: mean over i = 1..T-1 of 1/(i+1)."""
    return sum(1.0 / (i + 1) for i in range(1, t)) / (t - 1) if t > 1 else float("nan")


def layer_values(per_head: dict) -> dict:
    """One number per statistic for the layer: mean over heads, or max where LAYER_REDUCE says."""
    return {
        name: float(v.max() if LAYER_REDUCE.get(name) == "max" else v.mean()) for name, v in per_head.items()
    }
