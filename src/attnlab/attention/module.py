"""The attention layer the model calls: backend and scaling chosen by config, nothing else."""
from __future__ import annotations

import torch
from torch import nn

from .backends import attend
from .scaling import Scale


class Attention(nn.Module):
    """softmax(s * q.k^T + M) v over (B, H, T, d_k) tensors.

    Statistics callbacks hook this module: its forward inputs are the post-norm q, k, v and
    ``softmax_scale()`` gives the s in use, so any backend's probabilities can be recomputed.
    ``kernel`` names the kernel that ran in the last forward.
    """

    def __init__(
        self,
        backend: str,
        scaling: str,
        n_head: int,
        d_k: int,
        sigma_q: float = 1.0,
        sigma_k: float = 1.0,
        mask_fill: str = "-inf",
        dropout: float = 0.0,
        causal: bool = True,
    ):
        super().__init__()
        self.backend, self.mask_fill, self.dropout, self.causal = backend, mask_fill, dropout, causal
        self.scale = Scale(scaling, d_k, n_head, sigma_q, sigma_k)
        self.kernel: str | None = None

    def softmax_scale(self) -> float | torch.Tensor:
        return self.scale()

    def forward(self, q, k, v, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        out, self.kernel = attend(
            self.backend,
            q,
            k,
            v,
            self.softmax_scale(),
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            mask_fill=self.mask_fill,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return out

    def extra_repr(self) -> str:
        return f"backend={self.backend}, mask_fill={self.mask_fill}, causal={self.causal}"
