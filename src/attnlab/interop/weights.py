"""attnlab's state dict <-> transformers' (GPT2LMHeadModel, LlamaForCausalLM), tensor by tensor.

attnlab fuses q, k and v into ``qkv_proj`` (rows q, k, v) and SwiGLU's gate and up projections into
``mlp.fc`` (rows gate, up); GPT-2 fuses q, k, v too but stores its Linear layers as Conv1D, (in, out),
the transpose of nn.Linear's; Llama keeps each projection apart. Positions need no tensor: RoPE has
no parameters, and both use the GPT-NeoX layout (halves rotated, not interleaved pairs).
"""

from __future__ import annotations

import torch

from .families import InteropError

Tensors = dict[str, torch.Tensor]


def _gpt2_layer(i: int) -> list[tuple[str, str, bool]]:
    """(attnlab name, GPT-2 name, transposed) of layer i's tensors."""
    a, h = f"blocks.{i}.", f"transformer.h.{i}."
    pairs = [
        ("ln_1.weight", "ln_1.weight", False),
        ("ln_1.bias", "ln_1.bias", False),
        ("attn.qkv_proj.weight", "attn.c_attn.weight", True),
        ("attn.qkv_proj.bias", "attn.c_attn.bias", False),
        ("attn.out_proj.weight", "attn.c_proj.weight", True),
        ("attn.out_proj.bias", "attn.c_proj.bias", False),
        ("ln_2.weight", "ln_2.weight", False),
        ("ln_2.bias", "ln_2.bias", False),
        ("mlp.fc.weight", "mlp.c_fc.weight", True),
        ("mlp.fc.bias", "mlp.c_fc.bias", False),
        ("mlp.proj.weight", "mlp.c_proj.weight", True),
        ("mlp.proj.bias", "mlp.c_proj.bias", False),
    ]
    return [(a + x, h + y, t) for x, y, t in pairs]


def _gpt2_names(n_layer: int) -> list[tuple[str, str, bool]]:
    top = [
        ("wte.weight", "transformer.wte.weight", False),
        ("wpe.weight", "transformer.wpe.weight", False),
        ("ln_f.weight", "transformer.ln_f.weight", False),
        ("ln_f.bias", "transformer.ln_f.bias", False),
        ("lm_head.weight", "lm_head.weight", False),
    ]
    return top + [n for i in range(n_layer) for n in _gpt2_layer(i)]


# Llama's tensors that attnlab fuses: attnlab name -> the Llama names whose rows it stacks
def _llama_layer(i: int) -> list[tuple[str, list[str]]]:
    a, h = f"blocks.{i}.", f"model.layers.{i}."
    pairs = [
        ("ln_1.weight", ["input_layernorm.weight"]),
        ("attn.qkv_proj.weight", ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]),
        ("attn.qkv_proj.bias", ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]),
        ("attn.out_proj.weight", ["self_attn.o_proj.weight"]),
        ("attn.out_proj.bias", ["self_attn.o_proj.bias"]),
        ("ln_2.weight", ["post_attention_layernorm.weight"]),
        ("mlp.fc.weight", ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
        ("mlp.fc.bias", ["mlp.gate_proj.bias", "mlp.up_proj.bias"]),
        ("mlp.proj.weight", ["mlp.down_proj.weight"]),
        ("mlp.proj.bias", ["mlp.down_proj.bias"]),
    ]
    return [(a + x, [h + y for y in ys]) for x, ys in pairs]


def _llama_names(n_layer: int) -> list[tuple[str, list[str]]]:
    top = [("wte.weight", ["model.embed_tokens.weight"]), ("ln_f.weight", ["model.norm.weight"])]
    top.append(("lm_head.weight", ["lm_head.weight"]))
    return top + [n for i in range(n_layer) for n in _llama_layer(i)]


def to_hf(family: str, state: Tensors, cfg) -> Tensors:
    """transformers' state dict from attnlab's (``cfg`` the GPTConfig). A GPT-2 without biases gets
    zero ones (GPT-2 always has them); a tied head is left to transformers to tie."""
    out: Tensors = {}
    if family == "gpt2":
        for ours, theirs, transposed in _gpt2_names(cfg.n_layer):
            if ours == "lm_head.weight" and cfg.tie_embeddings:
                continue
            if ours not in state:  # a projection bias of a bias-free model
                rows = state[ours.replace(".bias", ".weight")].shape[0]
                out[theirs] = torch.zeros(rows, dtype=state["wte.weight"].dtype)
                continue
            t = state[ours]
            out[theirs] = t.t().contiguous() if transposed else t.clone()
        return out
    attention = cfg.n_head * cfg.d_k, cfg.n_kv_head * cfg.d_k, cfg.n_kv_head * cfg.d_k
    for ours, theirs in _llama_names(cfg.n_layer):
        if ours not in state or (ours == "lm_head.weight" and cfg.tie_embeddings):
            continue
        sizes = attention if "qkv_proj" in ours else (cfg.mlp_hidden,) * 2 if "mlp.fc" in ours else None
        parts = state[ours].split(sizes, dim=0) if sizes else (state[ours],)
        out.update({name: part.clone() for name, part in zip(theirs, parts, strict=True)})
    return out


def _canonical(family: str, name: str) -> str:
    """Hub checkpoints name GPT-2's tensors without ``transformer.`` (openai's gpt2); save_pretrained with it."""
    if family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name


def from_hf(family: str, hf_state: Tensors, fields: dict, where: str) -> Tensors:
    """attnlab's state dict from transformers' (``fields``: the checkpoint's GPTConfig fields). A
    missing tensor is a one-line error naming it; a tied head comes from the token embedding."""
    state = {_canonical(family, k): v for k, v in hf_state.items()}

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise InteropError(f"{where}: the weights hold no {name}; expected a complete {family} checkpoint")
        return state[name]

    out: Tensors = {}
    tied = fields["tie_embeddings"]
    if family == "gpt2":
        for ours, theirs, transposed in _gpt2_names(fields["n_layer"]):
            if ours == "lm_head.weight":
                continue
            t = take(theirs)
            out[ours] = t.t().contiguous() if transposed else t
    else:
        for ours, theirs in _llama_names(fields["n_layer"]):
            if ours == "lm_head.weight" or (ours.endswith(".bias") and not fields["bias"]):
                continue
            out[ours] = torch.cat([take(name) for name in theirs], dim=0)
    out["lm_head.weight"] = out["wte.weight"] if tied else take("lm_head.weight")
    return out
