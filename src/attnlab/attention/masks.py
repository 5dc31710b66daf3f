"""Masks and fill values. A mask is boolean, True where a query may attend to a key."""

from __future__ import annotations

import torch

MASK_FILLS = ("-inf", "finfo_min", "-1e9", "-1e4")


def fill_value(fill: str | float, dtype: torch.dtype) -> float:
    """The number written into masked logits for a fill name (or a negative number)."""
    if fill == "-inf":
        return float("-inf")
    if fill == "finfo_min":
        return torch.finfo(dtype).min
    return float(fill)


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
    """(B|1, 1, t_q, t_k) boolean mask combining causality, the sliding window and key padding;
    None if nothing is masked. The one place visibility is decided.

    ``key_padding_mask`` is (B, t_k) and True for real tokens, False for padding. ``rows``: the
    queries' positions among the keys (default: the last t_q), e.g. one block of query rows.
    ``window``: query i sees key j only when |i - j| < window (with causal: its ``window`` most
    recent keys, itself included), or when j < ``window_sinks`` (always-visible first tokens).
    """
    mask = None
    if causal or window is not None:
        if rows is None:
            rows = torch.arange(t_k - t_q, t_k, device=device)
        offset = rows.to(device)[:, None] - torch.arange(t_k, device=device)[None, :]  # i - j
        if causal:
            mask = offset >= 0
        if window is not None:
            near = offset.abs() < window
            if window_sinks:
                near = near | (torch.arange(t_k, device=device) < window_sinks)[None, :]
            mask = near if mask is None else mask & near
        mask = mask[None, None]
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool)[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return mask
