"""attnlab's state dict <-> transformers' (GPT2LMHeadModel, LlamaForCausalLM, DeepseekV3ForCausalLM),
tensor by tensor.

attnlab fuses q, k and v into ``qkv_proj`` (rows q, k, v) and SwiGLU's gate and up projections into
``mlp.fc`` (rows gate, up); GPT-2 fuses q, k, v too but stores its Linear layers as Conv1D, (in, out),
the transpose of nn.Linear's; Llama keeps each projection apart. Positions need no tensor: RoPE has
no parameters, and both use the GPT-NeoX layout (halves rotated, not interleaved pairs).

DeepSeek-V3's latent attention holds the same matrices as attnlab's (attention/module.py,
``_build_latent``) in other row orders: ``qkv_proj`` stacks q_proj (or q_a_proj) and
kv_a_proj_with_mqa (latent rows, then the RoPE key's); ``kv_up`` holds every head's key rows, then
every head's value rows, where kv_b_proj holds each head's key rows then its value rows. A checkpoint
saved with ``rope_interleave`` (DeepSeek's default) rotates interleaved pairs: its RoPE rows are
reordered into halves on the way in (an export writes rope_interleave=false).
"""

from __future__ import annotations

import torch

from attnlab.interop.families import InteropError

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
# DeepSeek-V3's attention in Llama's block (the other rows are Llama's); with a query latent (d_cq)
# the queries come from q_a_proj, its norm and q_b_proj, else from q_proj
LATENT = (
    ("attn.kv_norm", ("self_attn.kv_a_layernorm",), "norm"),
    ("attn.kv_up", ("self_attn.kv_b_proj",), "linear"),
)
QUERY_LATENT = (
    ("attn.q_latent_norm", ("self_attn.q_a_layernorm",), "norm"),
    ("attn.q_up", ("self_attn.q_b_proj",), "linear"),
)


def layer_modules(family: str, query_latent: bool) -> list[tuple[str, tuple[str, ...], str]]:
    """(attnlab module, the family's modules whose rows it stacks, kind) in one block."""
    if family == "gpt2":
        return [(ours, (two,), kind) for ours, two, _, kind in LAYER]
    rows = [(ours, llama, kind) for ours, _, llama, kind in LAYER]
    if family == "llama":
        return rows
    q = "self_attn.q_a_proj" if query_latent else "self_attn.q_proj"
    rows[1] = ("attn.qkv_proj", (q, "self_attn.kv_a_proj_with_mqa"), "linear")
    return rows[:2] + list(LATENT) + list(QUERY_LATENT if query_latent else ()) + rows[2:]


def tensor_names(
    family: str, n_layer: int, bias: bool, query_latent: bool = False
) -> list[tuple[str, list[str], bool]]:
    """(attnlab tensor, the family's tensors whose rows it stacks, stored transposed) for every tensor
    a checkpoint of ``family`` holds (``bias``: Llama's attention_bias and mlp_bias; ``query_latent``:
    DeepSeek-V3's q_lora_rank is set)."""
    gpt2 = family == "gpt2"
    modules = [(ours, (two,) if gpt2 else llama, kind) for ours, two, llama, kind in TOP]
    for i in range(n_layer):
        a, prefix = f"blocks.{i}.", f"transformer.h.{i}." if gpt2 else f"model.layers.{i}."
        rows = layer_modules(family, query_latent)
        modules += [(a + ours, tuple(prefix + n for n in theirs), kind) for ours, theirs, kind in rows]
    names = []
    for ours, theirs, kind in modules:
        if not theirs:  # Llama has no position table
            continue
        has_bias = kind != "embedding" and (gpt2 or (kind == "linear" and bias))
        for part in ("weight", "bias") if has_bias else ("weight",):
            transposed = gpt2 and kind == "linear" and part == "weight"
            names.append((f"{ours}.{part}", [f"{n}.{part}" for n in theirs], transposed))
    return names


def split_sizes(ours: str, cfg) -> tuple[int, ...]:
    """The row counts of the family's tensors that attnlab's fused tensor ``ours`` stacks."""
    if ".mlp.fc." in ours:
        return (cfg.mlp_hidden,) * 2
    latent = cfg.attention.latent
    if latent.d_c is not None:  # q (or its latent), then the key/value latent and the RoPE key
        return (latent.d_cq or cfg.n_head * (cfg.d_k + latent.d_rope), latent.d_c + latent.d_rope)
    kv = cfg.n_kv_head * cfg.d_k
    return (cfg.n_head * cfg.d_k, kv, kv)


def kv_rows_per_head(w: torch.Tensor, n_head: int, to_heads: bool) -> torch.Tensor:
    """attnlab's ``kv_up`` rows (every head's key, then every head's value) as kv_b_proj's (each
    head's key, then its value), or back when not ``to_heads``."""
    split = (2, n_head) if to_heads else (n_head, 2)
    return w.reshape(*split, -1, w.shape[-1]).transpose(0, 1).reshape(w.shape)


