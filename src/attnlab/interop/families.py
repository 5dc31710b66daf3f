"""GPT-2 and Llama as attnlab configurations: what each architecture can express, and the
translation of its config.json to GPTConfig's fields and back.

GPT-2's block is attnlab's default block (learned positions, LayerNorm, a GELU MLP, tied
embeddings); Llama's is RoPE (the GPT-NeoX layout attnlab uses), RMSNorm, SwiGLU and grouped-query
attention. Both scale logits by 1/sqrt(d_k) and normalise them with a plain softmax over the causal
past, so every attention variant that changes that function is refused by name.
"""

from __future__ import annotations

from ..errors import AttnlabError

FAMILIES = ("gpt2", "llama")


class InteropError(AttnlabError):
    """A checkpoint or a configuration that the other side cannot express; one line naming the field."""


def family_of(model: dict) -> str:
    """The architecture a model config exports as: learned positions are GPT-2's, RoPE is Llama's."""
    pos = model.get("pos_encoding", "learned")
    if pos == "learned":
        return "gpt2"
    if pos == "rope":
        return "llama"
    raise InteropError(
        f"model.pos_encoding={pos}: neither GPT-2 nor Llama has it; expected learned (GPT-2) or rope (Llama)"
    )


# attention fields every exportable model leaves at these values: each one changes the function the
# target's attention computes (its scale is 1/sqrt(d_k), its weights a softmax over every earlier key)
ATTENTION_PLAIN = {
    "scaling": "inv_sqrt_d",
    "qk_norm": False,
    "normalize": "softmax",
    "escape": "none",
    "gate": "none",
    "window": None,
    "differential": False,
}
# per family: block fields whose value the target's architecture fixes
BLOCK = {
    "gpt2": {"norm": ("layernorm",), "mlp": ("gelu", "gelu_tanh"), "attn_only": (False,)},
    "llama": {"norm": ("rmsnorm",), "mlp": ("swiglu",), "attn_only": (False,)},
}
NAMES = {"gpt2": "GPT-2", "llama": "Llama"}


def refusal(model: dict) -> str | None:
    """The first field of ``model`` (GPTConfig's dict) its family cannot express, as one line, or None."""
    try:
        family = family_of(model)
    except InteropError as err:
        return str(err)
    name = NAMES[family]
    attention = model.get("attention") or {}
    for key, plain in ATTENTION_PLAIN.items():
        value = attention.get(key, plain)
        if value != plain:
            return f"model.attention.{key}={value}: {name} cannot express it; expected {plain}"
    for key, accepted in BLOCK[family].items():
        if model.get(key) not in accepted:
            return f"model.{key}={model.get(key)}: {name} has no such block; expected {' or '.join(map(str, accepted))}"
    d_k = model.get("d_k") or model["d_model"] // model["n_head"]
    if family == "gpt2":
        if d_k * model["n_head"] != model["d_model"]:
            return f"model.d_k={d_k}: GPT-2's heads split d_model; expected d_model / n_head = {model['d_model'] // model['n_head']}"
        if (model.get("n_kv_head") or model["n_head"]) != model["n_head"]:
            return f"model.n_kv_head={model['n_kv_head']}: GPT-2 has no grouped-query attention; expected n_head"
    return None


def hf_config(model: dict) -> dict:
    """transformers' config kwargs (GPT2Config or LlamaConfig) for an exportable model config."""
    problem = refusal(model)
    if problem:
        raise InteropError(problem)
    family = family_of(model)
    d_k = model.get("d_k") or model["d_model"] // model["n_head"]
    # attnlab has no end-of-text token: no id stops transformers' generate early
    common = {
        "vocab_size": model["vocab_size"],
        "tie_word_embeddings": model.get("tie_embeddings", True),
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if family == "gpt2":
        dropout = model.get("dropout", 0.0)
        return common | {
            "model_type": "gpt2",
            "n_positions": model["block_size"],
            "n_embd": model["d_model"],
            "n_layer": model["n_layer"],
            "n_head": model["n_head"],
            "n_inner": model["mlp_hidden"],
            "activation_function": "gelu_new" if model["mlp"] == "gelu_tanh" else "gelu",
            "layer_norm_epsilon": model.get("norm_eps", 1e-5),
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
            "attn_pdrop": dropout,
        }
    return common | {
        "model_type": "llama",
        "hidden_size": model["d_model"],
        "intermediate_size": model["mlp_hidden"],
        "num_hidden_layers": model["n_layer"],
        "num_attention_heads": model["n_head"],
        "num_key_value_heads": model.get("n_kv_head") or model["n_head"],
        "head_dim": d_k,
        "max_position_embeddings": model["block_size"],
        "rms_norm_eps": model.get("norm_eps", 1e-5),
        "rope_theta": float(model.get("rope_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": model.get("bias", False),
        "mlp_bias": model.get("bias", False),
    }


def _hf_refusal(where: str, key: str, value, expected: str) -> InteropError:
    return InteropError(f"{where}: config.json's {key}={value!r} has no attnlab equivalent; expected {expected}")


def model_fields(hf: dict, where: str) -> dict:
    """GPTConfig's fields (``model.<key>``) that a checkpoint's config.json fixes. ``block_size`` is
    the longest context the checkpoint was made for; ``where`` names the checkpoint in errors."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        raise InteropError(f"{where}: config.json's model_type={kind!r}; expected one of {', '.join(FAMILIES)}")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise _hf_refusal(where, "activation_function", act, "gelu, gelu_new or gelu_pytorch_tanh")
        for key, plain in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
            if hf.get(key, plain) != plain:
                raise _hf_refusal(where, key, hf[key], str(plain).lower())
        d = hf["n_embd"]
        return {
            "vocab_size": hf["vocab_size"],
            "block_size": hf["n_positions"],
            "n_layer": hf["n_layer"],
            "n_head": hf["n_head"],
            "d_model": d,
            "d_k": d // hf["n_head"],
            "n_kv_head": hf["n_head"],
            "pos_encoding": "learned",
            "norm": "layernorm",
            "norm_eps": hf.get("layer_norm_epsilon", 1e-5),
            "mlp": "gelu" if act == "gelu" else "gelu_tanh",
            "mlp_hidden": hf.get("n_inner") or 4 * d,
            "bias": True,
            "tie_embeddings": hf.get("tie_word_embeddings", True),
        }
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _hf_refusal(where, "hidden_act", act, "silu")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise _hf_refusal(where, "rope_type", rope_type, "default (no RoPE scaling)")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise _hf_refusal(where, "mlp_bias", hf.get("mlp_bias"), f"attention_bias={hf.get('attention_bias')}")
    heads = hf["num_attention_heads"]
    return {
        "vocab_size": hf["vocab_size"],
        "block_size": hf["max_position_embeddings"],
        "n_layer": hf["num_hidden_layers"],
        "n_head": heads,
        "d_model": hf["hidden_size"],
        "d_k": hf.get("head_dim") or hf["hidden_size"] // heads,
        "n_kv_head": hf.get("num_key_value_heads") or heads,
        "pos_encoding": "rope",
        "rope_base": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        "norm": "rmsnorm",
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "mlp": "swiglu",
        "mlp_hidden": hf["intermediate_size"],
        "bias": bool(hf.get("attention_bias", False)),
        "tie_embeddings": hf.get("tie_word_embeddings", False),
    }
