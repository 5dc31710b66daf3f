"""Fine-tuning a checkpoint with an attention variant switched on (``model.init_from``): the
parameters the checkpoint lacks start where each layer computes what the checkpoint computed.

  gate (headwise, elementwise)  gate_proj at zero, so sigmoid(0) = 1/2 on every head, and out_proj's
                                weight doubled: exact (both factors are powers of two)
  escape=learned                the logit at NEUTRAL_ESCAPE_LOGIT: the escape mass of a row is
                                sigmoid(-20 - lse), lse its logits' log-sum-exp (2e-9 where lse >= 0)
  scaling (none, inv_d, sigma)  the checkpoint's 1/sqrt(d) over the rule's factor folded into the
                                query rows (qkv_proj's and their bias, or a latent's q_up); d the
                                query-key width, d_k (+ d_rope with a latent); ``learned`` starts at 1/sqrt(d)
  window, window_sinks          no parameters: nothing changes while T <= window
A variant that no setting of its parameters makes compute the checkpoint's function is refused
(``refusal``) rather than started silently elsewhere; a latent (MLA) is architecture, the
checkpoint's or none (hf_load.py compares it).
"""

from __future__ import annotations

import math

import torch

from attnlab.attention.normalizations import REGISTRY, normalization
from attnlab.interop.families import attention_defaults, lookup

# low enough that the escape mass is below float32 rounding of the weights on a row whose logits'
# log-sum-exp is >= 0, high enough that the mass and its gradient are not exactly 0 in float32 (Adam
# then moves the logit by about the learning rate per step while the gradient keeps its sign)
NEUTRAL_ESCAPE_LOGIT = -20.0

# model.attention values no parameter setting makes compute the checkpoint's softmax attention
NOT_NEUTRAL = {
    "qk_norm": (True, "LayerNorm'd q and k lose their norms, which the checkpoint's logits depend on; expected false"),
    "escape": ("zero_logit", "its fixed logit 0 takes weight from every key; expected none or learned (starts at ~0)"),
    "differential": (True, "the head-wise RMSNorm drops each head's output norm; expected false"),
}


# model.attention fields with a neutral start at every value NOT_NEUTRAL leaves (the table above), and
# the latent, which is architecture (the checkpoint's own, compared by hf_load.py). Any other field is
# refused at a value other than its default: one added to AttentionConfig is refused by name until it
# is listed here or in NOT_NEUTRAL.
NEUTRAL = {"backend", "mask_fill", "scaling", "escape", "gate", "window", "window_sinks", "sink"}
# normalize: each normalization says whether it is neutral (attention/normalizations.py)
NEUTRAL |= {"normalize"}
NEUTRAL |= {"latent.d_c", "latent.d_rope", "latent.d_cq"}


def refusal(attention: dict) -> str | None:
    """The first ``model.attention`` field (a dict) that cannot start at the checkpoint's function, as
    one line naming it and what is accepted, or None."""
    for key, default in attention_defaults():
        value = lookup(attention, key, default)
        if key == "normalize" and not normalization(value).neutral:
            neutral = ", ".join(n.name for n in REGISTRY.values() if n.neutral)
            return f"model.attention.normalize={value}: no init reproduces the checkpoint (no softmax at any parameter); expected {neutral}"
        if key in NOT_NEUTRAL and value == NOT_NEUTRAL[key][0]:
            return f"model.attention.{key}={value}: no init reproduces the checkpoint ({NOT_NEUTRAL[key][1]})"
        if value != default and key not in NEUTRAL and key not in NOT_NEUTRAL:
            return f"model.attention.{key}={value}: no start at the checkpoint's function is known; expected {default}"
    return None


@torch.no_grad()
def neutral_init(model) -> None:
    """Set the parameters of ``model`` (a GPT holding a checkpoint's weights) that the checkpoint lacks."""
    for block in model.blocks:
        layer, attention = block.attn, block.attn.attention
        if attention.scale.rule != "learned":
            d = layer.d_k + (layer.latent.d_rope if layer.latent is not None else 0)
            fold = (1 / math.sqrt(d)) / attention.scale.value
            if fold != 1 and getattr(layer, "q_up", None) is not None:  # a query latent is RMS-normed: fold after it
                layer.q_up.weight.mul_(fold)
            elif fold != 1:
                layer.qkv_parts(layer.qkv_proj.weight).q.mul_(fold)
                if layer.qkv_proj.bias is not None:
                    layer.qkv_parts(layer.qkv_proj.bias).q.mul_(fold)
        if attention.escape is not None and attention.escape.kind == "learned":
            attention.escape.logit.fill_(NEUTRAL_ESCAPE_LOGIT)
        if layer.gate_proj is not None:
            layer.gate_proj.weight.zero_()
            layer.out_proj.weight.mul_(2)
