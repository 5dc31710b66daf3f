"""Attention statistics computed from q and k in query blocks (DESIGN.md, "Metric definitions").

Fused kernels return no probabilities, so every backend is measured the same way: the
probabilities are recomputed from q, k and the softmax scale, ``block`` query rows at a time,
in fp32. Peak extra memory is O(B x H x block x T), never T x T.

Per head (tensors of shape (H,)):
  entropy       mean over queries of H_i = -sum_j p_ij log p_ij (nats)
  entropy_norm  mean over queries with k_i > 1 of H_i / log k_i (1 uniform, 0 one-hot)
  max_prob      mean over queries of max_j p_ij;  max_prob_max: its max over queries
  max_logit     max over (i, j) of the scaled logit s_ij among visible keys
  sink_mass     mean over queries of p_i0, the weight on the first token
"""
from __future__ import annotations

import torch

STATS = ("entropy", "entropy_norm", "max_prob", "max_prob_max", "max_logit", "sink_mass")
# How per-head values become one per-layer value.
LAYER_REDUCE = {"max_prob_max": "max", "max_logit": "max"}


@torch.no_grad()
def attention_stats(q: torch.Tensor, k: torch.Tensor, scale, causal: bool = True, block: int = 128) -> dict:
    """Per-head statistics of softmax(scale * q k^T) under a causal (or no) mask; q, k: (B, H, T, d)."""
    q, k = q.float(), k.float()
    if torch.is_tensor(scale):
        q = q * scale.float().view(1, -1, 1, 1)
        scale = 1.0
    b, h, t, _ = q.shape
    kt = k.transpose(-2, -1)
    sums = {name: torch.zeros(h, dtype=torch.float64, device=q.device) for name in ("entropy", "entropy_norm", "max_prob", "sink_mass")}
    n_rows, n_norm_rows = 0, 0
    max_logit = torch.full((h,), float("-inf"), device=q.device)
    max_prob_max = torch.zeros(h, device=q.device)
    keys = torch.arange(t, device=q.device)
    for start in range(0, t, block):
        rows = torch.arange(start, min(start + block, t), device=q.device)
        logits = (q[:, :, rows] @ kt) * scale  # (B, H, r, T)
        visible = keys[None, :] <= rows[:, None] if causal else torch.ones(len(rows), t, dtype=torch.bool, device=q.device)
        logits = logits.masked_fill(~visible, float("-inf"))
        p = torch.softmax(logits, dim=-1)
        ent = -torch.special.xlogy(p, p).sum(-1)  # (B, H, r)
        n_visible = visible.sum(-1)  # (r,)
        norm_rows = n_visible > 1
        row_max = p.amax(-1)
        sums["entropy"] += ent.sum((0, 2)).double()
        sums["entropy_norm"] += (ent[..., norm_rows] / n_visible[norm_rows].float().log()).sum((0, 2)).double()
        sums["max_prob"] += row_max.sum((0, 2)).double()
        sums["sink_mass"] += p[..., 0].sum((0, 2)).double()
        max_prob_max = torch.maximum(max_prob_max, row_max.amax((0, 2)))
        max_logit = torch.maximum(max_logit, logits.amax((0, 2, 3)))
        n_rows += b * len(rows)
        n_norm_rows += b * int(norm_rows.sum())
    out = {name: (s / n_rows).float() for name, s in sums.items()}
    out["entropy_norm"] = (sums["entropy_norm"] / max(n_norm_rows, 1)).float()
    out["max_prob_max"] = max_prob_max
    out["max_logit"] = max_logit
    return out


def layer_values(per_head: dict) -> dict:
    """One number per statistic for the layer: mean over heads, or max where LAYER_REDUCE says."""
    return {
        name: float(v.max() if LAYER_REDUCE.get(name) == "max" else v.mean()) for name, v in per_head.items()
    }
