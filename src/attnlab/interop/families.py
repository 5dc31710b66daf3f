"""GPT-2, Llama and DeepSeek-V3 as attnlab configurations: what each architecture can express, and
the translation of its config.json to GPTConfig's fields and back.

GPT-2's block is attnlab's default block (learned positions, LayerNorm, a GELU MLP, tied
embeddings); Llama's is RoPE (the GPT-NeoX layout attnlab uses), RMSNorm, SwiGLU and grouped-query
attention; DeepSeek-V3's, with dense MLPs in every layer, is Llama's block with multi-head latent
attention (``model.attention.latent``). All scale logits by 1/sqrt of the query-key width and
normalise them with a plain softmax over the causal past, so every attention variant that changes
that function is refused by name.
"""

from __future__ import annotations

import dataclasses

from attnlab.attention.config import AttentionConfig
from attnlab.model.gpt import GPTConfig
from attnlab.util.errors import AttnlabError

FAMILIES = ("gpt2", "llama", "deepseek_v3")
NAMES = {"gpt2": "GPT-2", "llama": "Llama", "deepseek_v3": "DeepSeek-V3"}


class InteropError(AttnlabError):
    """A checkpoint or a configuration that the other side cannot express; one line naming the field."""


def latent_width(model: dict) -> int | None:
    """``model.attention.latent.d_c`` of a model config (GPTConfig's dict), or None."""
    return ((model.get("attention") or {}).get("latent") or {}).get("d_c")


def family_of(model: dict) -> str:
    """The architecture a model config exports as: a latent is DeepSeek-V3's, else learned positions
    are GPT-2's and RoPE is Llama's."""
    pos = model.get("pos_encoding", "learned")
    if (d_c := latent_width(model)) is not None:
        if pos == "rope":
            return "deepseek_v3"
        raise InteropError(
            f"model.pos_encoding={pos}: DeepSeek-V3's latent attention (model.attention.latent.d_c={d_c}) "
            "carries positions in its RoPE key; expected rope"
        )
    if pos == "learned":
        return "gpt2"
    if pos == "rope":
        return "llama"
    raise InteropError(
        f"model.pos_encoding={pos}: neither GPT-2 nor Llama has it; expected learned (GPT-2) or rope (Llama)"
    )


# AttentionConfig's fields an export maps at a value other than their default, and the families that
# map it. Every other field must hold its default: the list is checked against AttentionConfig's own
# fields, so a field added there is refused by name until an entry here says how it maps.
MAPPED = {
    "backend": FAMILIES,  # every backend computes the same function
    "mask_fill": FAMILIES,  # a masked logit's weight is 0 at every accepted fill
    "latent.d_c": ("deepseek_v3",),  # kv_lora_rank
    "latent.d_rope": ("deepseek_v3",),  # qk_rope_head_dim
    "latent.d_cq": ("deepseek_v3",),  # q_lora_rank (null: q_proj)
}


def attention_defaults(cls=None, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key under model.attention, default) for every field of ``cls`` (AttentionConfig), nested
    configs walked."""
    out = []
    for f in dataclasses.fields(cls or AttentionConfig):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            out += attention_defaults(f.default_factory, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, f.default))
    return out


def lookup(tree: dict, dotted: str, default):
    """``tree``'s value at a dotted key, or ``default`` where a level is missing."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


# per family: block fields whose value the target's architecture fixes (DeepSeek-V3's MLP and its
# q_proj and kv_b_proj have no bias)
BLOCK = {
    "gpt2": {"norm": ("layernorm",), "mlp": ("gelu", "gelu_tanh"), "attn_only": (False,)},
    "llama": {"norm": ("rmsnorm",), "mlp": ("swiglu",), "attn_only": (False,)},
    "deepseek_v3": {"norm": ("rmsnorm",), "mlp": ("swiglu",), "attn_only": (False,), "bias": (False,)},
}


