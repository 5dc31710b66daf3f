"""Masks and fill values. A mask is boolean, True where a query may attend to a key."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnlab.util.errors import KernelUnavailable

MASK_FILLS = ("-inf", "finfo_min", "-1e9", "-1e4")


def fill_value(fill: str | float, dtype: torch.dtype) -> float:
    """The number written into masked logits for a fill name (or a negative number)."""
    if fill == "-inf":
        return float("-inf")
    if fill == "finfo_min":
        return torch.finfo(dtype).min
    return float(fill)


@dataclass(frozen=True)
class Visibility:
    """Which keys a query may see: causality, and the sliding window with its always-visible first
    tokens. The one place visibility is decided: the kernels, ``WeightRule``, the escape slot's
    route, ``Attention`` and the rolling cache ask it and hold no rule of their own.

    ``window``: query i sees key j only when |i - j| < window (with causal: its ``window`` most
    recent keys, itself included), or when j < ``window_sinks`` (always-visible first tokens).

    A new rule is a subclass (or a field) here: ``near`` says which keys a row sees besides
    causality, ``beyond_causal`` that it sees fewer. The rest follows from those two (the escape
    slot's route through ``SlotInFront``, one-line refusals on flash and the rolling cache); it
    overrides ``keys_seen`` where sigmoid's n should count fewer keys than the context.
    """

    causal: bool = True
    window: int | None = None
    window_sinks: int = 0

    @property
    def beyond_causal(self) -> bool:
        """Whether a row sees fewer keys than causality (or no mask) leaves it: then a fused
        kernel's own causal flag cannot state the rule."""
        return self.window is not None

    def near(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """(r, t_k) bool: the keys each query row sees besides causality; None for every key."""
        if self.window is None:
            return None
        near = (rows[:, None] - keys[None, :]).abs() < self.window
        if self.window_sinks:
            near = near | (keys < self.window_sinks)[None, :]
        return near

    def mask(
        self,
        t_q: int,
        t_k: int,
        key_padding_mask: torch.Tensor | None = None,
        device=None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """(B|1, 1, t_q, t_k) boolean mask of this rule and key padding; None if nothing is masked.

        ``key_padding_mask`` is (B, t_k) and True for real tokens, False for padding. ``rows``: the
        queries' positions among the keys (default: the last t_q), e.g. one block of query rows."""
        mask = None
        if self.causal or self.beyond_causal:
            if rows is None:
                rows = torch.arange(t_k - t_q, t_k, device=device)
            rows, keys = rows.to(device), torch.arange(t_k, device=device)
            if self.causal:
                mask = rows[:, None] - keys[None, :] >= 0
            near = self.near(rows, keys)
            if near is not None:
                mask = near if mask is None else mask & near
            mask = mask[None, None]
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool)[:, None, None, :]
            mask = pad if mask is None else mask & pad
        return mask

    def causal_flag_states(self, t_q: int, t_k: int) -> bool:
        """Whether SDPA's is_causal flag (or no mask) states this rule: is_causal aligns top-left,
        the rule bottom-right, so they agree only where t_q == t_k."""
        return not self.beyond_causal and (not self.causal or t_q == t_k)

    def behind_slot(self) -> Visibility:
        """The rule over the escape slot's padded keys (sink.slot_key_attention): the slot key and
        the dummy row shift keys and queries alike, so only the slot, one more always-visible key
        in front, is new."""
        if self.window is not None:
            return replace(self, window_sinks=self.window_sinks + 1)
        return SlotInFront(self.causal, inner=self) if self.beyond_causal else self

    def keys_seen(self, context: int | None) -> int | None:
        """The most keys a query sees with ``context`` keys before it (None: no bound), the window
        and its kept first tokens capped by the context."""
        if self.window is None:
            return context
        seen = self.window + self.window_sinks
        return seen if context is None else min(seen, context)

    def flash_attn_kwargs(self) -> dict:
        """flash_attn_func's keyword arguments for this rule besides ``causal``; KernelUnavailable
        where its window_size cannot state the rule."""
        if self.window_sinks:
            raise KernelUnavailable(
                f"model.attention.window_sinks={self.window_sinks}: flash_attn's window_size keeps no "
                "always-visible tokens; expected window_sinks=0 or attention=sdpa"
            )
        if self.window is None:
            if self.beyond_causal:
                raise KernelUnavailable(f"{self!r}: flash_attn states no such mask; expected attention=sdpa")
            return {}
        # flash_attn (>= 2.1) aligns causal bottom-right when t_q < t_k, as mask() does; its
        # window_size=(left, right) counts keys besides the query's own position
        return {"window_size": (self.window - 1, self.window - 1 if not self.causal else 0)}

    def check_forced_flash(self) -> None:
        """KernelUnavailable where PyTorch's forced flash kernel (no mask, causal at most) cannot run the rule."""
        if self.window is not None:
            raise KernelUnavailable(
                f"model.attention.window={self.window}: PyTorch's forced flash kernel takes no mask; "
                "expected window=null, attention=sdpa, or flash_attn installed (CUDA)"
            )
        if self.beyond_causal:
            raise KernelUnavailable(f"{self!r}: PyTorch's forced flash kernel takes no mask; expected attention=sdpa")

    def check_flash_slot(self) -> None:
        """KernelUnavailable where the escape slot's always-visible key cannot join the rule on attention=flash."""
        if self.window is not None:
            raise KernelUnavailable(
                "model.attention.escape with "
                "model.attention.window on attention=flash: the slot is a key every query sees, "
                "which a flash window cannot keep; expected attention=sdpa"
            )
        if self.beyond_causal:
            raise KernelUnavailable(f"model.attention.escape with {self!r} on attention=flash; expected attention=sdpa")

    def rolling_cache_refusal(self) -> str | None:
        """Why a rolling KV cache (positions counted inside the cache) cannot keep this rule, or None."""
        if self.window is not None:
            return (
                f"model.attention.window={self.window} takes no rolling KV cache (the window counts "
                "positions in the text, the cache its own entries); expected window=null, or the plain cache"
            )
        if self.beyond_causal:
            return f"{self!r} takes no rolling KV cache (the cache counts its own entries, not positions in the text)"
        return None


@dataclass(frozen=True)
class SlotInFront(Visibility):
    """``inner`` behind the escape slot's key, for a rule without its own ``behind_slot``: key 0 is
    the slot, seen by every query; the rest is ``inner`` one position on."""

    inner: Visibility | None = None

    @property
    def beyond_causal(self) -> bool:
        return self.inner.beyond_causal

    def near(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        near = self.inner.near(rows - 1, keys - 1)
        return None if near is None else near | (keys == 0)[None, :]


CAUSAL = Visibility()


def allowed_mask(
    t_q: int,
    t_k: int,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    device=None,
    rows: torch.Tensor | None = None,
    window: int | None = None,
    window_sinks: int = 0,
) -> torch.Tensor | None:
    """``Visibility(causal, window, window_sinks).mask(...)``: (B|1, 1, t_q, t_k) bool, None if nothing is masked."""
    return Visibility(causal, window, window_sinks).mask(t_q, t_k, key_padding_mask, device, rows)
