"""The key/value cache of one attention layer, for decoding one token at a time.

A layer's keys and values at positions 0..length-1 do not change when later tokens arrive (causal
attention), so a new token needs only its own q, k, v: its k, v are appended here and its query
attends to everything cached. What is stored is what the kernels take: n_kv_head heads (key/value
groups are broadcast to the query heads by the kernel, not stored expanded) and keys after RoPE
(each rotated at its own position, which never changes). ALiBi and the escape slot need nothing
stored: the bias is recomputed from positions, the slot is a parameter.
"""
from __future__ import annotations

import torch


class KVCache:
    """Keys and values (B, n_kv_head, length, d_k) of the positions seen so far, room for
    ``max_len``; storage is allocated at the first update, in the dtype and device of the keys."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, t, d_k) at positions length..length+t-1; return every cached k, v."""
        start, end = self.length, self.length + k.shape[-2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions (model.block_size); {end} requested")
        if self.k is None:
            b, h, _, d = k.shape
            self.k = k.new_empty(b, h, self.max_len, d)
            self.v = v.new_empty(b, h, self.max_len, v.shape[-1])
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reset(self) -> None:
        """Forget every position (the storage is kept for the next prefill)."""
        self.length = 0
