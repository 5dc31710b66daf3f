"""A small GPT in the manner of nanoGPT's model.py; the attention itself lives in attnlab.attention.

Differences from nanoGPT that the ablations need: the head dim d_k is independent of d_model
(n_head * d_k projects back to d_model), q and k may be LayerNorm'd (qk_norm), the init std is a
config value (a float, or ``fan_in`` for 1/sqrt(fan_in)), blocks may drop their MLP, the position
encoding is a choice (``pos_encoding``: learned, rope, alibi or none; attnlab.attention.position) and
each head's softmax may have an escape slot (``attention.escape``; attnlab.attention.sink). The attention
layer itself, and every variant of it, is attnlab.attention.AttentionLayer.

The block is GPT-2's by default (LayerNorm, a GELU MLP, tied embeddings, no biases); ``norm``, ``mlp``,
``bias`` and ``tie_embeddings`` make it Llama's (RMSNorm, SwiGLU, untied; conf/model/llama_tiny.yaml), so
checkpoints of either family load into it and leave it (attnlab.interop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention import Attention, AttentionConfig, AttentionLayer, Visibility
from attnlab.attention.cache import KVCache, RollingKVCache
from attnlab.attention.config import kv_values_per_token
from attnlab.attention.normalizations import REGISTRY, normalization
from attnlab.attention.position import POS_ENCODINGS
from attnlab.util.errors import ConfigError
from attnlab.util.fields import (
    Check,
    boolean,
    checked,
    choice,
    optional_positive_int,
    positive_int,
    positive_number,
    probability,
)

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "gelu_tanh", "swiglu")

# accepted by model.init_std: a float std, or fan_in for 1/sqrt(fan_in)
INIT_STD = Check(lambda v: v == "fan_in" or positive_number.ok(v), "a positive number or fan_in")


@dataclass
class GPTConfig:
    """``model``, the schema (attnlab.config.schema reads it beside the other sections): the sizes and what
    each block holds. The defaults are the tiny preset's; conf/model/tiny.yaml is their source for a
    run (every preset sets these keys) and tests/test_schema.py keeps the two equal."""

    vocab_size: int = checked(65, None, "the vocabulary's size", from_data=True)
    block_size: int = checked(64, positive_int, "the context length in tokens")
    n_layer: int = checked(4, positive_int, "transformer blocks", axis=True)
    n_head: int = checked(4, positive_int, "query heads per layer", axis=True)
    d_model: int = checked(128, positive_int, "the residual stream's width", axis=True)
    d_k: int | None = checked(
        None, optional_positive_int, "the head dim; null: d_model / n_head (n_head * d_k projects back)", axis=True
    )
    n_kv_head: int | None = checked(
        None,
        optional_positive_int,
        "key/value heads, a divisor of n_head (1: multi-query); null: n_head",
        axis=True,
    )
    dropout: float = checked(0.0, probability, "the dropout probability (0: no dropout layers)")
    init_std: float | str = checked(
        0.02, INIT_STD, "the Linear layers' init std, or fan_in for 1/sqrt(fan_in)", axis=True
    )
    attn_only: bool = checked(False, boolean, "blocks without their MLP", axis=True)
    pos_encoding: str = choice(
        "learned", POS_ENCODINGS, "learned, rope, alibi or none (attention/position.py)", axis=True
    )
    norm: str = choice(
        "layernorm", NORMS, "the blocks' and the final norm: layernorm (GPT-2) or rmsnorm (Llama)", axis=True
    )
    norm_eps: float = checked(1e-5, positive_number, "the norms' epsilon")
    mlp: str = choice(
        "gelu",
        MLPS,
        "the MLP: gelu, gelu_tanh (GPT-2's released weights) or swiglu (Llama: down(silu(gate x) * up x))",
        axis=True,
    )
    mlp_hidden: int | None = checked(
        None,
        optional_positive_int,
        "the MLP's hidden width; null: 4 d_model, or for swiglu 8/3 d_model rounded up to a multiple of 8",
    )
    bias: bool = checked(False, boolean, "biases on the attention and MLP projections (GPT-2 has them)")
    tie_embeddings: bool = checked(True, boolean, "the LM head and the token embedding share one weight")
    rope_base: float = checked(10000.0, positive_number, "RoPE's base (Llama's rope_theta)")
    init_from: str | None = checked(
        None,
        None,
        "a local Hugging Face model dir (GPT-2, Llama or DeepSeek-V3) the weights and the architecture start from (docs/interop.md)",
        accepted="null or a directory",
    )
    compile: bool = checked(False, boolean, "torch.compile the training and validation forwards (GPTModule)")
    attention: AttentionConfig = field(
        default_factory=AttentionConfig, metadata={"doc": "the attention schema (AttentionConfig)"}
    )

    def __post_init__(self):
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        self.d_k = self.head_dim(self.d_model, self.n_head, self.d_k)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.mlp_hidden is None:  # SwiGLU's two input matrices: 2/3 of the width keeps GELU's parameter count
            self.mlp_hidden = 4 * self.d_model if self.mlp != "swiglu" else -(-8 * self.d_model // 24) * 8

    @staticmethod
    def head_dim(d_model: int, n_head: int, d_k: int | None = None) -> int:
        """A head's width: ``d_k`` where set, else d_model / n_head (so n_head * d_k projects back to d_model).
        Static, for the readers that hold the model section as a dict or a DictConfig."""
        if not d_k and d_model % n_head:
            raise ConfigError(
                "model.d_model",
                d_model,
                f"a multiple of model.n_head={n_head} when model.d_k is null (or set model.d_k)",
            )
        return d_k or d_model // n_head

    def kv_cache_bytes(self, context: int, element_size: int) -> int:
        """Bytes one sequence's KV cache holds at ``context`` tokens, over every layer: the values of
        one entry (``kv_values_per_token``: keys and values, or the latent and the RoPE key) x
        ``element_size`` x the entries a query can still see, min(context, window + window_sinks)
        with a window (the kept first tokens and the most recent ones), else context. Over
        ``context`` it is ``mem/kv_cache_bytes_per_token``, bytes per token of context, so an arm
        whose cache stops growing compares with the others at one stated context. The decode path's
        plain ``KVCache`` keeps every position of a window model (the mask applies the window):
        this is what a cache that evicts needs, not what that one allocates."""
        entries = Visibility(True, self.attention.window, self.attention.window_sinks).keys_seen(context)
        return self.n_layer * kv_values_per_token(self.attention, self.n_kv_head, self.d_k) * element_size * entries


def norm_layer(cfg: GPTConfig) -> nn.Module:
    """LayerNorm (GPT-2; it keeps its bias whatever ``model.bias``) or RMSNorm (Llama), over d_model."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


