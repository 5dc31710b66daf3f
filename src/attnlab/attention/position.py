"""Position encodings that act inside attention: rotary (RoPE) and linear biases (ALiBi).

``model.pos_encoding`` picks one of POS_ENCODINGS:
  learned  absolute position embeddings added to the token embeddings (GPT-2; the default)
  rope     q and k rotated by position before any kernel (Su et al. 2021), so every backend,
           and the statistics that recompute probabilities from the captured q and k, see the
           rotated vectors: the logit depends on content and on the offset i - j only
  alibi    an additive per-head bias -m_h |i - j| on the logits (Press et al. 2022): the
           explicit kernels add it, SDPA takes it as a float mask, forced flash refuses it
  none     no position information at all (NoPE): a causal mask alone lets a model count
Which one is on decides which routes a copying circuit can take (docs/mechanisms.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

POS_ENCODINGS = ("learned", "rope", "alibi", "none")


class Rotary(nn.Module):
    """Rotates pairs of components (x_c, x_{c + d/2}) of q or k by angle pos * base^(-2c/d)
    (the GPT-NeoX layout). No parameters and no persistent buffers: checkpoints are unchanged."""

    def __init__(self, d_k: int, base: float = 10000.0):
        super().__init__()
        if d_k % 2:
            raise ValueError(f"rotary position encoding needs an even head dim, got model.d_k={d_k}")
        self.register_buffer(
            "inv_freq", base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k), persistent=False
        )

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """(B, H, T, d) -> the same, row t rotated by (offset + t) * inv_freq: ``offset`` is the
        position of the first row (the length of a KV cache the rows continue)."""
        t, half = x.shape[-2], x.shape[-1] // 2
        positions = torch.arange(offset, offset + t, device=x.device, dtype=torch.float64)
        angles = positions[:, None] * self.inv_freq.to(x.device)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's per-head slopes: 2^(-8h/n) for h = 1..n when n is a power of two; otherwise those of
    the nearest lower power of two, then every other slope of the next one (Press et al. 2022)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    low = 2 ** int(math.floor(math.log2(n_head)))
    slopes = geometric(low) + geometric(2 * low)[0::2][: n_head - low]
    return torch.tensor(slopes)


def alibi_bias(slopes: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(H,) slopes, query and key positions -> (H, len(rows), len(keys)) bias -m_h |i - j|."""
    distance = (rows[:, None] - keys[None, :]).abs().to(slopes.dtype)
    return -slopes.view(-1, 1, 1) * distance