def halves_from_pairs(w: torch.Tensor, width: int) -> torch.Tensor:
    """Rows in groups of ``width`` (RoPE components), each group from interleaved pairs (x0, x1),
    (x2, x3), ... reordered into halves (x0, x2, ..., x1, x3, ...), as DeepSeek's rope_interleave
    reads them."""
    groups = w.reshape(-1, width // 2, 2, w.shape[-1])
    return groups.transpose(1, 2).reshape(w.shape)


def to_hf(family: str, state: Tensors, cfg) -> Tensors:
    """transformers' state dict from attnlab's (``cfg`` the GPTConfig). A GPT-2 without biases gets
    zero ones (GPT-2 always has them); a tied head is left to transformers to tie."""
    out: Tensors = {}
    query_latent = cfg.attention.latent.d_cq is not None
    for ours, theirs, transposed in tensor_names(family, cfg.n_layer, cfg.bias, query_latent):
        if ours == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if ours not in state:  # a projection bias of a bias-free model exported as GPT-2
            rows = state[ours.replace(".bias", ".weight")].shape[0]
            out[theirs[0]] = torch.zeros(rows, dtype=state["wte.weight"].dtype)
            continue
        t = state[ours].t() if transposed else state[ours]
        if ours.endswith("attn.kv_up.weight"):
            t = kv_rows_per_head(t, cfg.n_head, to_heads=True)
        parts = t.split(split_sizes(ours, cfg), dim=0) if len(theirs) > 1 else (t,)
        out.update({name: part.contiguous().clone() for name, part in zip(theirs, parts, strict=True)})
    return out


def _canonical(family: str, name: str) -> str:
    """Hub checkpoints name GPT-2's tensors without ``transformer.`` (openai's gpt2); save_pretrained with it."""
    if family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name


def from_hf(family: str, hf_state: Tensors, fields: dict, where: str, rope_interleave: bool = False) -> Tensors:
    """attnlab's state dict from transformers' (``fields``: the checkpoint's GPTConfig fields). A
    missing tensor is a one-line error naming it; a tied head comes from the token embedding.
    ``rope_interleave``: DeepSeek-V3's RoPE rows are interleaved pairs (its config.json's key)."""
    state = {_canonical(family, k): v for k, v in hf_state.items()}

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise InteropError(f"{where}: the weights hold no {name}; expected a complete {family} checkpoint")
        return state[name]

    latent = (fields.get("attention") or {}).get("latent") or {}
    out: Tensors = {}
    for ours, theirs, transposed in tensor_names(family, fields["n_layer"], fields["bias"], bool(latent.get("d_cq"))):
        if ours == "lm_head.weight":
            continue
        parts = [take(name) for name in theirs]
        if family == "deepseek_v3":
            parts = _deepseek_parts(ours, parts, fields, rope_interleave)
        t = torch.cat(parts, dim=0)
        out[ours] = t.t().contiguous() if transposed else t
    out["lm_head.weight"] = out["wte.weight"] if fields["tie_embeddings"] else take("lm_head.weight")
    return out


def _query_rope_halves(q: torch.Tensor, n_head: int, d_k: int, d_rope: int) -> torch.Tensor:
    """Query rows (each head's d_k content rows, then its d_rope RoPE rows) with the RoPE rows reordered."""
    heads = q.reshape(n_head, d_k + d_rope, -1)
    rope = halves_from_pairs(heads[:, d_k:].reshape(n_head * d_rope, -1), d_rope).view(n_head, d_rope, -1)
    return torch.cat([heads[:, :d_k], rope], dim=1).reshape(q.shape)


def _deepseek_parts(ours: str, parts: list[torch.Tensor], fields: dict, rope_interleave: bool) -> list[torch.Tensor]:
    """DeepSeek-V3's tensors of one attnlab tensor in attnlab's row order (the module docstring)."""
    latent, n_head, d_k = fields["attention"]["latent"], fields["n_head"], fields["d_k"]
    d_c, d_rope = latent["d_c"], latent["d_rope"]
    if ours.endswith("attn.kv_up.weight"):
        return [kv_rows_per_head(parts[0], n_head, to_heads=False)]
    if not rope_interleave:
        return parts
    if ours.endswith("attn.qkv_proj.weight"):
        q, kv = parts
        if not latent.get("d_cq"):  # q_proj holds the queries' RoPE rows; else q_b_proj does
            q = _query_rope_halves(q, n_head, d_k, d_rope)
        return [q, torch.cat([kv[:d_c], halves_from_pairs(kv[d_c:], d_rope)])]
    if ours.endswith("attn.q_up.weight"):
        return [_query_rope_halves(parts[0], n_head, d_k, d_rope)]
    return parts
