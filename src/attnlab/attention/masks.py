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
    t_q: int, t_k: int, causal: bool, key_padding_mask: torch.Tensor | None, device=None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(B|1, 1, t_q, t_k) boolean mask combining causality and key padding; None if nothing is masked.

    ``key_padding_mask`` is (B, t_k) and True for real tokens, False for padding. ``rows``: the
    queries' positions among the keys (default: the last t_q), e.g. one block of query rows.
    """
    mask = None
    if causal:
        if rows is None:
            mask = torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)[None, None]
        else:
            mask = (torch.arange(t_k, device=device)[None, :] <= rows.to(device)[:, None])[None, None]
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool)[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return mask