def optional_dropout(p: float) -> nn.Dropout | None:
    """A dropout layer, or None when p = 0 (the forward then skips the call)."""
    return nn.Dropout(p) if p > 0 else None


class CausalSelfAttention(AttentionLayer):
    """The GPT's attention layer (attnlab.attention.AttentionLayer) built from its config; ``index``
    is the block's depth (a differential layer's lambda_init depends on it)."""

    def __init__(self, cfg: GPTConfig, index: int = 0):
        super().__init__(
            cfg.attention,
            cfg.d_model,
            cfg.n_head,
            cfg.d_k,
            cfg.n_kv_head,
            dropout=cfg.dropout,
            init_std=cfg.init_std,
            pos_encoding=cfg.pos_encoding,
            index=index,
            context=cfg.block_size,
            bias=cfg.bias,
            rope_base=cfg.rope_base,
        )


class MLP(nn.Module):
    """gelu: proj(gelu(fc x)). swiglu: ``fc`` holds the gate's rows, then the up projection's (one
    matmul, as qkv_proj), and proj(silu(gate x) * up x) is Llama's down(silu(gate x) * up x)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.kind = cfg.mlp
        hidden = cfg.mlp_hidden
        self.fc = nn.Linear(cfg.d_model, 2 * hidden if cfg.mlp == "swiglu" else hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.proj.is_residual = True
        self.dropout = optional_dropout(cfg.dropout)

    def forward(self, x):
        h = self.fc(x)  # (B, T, hidden), swiglu (B, T, 2 hidden)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh" if self.kind == "gelu_tanh" else "none")
        y = self.proj(h)  # (B, T, d_model)
        return y if self.dropout is None else self.dropout(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, index: int = 0):
        super().__init__()
        self.ln_1 = norm_layer(cfg)
        self.attn = CausalSelfAttention(cfg, index)
        self.ln_2 = None if cfg.attn_only else norm_layer(cfg)
        self.mlp = None if cfg.attn_only else MLP(cfg)

    def forward(self, x, key_padding_mask=None, cache: KVCache | RollingKVCache | None = None):
        x = x + self.attn(self.ln_1(x), key_padding_mask, cache)
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        if self.attn.attention.record_to is not None:
            self.attn.attention.intermediates.residual = x.detach()
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # absolute positions only with pos_encoding=learned (rope and alibi act in attention, none has none)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model) if cfg.pos_encoding == "learned" else None
        self.drop = optional_dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = norm_layer(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.wte.weight = self.lm_head.weight  # weight tying, as in nanoGPT
        self._head_t: tuple[tuple, torch.Tensor] | None = None  # next_logits' copy of the head (decode_head)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module):
        """Linear layers: N(0, init_std^2) or N(0, 1/fan_in); residual projections further
        divided by sqrt(2 n_layer) (GPT-2). Embeddings (tied with lm_head or not): N(0, 0.02^2)."""
        if isinstance(module, nn.Linear):
            fan_in = module.weight.shape[1]
            std = 1 / math.sqrt(fan_in) if self.cfg.init_std == "fan_in" else float(self.cfg.init_std)
            if module is self.lm_head:
                std = 0.02
            elif getattr(module, "is_residual", False):
                std /= math.sqrt(2 * self.cfg.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding) and module.weight is not self.lm_head.weight:
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def attention_layers(self) -> list[Attention]:
        return [block.attn.attention for block in self.blocks]

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(B, T) ids at positions start..start+T-1 -> (B, T, d_model): the residual stream entering block 0."""
        _, t = idx.shape
        if start + t > self.cfg.block_size:
            raise ValueError(f"sequence of length {start + t} exceeds model.block_size={self.cfg.block_size}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + t, device=idx.device))
        return x if self.drop is None else self.drop(x)

    def logits_from(self, x: torch.Tensor, layer: int = 0, key_padding_mask=None) -> torch.Tensor:
        """(B, T, vocab) logits when ``x`` (B, T, d_model) is the residual stream entering block
        ``layer``: an edit at one layer (the knockout) need not run the layers before it again."""
        for block in self.blocks[layer:]:
            x = block(x, key_padding_mask)
        return self.lm_head(self.ln_f(x))

    def forward(self, idx, targets=None, key_padding_mask=None):
        logits = self.logits_from(self.embed(idx), 0, key_padding_mask)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    def cache_refusal(self) -> str | None:
        """Why no KV cache decodes this model (its normalization's weights depend on the forward's
        length: attention/normalizations.py), or None."""
        name = self.cfg.attention.normalize
        if normalization(name).caches:
            return None
        takes = ", ".join(n.name for n in REGISTRY.values() if n.caches)
        return f"model.attention.normalize={name} takes no KV cache; expected {takes}, or decoding without a cache"

    def kv_caches(self, latent_decode: str = "auto") -> list[KVCache]:
        """An empty KV cache per layer, room for block_size positions (attention/cache.py);
        ``latent_decode``: how latent attention reads it (auto, absorbed or expanded)."""
        if (refusal := self.cache_refusal()) is not None:
            raise ValueError(refusal)
        return [KVCache(self.cfg.block_size, latent_decode) for _ in self.blocks]

    def rolling_kv_caches(self, capacity: int, sinks: int) -> list[RollingKVCache]:
        """A streaming cache per layer (attention/cache.py): the first ``sinks`` tokens and the most
        recent ones, ``capacity`` entries in all, positions counted inside the cache."""
        refusal = self.cache_refusal() or next(
            (r for layer in self.attention_layers() if (r := layer.visibility.rolling_cache_refusal())), None
        )
        if refusal is None and self.wpe is not None:
            refusal = (
                "model.pos_encoding=learned takes no rolling KV cache (a token's position is added to its "
                "embedding and cannot move inside the cache); expected rope, alibi or none"
            )
        if refusal is None and not 0 < capacity <= self.cfg.block_size:
            refusal = (
                f"rolling KV cache capacity={capacity}; expected 1..model.block_size={self.cfg.block_size} "
                "(the positions the model was trained on)"
            )
        if refusal is not None:
            raise ValueError(refusal)
        return [RollingKVCache(capacity, sinks) for _ in self.blocks]

    def next_logits(self, idx: torch.Tensor, caches: list[KVCache] | list[RollingKVCache]) -> torch.Tensor:
        """(B, vocab) logits after ``idx`` (B, T), which continues the sequence held in ``caches``
        (its keys and values are appended there): the LM head runs on the last position only."""
        x = self.embed(idx, caches[0].next_position(idx.shape[1]))
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache=cache)
        return self.decode_head(self.ln_f(x[:, -1]))

    def decode_head(self, x: torch.Tensor) -> torch.Tensor:
        """lm_head(x) for a decoding step. On CPU without autograd it multiplies by a (d_model, vocab)
        contiguous copy of the weight: MKL reads the vocabulary-sized matrix about a third faster in
        that layout for one to a few rows (GPT-2's head is a large part of a batch-1 step). The copy is
        remade when the weight changes (its storage or autograd's version counter; an edit through
        ``.data``, which that counter does not see, needs ``self._head_t = None``)."""
        w, head = self.lm_head.weight, self.lm_head
        if (
            x.device.type != "cpu"
            or (torch.is_grad_enabled() and w.requires_grad)
            or head._forward_hooks
            or head._forward_pre_hooks
        ):
            return head(x)  # autograd, or a hook that reads the head's calls
        key = (w.data_ptr(), w._version, w.dtype, w.shape)
        if self._head_t is None or self._head_t[0] != key:
            self._head_t = (key, w.detach().t().contiguous())
        return x @ self._head_t[1]

    @torch.no_grad()
    def generate(
        self,
        idx,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator=None,
        cache: bool = True,
        stream: tuple[int, int] | None = None,
    ):
        """Sample ``max_new_tokens`` after ``idx`` (B, T). Each step sees the last block_size tokens.

        ``cache``: the prompt is prefilled once, then each new token runs alone against the layers'
        cached keys and values. Once the context would pass block_size, the caches are refilled from
        the last block_size tokens at every step, which is exactly what the uncached path computes:
        a cache cannot slide, as every layer's keys above the first depend on the token that drops
        out, and learned positions would shift. ``cache=False`` reruns the context every step.

        ``stream=(capacity, sinks)``: rolling caches instead (``rolling_kv_caches``), never refilled:
        the prompt goes in in pieces of capacity - sinks tokens, and past capacity each token sees the
        first ``sinks`` tokens and the most recent ones only (not the uncached path's output).
        """
        if stream is not None:
            caches = self.rolling_kv_caches(*stream)
        else:
            caches = self.kv_caches() if cache and self.cache_refusal() is None else None
        for step in range(max_new_tokens):
            if caches is None:
                logits = self(idx[:, -self.cfg.block_size :])[0][:, -1, :]
            elif stream is not None and step == 0:  # the prompt, in pieces the rolling cache takes at once
                piece = stream[0] - stream[1]
                for start in range(0, idx.shape[1], piece):
                    logits = self.next_logits(idx[:, start : start + piece], caches)
            elif stream is not None:
                logits = self.next_logits(idx[:, -1:], caches)
            elif step == 0 or caches[0].length == self.cfg.block_size:
                for c in caches:
                    c.reset()
                logits = self.next_logits(idx[:, -self.cfg.block_size :], caches)
            else:
                logits = self.next_logits(idx[:, -1:], caches)
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
