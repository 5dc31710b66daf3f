"""How a row of logits becomes weights: each normalization once, with the flags the rest of attnlab reads.

A normalization maps the masked logits (B, H, r, T) and n, the keys a query sees at the layer's full
context (``WeightRule.context_keys``, else the keys of the forward), to the weights on the keys. Other
modules never compare its name; they ask it:

  rows_sum_to_one  every row sums to 1, so max_prob and the maps read as a distribution; otherwise the
                   statistics log ``row_mass`` (attention/stats.py)
  fused            SDPA and FlashAttention compute it (their online softmax); otherwise the schema and
                   ``backends.attend`` send it to naive or scaled (the kernels that compute weights)
  takes_escape     an escape slot combines with it (a softmax's way out: an extra key of value zero)
  neutral          some init of the new parameters makes it compute a Hugging Face softmax checkpoint's
                   function, so ``model.init_from`` may start from one (interop/neutral.py)
  caches           a KV cache decodes it: its weights on a key do not depend on how long the forward is,
                   so a cached step and a full forward agree (GPT.kv_caches refuses it otherwise)

Adding one is ``register(Normalization(...))`` here (docs/development.md, "Adding a score function"):
the config accepts its name, and the schema, the kernels, ``init_from`` and decoding follow its flags.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Normalization:
    name: str
    weights: Callable[[torch.Tensor, int], torch.Tensor]  # (masked logits, n keys seen) -> weights
    rows_sum_to_one: bool
    fused: bool
    takes_escape: bool
    neutral: bool
    caches: bool
    doc: str


REGISTRY: dict[str, Normalization] = {}
# the accepted names, a live view: AttentionConfig's check and the docs key table read it as it is now
NORMALIZATIONS = REGISTRY.keys()


def register(normalization: Normalization) -> Normalization:
    if normalization.name in REGISTRY:
        raise ValueError(f"model.attention.normalize={normalization.name!r} is registered already")
    REGISTRY[normalization.name] = normalization
    return normalization


def normalization(name: str) -> Normalization:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"model.attention.normalize={name!r}; expected one of {', '.join(REGISTRY)}") from None


def fused_names() -> list[str]:
    return [n.name for n in REGISTRY.values() if n.fused]


SOFTMAX = register(
    Normalization(
        name="softmax",
        weights=lambda logits, _keys: torch.softmax(logits, dim=-1),
        rows_sum_to_one=True,
        fused=True,
        takes_escape=True,
        neutral=True,
        caches=True,
        doc="rows sum to 1",
    )
)

# Ramapuram et al. 2024: sigma(s q.k + bias - log n) per key, no row normalisation; n fixed by the context
# (not the forward) so that a token's weights are the same in a cached step as in a full forward
SIGMOID = register(
    Normalization(
        name="sigmoid",
        weights=lambda logits, keys: torch.sigmoid(logits - math.log(keys)),
        rows_sum_to_one=False,
        fused=False,
        takes_escape=False,
        neutral=False,
        caches=True,
        doc="sigma(logit - log n) per key; a row's mass is what it sums to",
    )
)
