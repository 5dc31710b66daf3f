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


# (attnlab module, GPT-2's, Llama's modules whose rows it stacks, kind); in block i each name is
# prefixed by blocks.{i}., transformer.h.{i}. and model.layers.{i}. A linear is GPT-2's Conv1D, its
# weight stored transposed, and its bias always there; Llama's norms (RMSNorm) have no bias.
TOP = (
    ("wte", "transformer.wte", ("model.embed_tokens",), "embedding"),
    ("wpe", "transformer.wpe", (), "embedding"),
    ("ln_f", "transformer.ln_f", ("model.norm",), "norm"),
    ("lm_head", "lm_head", ("lm_head",), "embedding"),
)
LAYER = (
    ("ln_1", "ln_1", ("input_layernorm",), "norm"),
    ("attn.qkv_proj", "attn.c_attn", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "linear"),
    ("attn.out_proj", "attn.c_proj", ("self_attn.o_proj",), "linear"),
    ("ln_2", "ln_2", ("post_attention_layernorm",), "norm"),
    ("mlp.fc", "mlp.c_fc", ("mlp.gate_proj", "mlp.up_proj"), "linear"),
    ("mlp.proj", "mlp.c_proj", ("mlp.down_proj",), "linear"),
)


def tensor_names(family: str, n_layer: int, bias: bool) -> list[tuple[str, list[str], bool]]:
    """(attnlab tensor, the family's tensors whose rows it stacks, stored transposed) for every tensor
    a checkpoint of ``family`` holds (``bias``: Llama's attention_bias and mlp_bias)."""
    gpt2 = family == "gpt2"
    modules = [*TOP]
    for i in range(n_layer):
        a, g, ll = f"blocks.{i}.", f"transformer.h.{i}.", f"model.layers.{i}."
        modules += [(a + ours, g + two, tuple(ll + n for n in llama), kind) for ours, two, llama, kind in LAYER]
    names = []
    for ours, two, llama, kind in modules:
        theirs = (two,) if gpt2 else llama
        if not theirs:  # Llama has no position table
            continue
        has_bias = kind != "embedding" and (gpt2 or (kind == "linear" and bias))
        for part in ("weight", "bias") if has_bias else ("weight",):
            transposed = gpt2 and kind == "linear" and part == "weight"
            names.append((f"{ours}.{part}", [f"{n}.{part}" for n in theirs], transposed))
    return names


def to_hf(family: str, state: Tensors, cfg) -> Tensors:
    """transformers' state dict from attnlab's (``cfg`` the GPTConfig). A GPT-2 without biases gets
    zero ones (GPT-2 always has them); a tied head is left to transformers to tie."""
    out: Tensors = {}
    kv = cfg.n_kv_head * cfg.d_k
    fused = {3: (cfg.n_head * cfg.d_k, kv, kv), 2: (cfg.mlp_hidden,) * 2}  # by parts: Llama's q, k, v; gate, up
    for ours, theirs, transposed in tensor_names(family, cfg.n_layer, cfg.bias):
        if ours == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if ours not in state:  # a projection bias of a bias-free model exported as GPT-2
            rows = state[ours.replace(".bias", ".weight")].shape[0]
            out[theirs[0]] = torch.zeros(rows, dtype=state["wte.weight"].dtype)
            continue
        t = state[ours].t() if transposed else state[ours]
        parts = t.split(fused[len(theirs)], dim=0) if len(theirs) > 1 else (t,)
        out.update({name: part.contiguous().clone() for name, part in zip(theirs, parts, strict=True)})
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
    for ours, theirs, transposed in tensor_names(family, fields["n_layer"], fields["bias"]):
        if ours != "lm_head.weight":
            t = torch.cat([take(name) for name in theirs], dim=0)
            out[ours] = t.t().contiguous() if transposed else t
    out["lm_head.weight"] = out["wte.weight"] if fields["tie_embeddings"] else take("lm_head.weight")
    return out