def refusal(model: dict) -> str | None:
    """The first field of ``model`` (GPTConfig's dict) its family cannot express, as one line, or None."""
    try:
        family = family_of(model)
    except InteropError as err:
        return str(err)
    name = NAMES[family]
    attention = model.get("attention") or {}
    for key, default in attention_defaults():
        value = lookup(attention, key, default)
        if value != default and family not in MAPPED.get(key, ()):
            return f"model.attention.{key}={value}: {name} cannot express it; expected {default}"
    for key, accepted in BLOCK[family].items():
        if model.get(key) not in accepted:
            return f"model.{key}={model.get(key)}: {name} has no such block; expected {' or '.join(map(str, accepted))}"
    d_k = GPTConfig.head_dim(model["d_model"], model["n_head"], model.get("d_k"))
    if family == "gpt2":
        if d_k * model["n_head"] != model["d_model"]:
            return f"model.d_k={d_k}: GPT-2's heads split d_model; expected d_model / n_head = {GPTConfig.head_dim(model['d_model'], model['n_head'])}"
        if (model.get("n_kv_head") or model["n_head"]) != model["n_head"]:
            return f"model.n_kv_head={model['n_kv_head']}: GPT-2 has no grouped-query attention; expected n_head"
    return None


def hf_config(model: dict) -> dict:
    """transformers' config kwargs (GPT2Config, LlamaConfig or DeepseekV3Config) for an exportable model config."""
    problem = refusal(model)
    if problem:
        raise InteropError(problem)
    family = family_of(model)
    d_k = GPTConfig.head_dim(model["d_model"], model["n_head"], model.get("d_k"))
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
    llama_block = {
        "hidden_size": model["d_model"],
        "intermediate_size": model["mlp_hidden"],
        "num_hidden_layers": model["n_layer"],
        "num_attention_heads": model["n_head"],
        "max_position_embeddings": model["block_size"],
        "rms_norm_eps": model.get("norm_eps", 1e-5),
        "rope_theta": float(model.get("rope_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": model.get("bias", False),
    }
    if family == "llama":
        return (
            common
            | llama_block
            | {
                "model_type": "llama",
                "num_key_value_heads": model.get("n_kv_head") or model["n_head"],
                "head_dim": d_k,
                "mlp_bias": model.get("bias", False),
            }
        )
    latent = model["attention"]["latent"]
    return (
        common
        | llama_block
        | {
            "model_type": "deepseek_v3",
            # every layer dense: the MoE fields are unused, no expert is built
            "first_k_dense_replace": model["n_layer"],
            "num_key_value_heads": model["n_head"],  # keys and values are expanded per head from the latent
            "kv_lora_rank": latent["d_c"],
            "q_lora_rank": latent.get("d_cq"),
            "qk_rope_head_dim": latent["d_rope"],
            "qk_nope_head_dim": d_k,
            "v_head_dim": d_k,
            "rope_interleave": False,  # attnlab's RoPE rotates halves (GPT-NeoX), not interleaved pairs
            "num_nextn_predict_layers": 0,
        }
    )


def _hf_refusal(where: str, key: str, value, expected: str) -> InteropError:
    return InteropError(f"{where}: config.json's {key}={value!r} has no attnlab equivalent; expected {expected}")


NO_LATENT = {"d_c": None, "d_rope": 0, "d_cq": None}

# the config.json key each model field is read from, per family (the refusals of model.init_from
# quote it); a field absent here follows from model_type
CONFIG_KEYS = {
    "gpt2": {
        "block_size": "n_positions",
        "n_layer": "n_layer",
        "n_head": "n_head",
        "d_model": "n_embd",
        "n_kv_head": "n_head",
        "norm_eps": "layer_norm_epsilon",
        "mlp": "activation_function",
        "mlp_hidden": "n_inner",
        "tie_embeddings": "tie_word_embeddings",
    },
    "llama": {
        "block_size": "max_position_embeddings",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "d_model": "hidden_size",
        "d_k": "head_dim",
        "n_kv_head": "num_key_value_heads",
        "rope_base": "rope_theta",
        "norm_eps": "rms_norm_eps",
        "mlp_hidden": "intermediate_size",
        "bias": "attention_bias",
        "tie_embeddings": "tie_word_embeddings",
    },
}
CONFIG_KEYS["deepseek_v3"] = CONFIG_KEYS["llama"] | {
    "d_k": "qk_nope_head_dim",
    "n_kv_head": "num_attention_heads",
    "attention.latent.d_c": "kv_lora_rank",
    "attention.latent.d_rope": "qk_rope_head_dim",
    "attention.latent.d_cq": "q_lora_rank",
}


def source(hf: dict, key: str, value) -> str:
    """Where config.json fixes the model field ``key`` (dotted under model) at ``value``, as text."""
    kind = hf.get("model_type")
    name = CONFIG_KEYS.get(kind, {}).get(key)
    if key.startswith("attention.latent.") and name is None:
        return f"model_type={kind!r}: no latent attention"
    if name == "rope_theta":
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        return f"rope_theta={rope.get('rope_theta', hf.get('rope_theta', value))!r}"
    if name is not None and hf.get(name) is not None:
        return f"{name}={hf[name]!r}"
    return f"model_type={kind!r}: {key}={value!r}"


def _default_rope(hf: dict, where: str) -> float:
    """RoPE's base of a Llama or DeepSeek-V3 config.json; RoPE scaling (YaRN, llama3) is refused."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise _hf_refusal(where, "rope_type", rope_type, "default (no RoPE scaling)")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


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
            "attention": {"latent": dict(NO_LATENT)},
        }
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _hf_refusal(where, "hidden_act", act, "silu")
    rope_base = _default_rope(hf, where)
    heads = hf["num_attention_heads"]
    block = {
        "vocab_size": hf["vocab_size"],
        "block_size": hf["max_position_embeddings"],
        "n_layer": hf["num_hidden_layers"],
        "n_head": heads,
        "d_model": hf["hidden_size"],
        "pos_encoding": "rope",
        "rope_base": rope_base,
        "norm": "rmsnorm",
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "mlp": "swiglu",
        "mlp_hidden": hf["intermediate_size"],
    }
    if kind == "llama":
        if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
            raise _hf_refusal(where, "mlp_bias", hf.get("mlp_bias"), f"attention_bias={hf.get('attention_bias')}")
        return block | {
            "d_k": hf.get("head_dim") or hf["hidden_size"] // heads,
            "n_kv_head": hf.get("num_key_value_heads") or heads,
            "bias": bool(hf.get("attention_bias", False)),
            "tie_embeddings": hf.get("tie_word_embeddings", False),
            "attention": {"latent": dict(NO_LATENT)},
        }
    layers = hf["num_hidden_layers"]
    if (hf.get("first_k_dense_replace") or 0) < layers:
        raise _hf_refusal(
            where,
            "first_k_dense_replace",
            hf.get("first_k_dense_replace"),
            f"num_hidden_layers={layers} (a dense MLP in every layer; attnlab has no mixture of experts)",
        )
    if hf.get("attention_bias", False):
        raise _hf_refusal(where, "attention_bias", True, "false (attnlab's biases would reach the MLP)")
    d_k = hf["qk_nope_head_dim"]
    if hf.get("v_head_dim", d_k) != d_k:
        raise _hf_refusal(where, "v_head_dim", hf["v_head_dim"], f"qk_nope_head_dim={d_k} (one head dim)")
    d_rope = hf.get("qk_rope_head_dim") or 0
    if d_rope <= 0 or d_rope % 2:
        raise _hf_refusal(where, "qk_rope_head_dim", d_rope, "a positive even integer")
    return block | {
        "d_k": d_k,
        "n_kv_head": heads,
        "bias": False,
        "tie_embeddings": hf.get("tie_word_embeddings", False),
        "attention": {"latent": {"d_c": hf["kv_lora_rank"], "d_rope": d_rope, "d_cq": hf.get("q_lora_rank")}},
    }


def flat(fields: dict, prefix: str = "") -> dict:
    """A nested model dict as dotted keys: {"attention": {"latent": {"d_c": 8}}} -> {"attention.latent.d_c": 8}."""
    out = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out
