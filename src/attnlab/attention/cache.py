"""The key/value cache of one attention layer, for decoding one token at a time.

A layer's keys and values at positions 0..length-1 do not change when later tokens arrive (causal
attention), so a new token needs only its own q, k, v: its k, v are appended here and its query
attends to everything cached. What is stored is what the kernels take: n_kv_head heads (key/value
groups are broadcast to the query heads by the kernel, not stored expanded) and keys after RoPE
(each rotated at its own position, which never changes). ALiBi and the escape slot need nothing
stored: the bias is recomputed from positions, the slot is a parameter. A latent attention layer
stores one row per token in the keys' place, its latent and its RoPE key [c, k_rope] (d_c + d_rope
values, FlashMLA's layout), and no values: ``update(rows, None)``.

``latent_decode`` says how latent attention layers read the cache (attention/latent.py): ``auto``
the form with fewer multiply-adds for the queries at hand, ``absorbed`` or ``expanded`` always
(where the layer can absorb).

``RollingKVCache`` is the streaming alternative (StreamingLLM, Xiao et al. 2023): a fixed number of
entries, the first tokens kept as attention sinks and the rest the most recent ones;
positions are those inside the cache, so its keys are stored before RoPE and rotated where they sit.
It changes what the model sees (evicted tokens are gone, and deeper layers' keys keep the context
they were computed in), so its outputs are not the full forward's once it has evicted.
"""

from __future__ import annotations

import torch

LATENT_DECODES = ("auto", "absorbed", "expanded")


def latent_decode_checked(mode: str) -> str:
    if mode not in LATENT_DECODES:
        raise ValueError(f"latent_decode={mode!r}; expected one of {', '.join(LATENT_DECODES)}")
    return mode


class KVCache:
    """Keys and values (B, n_kv_head, length, d_k) of the positions seen so far, room for
    ``max_len``; storage is allocated at the first update, in the dtype and device of the keys."""

    keys_before_rope = False  # keys arrive rotated at their position in the text

    def __init__(self, max_len: int, latent_decode: str = "auto"):
        self.max_len = max_len
        self.latent_decode = latent_decode_checked(latent_decode)
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def next_position(self, t: int) -> int:
        """The position of the first of ``t`` new rows."""
        return self.length

    def update(self, k: torch.Tensor, v: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Store k, v (B, H_kv, t, d_k) at positions length..length+t-1 (v None: keys only); return
        every cached k, v."""
        start, end = self.length, self.length + k.shape[-2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions (model.block_size); {end} requested")
        if self.k is None:
            b, h, _, d = k.shape
            self.k = k.new_empty(b, h, self.max_len, d)
            self.v = None if v is None else v.new_empty(b, h, self.max_len, v.shape[-1])
        self.k[:, :, start:end] = k
        if v is not None:
            self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], None if v is None else self.v[:, :, :end]

    def reset(self) -> None:
        """Forget every position (the storage is kept for the next prefill)."""
        self.length = 0


class RollingKVCache:
    """At most ``capacity`` entries: the first ``sinks`` tokens ever stored, then the most recent
    ones. Keys are stored before RoPE (the layer rotates every key at its index in the cache, and
    the queries after them); ALiBi's bias and learned positions would follow the same indices, so
    learned positions take no rolling cache (GPT.rolling_kv_caches refuses them)."""

    keys_before_rope = True
    latent_decode = "auto"

    def __init__(self, capacity: int, sinks: int):
        if not 0 <= sinks < capacity:
            raise ValueError(
                f"rolling KV cache: sinks={sinks} with capacity={capacity}; expected 0 <= sinks < capacity"
            )
        self.capacity, self.sinks = capacity, sinks
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def _room_for(self, t: int) -> int:
        """How many stored entries stay when ``t`` new ones arrive."""
        if t > self.capacity - self.sinks:
            raise ValueError(
                f"rolling KV cache takes at most capacity - sinks = {self.capacity - self.sinks} "
                f"tokens at a time, got {t}"
            )
        return min(self.length, self.capacity - t)

    def next_position(self, t: int) -> int:
        return self._room_for(t)

    def update(self, k: torch.Tensor, v: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Evict to make room (the oldest entries after the sinks go first), append k, v (keys before
        RoPE; v None: keys only) and return every entry: the new tokens attend to at most ``capacity``
        keys, themselves included."""
        keep = self._room_for(k.shape[-2])
        if self.k is None:
            self.k, self.v = k, v
        else:
            recent = self.sinks + self.length - keep  # entries sinks..recent-1 are evicted (none when not full)
            self.k = torch.cat([self.k[:, :, : self.sinks], self.k[:, :, recent:], k], dim=2)
            if v is not None:
                self.v = torch.cat([self.v[:, :, : self.sinks], self.v[:, :, recent:], v], dim=2)
        self.length = self.k.shape[-2]
        return self.k, self.v
