"""KV-cache decoding: cached logits equal a full forward's at every position, on every backend and
every variant that takes a cache; causal masking of fewer queries than keys is bottom-right on
every backend; greedy and sampled generation are the same with and without the cache."""

from __future__ import annotations

import pytest
import torch
from test_cuda_paths import flash_attn_on_cpu  # noqa: F401  (the flash_attn stand-in, bottom-right causal)
from torch import nn

from attnlab.attention import backends
from attnlab.attention.cache import KVCache, RollingKVCache
from attnlab.attention.module import Knockout
from attnlab.attention.position import Rotary
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.util.errors import KernelUnavailable

BLOCK = 12
VARIANTS = {
    "learned": {},
    "rope": {"pos_encoding": "rope"},
    "alibi": {"pos_encoding": "alibi"},
    "nope": {"pos_encoding": "none"},
    "gqa_rope": {"pos_encoding": "rope", "n_kv_head": 2},
    "mqa": {"n_kv_head": 1},
    "zero_logit": {"attention": {"escape": "zero_logit"}},
    "learned_escape_gqa_rope": {"attention": {"escape": "learned"}, "n_kv_head": 2, "pos_encoding": "rope"},
    "alibi_escape_mqa": {"pos_encoding": "alibi", "attention": {"escape": "zero_logit"}, "n_kv_head": 1},
    "qk_norm_rope": {"pos_encoding": "rope", "attention": {"qk_norm": True}},
    "sigmoid": {"attention": {"normalize": "sigmoid"}},
    "sigmoid_gqa_rope": {"attention": {"normalize": "sigmoid"}, "n_kv_head": 2, "pos_encoding": "rope"},
    "mla_rope": {"pos_encoding": "rope", "attention": {"latent": {"d_c": 6, "d_rope": 4}}},
    "mla_query_latent_rope": {"pos_encoding": "rope", "attention": {"latent": {"d_c": 6, "d_rope": 2, "d_cq": 10}}},
    "mla_nope_escape": {"pos_encoding": "none", "attention": {"latent": {"d_c": 8}, "escape": "learned"}},
    "sigmoid_mla_rope": {
        "pos_encoding": "rope",
        "attention": {"latent": {"d_c": 6, "d_rope": 4}, "normalize": "sigmoid"},
    },
    # GPT-2's released block (projection biases, tanh GELU) and Llama's (conf/model/llama_tiny.yaml)
    "gpt2_biases": {"bias": True, "mlp": "gelu_tanh"},
    "llama": {"pos_encoding": "rope", "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False},
    "llama_learned_escape": {
        "pos_encoding": "rope",
        "n_kv_head": 2,
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "tie_embeddings": False,
        "attention": {"escape": "learned"},
    },
}
REFUSED = {("flash", "alibi"), ("flash", "alibi_escape_mqa")}  # forced flash takes no logit bias
REFUSED |= {(b, v) for b in ("sdpa", "flash") for v in VARIANTS if v.startswith("sigmoid")}  # softmax kernels
CASES = [(b, v) for b in backends.BACKENDS for v in VARIANTS if (b, v) not in REFUSED]


def tiny_model(backend: str, variant: str, dtype=torch.float64, seed: int = 0) -> GPT:
    """A 2-layer model with every parameter drawn at std 0.5: weights far from uniform, so a wrong
    mask or a wrong position changes the logits."""
    torch.manual_seed(seed)
    spec = dict(VARIANTS[variant])
    attention = {"backend": backend, **spec.pop("attention", {})}
    cfg = GPTConfig(vocab_size=13, block_size=BLOCK, n_layer=2, n_head=4, d_model=16, attention=attention, **spec)
    model = GPT(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.5)
    return model


def tokens(b: int = 2, t: int = BLOCK, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 13, (b, t), generator=torch.Generator().manual_seed(seed))


def cached_logits(model: GPT, idx: torch.Tensor) -> dict[int, torch.Tensor]:
    """{position: logits} from a prefill of 4 tokens, a chunk of 3 over the cache, then one token
    at a time to the end."""
    caches, out = model.kv_caches(), {}
    for start, end in [(0, 4), (4, 7), *((i, i + 1) for i in range(7, idx.shape[1]))]:
        out[end - 1] = model.next_logits(idx[:, start:end], caches)
    return out


# ------------------------------------------------------------------------ causal alignment


@pytest.mark.parametrize("t_q", [1, 3])
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_fewer_queries_than_keys_are_the_last_positions(backend, t_q):
    """Queries over more keys are the last t_q positions (bottom-right): each fused kernel agrees
    with the explicit one, and the last query sees every key. (PyTorch's is_causal alone aligns
    top-left, where one query would see key 0 only.)"""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64) for t in (t_q, 6, 6))
    explicit, _ = backends.attend("scaled", q, k, v, 0.35)
    fused, _ = backends.attend(backend, q, k, v, 0.35)
    torch.testing.assert_close(fused, explicit, atol=1e-12, rtol=0)
    full = torch.softmax((q[:, :, -1:] @ k.transpose(-2, -1)) * 0.35, -1) @ v  # the last query: no mask at all
    torch.testing.assert_close(fused[:, :, -1:], full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("t_q", [1, 3])
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_escape_slot_and_groups_with_fewer_queries_than_keys(backend, t_q):
    torch.manual_seed(0)
    q = torch.randn(2, 4, t_q, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 6, 8, dtype=torch.float64), torch.randn(2, 2, 6, 8, dtype=torch.float64)
    escape = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    explicit, _ = backends.attend("scaled", q, k, v, 0.35, escape=escape)
    fused, _ = backends.attend(backend, q, k, v, 0.35, escape=escape)
    torch.testing.assert_close(fused, explicit, atol=1e-12, rtol=0)


@pytest.mark.parametrize("t_q", [1, 3])
def test_flash_attn_package_gets_fewer_queries_than_keys(flash_attn_on_cpu, t_q):  # noqa: F811
    torch.manual_seed(0)
    q = torch.randn(2, 4, t_q, 8, dtype=torch.bfloat16)
    k, v = torch.randn(2, 2, 6, 8, dtype=torch.bfloat16), torch.randn(2, 2, 6, 8, dtype=torch.bfloat16)
    out, kernel = backends.attend("flash", q, k, v, 0.35)
    assert kernel == "flash_attn" and flash_attn_on_cpu.calls[-1]["shape"] == (2, t_q, 4, 8)
    explicit, _ = backends.attend("scaled", q.double(), k.double(), v.double(), 0.35)
    torch.testing.assert_close(out.double(), explicit, atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------- cached = full forward


@pytest.mark.parametrize("backend,variant", CASES)
def test_cached_logits_equal_the_full_forward_at_every_position(backend, variant):
    model = tiny_model(backend, variant)
    idx = tokens()
    with torch.no_grad():
        full = model(idx)[0]
        for position, logits in cached_logits(model, idx).items():
            torch.testing.assert_close(logits, full[:, position], atol=1e-10, rtol=0, msg=f"position {position}")


@pytest.mark.parametrize("tie", [True, False])
def test_decoding_head_follows_the_weights_it_copies(tie):
    """next_logits' head copy is remade after an optimizer step and a load_state_dict, untied or tied
    to the embedding; with autograd on, the logits keep their gradient."""
    model = tiny_model("sdpa", "gpt2_biases")
    model.cfg.tie_embeddings = tie
    if not tie:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    idx = tokens()

    def check():
        with torch.no_grad():
            full = model(idx)[0]
            for position, logits in cached_logits(model, idx).items():
                torch.testing.assert_close(logits, full[:, position], atol=1e-10, rtol=0)

    check()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(idx, idx)[1].backward()
    opt.step()
    check()
    other = tiny_model("sdpa", "gpt2_biases", seed=3).state_dict()
    model.load_state_dict(other, strict=False)
    check()
    logits = model.next_logits(idx, model.kv_caches())
    logits.sum().backward()
    assert logits.requires_grad and model.lm_head.weight.grad is not None


@pytest.mark.parametrize("backend,variant", CASES)
def test_generation_is_the_same_with_and_without_the_cache(backend, variant):
    """Greedy and seeded sampling, past block_size (where the caches are refilled every step)."""
    model = tiny_model(backend, variant)
    prompt = tokens(t=3)
    greedy = [model.generate(prompt, 2 * BLOCK, top_k=1, cache=c) for c in (True, False)]
    assert torch.equal(*greedy) and greedy[0].shape == (2, 3 + 2 * BLOCK)
    sampled = [
        model.generate(prompt, 2 * BLOCK, generator=torch.Generator().manual_seed(5), cache=c) for c in (True, False)
    ]
    assert torch.equal(*sampled)


@pytest.mark.parametrize("variant", ["rope", "gqa_rope", "learned_escape_gqa_rope", "mqa"])
def test_cached_decoding_through_flash_attn(flash_attn_on_cpu, variant):  # noqa: F811
    """flash_attn (the stand-in, under bf16 autocast as on a GPU) decodes with one query over the
    cache; its logits follow the fp32 full forward (the explicit kernel) as closely as a bf16 full
    forward does."""
    model = tiny_model("flash", variant, dtype=torch.float32)
    idx = tokens()
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            full_bf16 = model(idx)[0].float()
            cached = cached_logits(model, idx)
        model.cfg.attention.backend = "scaled"  # the layers share this config: the same weights, explicitly, in fp32
        reference = model(idx)[0]
    # one query per decoding step; with an escape slot a decoding step takes the explicit route (no padded cache)
    assert any(call["shape"][1] == 1 for call in flash_attn_on_cpu.calls) == ("escape" not in variant)
    assert all(call["causal"] for call in flash_attn_on_cpu.calls if call["shape"][1] > 1)
    bf16_error = (full_bf16 - reference).abs().max().item()
    for position, logits in cached.items():
        assert (logits.float() - reference[:, position]).abs().max().item() <= 2 * bf16_error + 1e-2, position


# ------------------------------------------------------------------------------ the cache


def test_cache_holds_the_key_value_heads_not_their_expansion():
    model = tiny_model("sdpa", "gqa_rope")
    caches = model.kv_caches()
    with torch.no_grad():
        model.next_logits(tokens(t=5), caches)
    assert [c.length for c in caches] == [5, 5]
    assert caches[0].k.shape == caches[0].v.shape == (2, 2, BLOCK, 4)  # (B, n_kv_head, block_size, d_k)


def test_a_latent_cache_holds_the_latent_and_the_rotated_rope_key():
    """MLA: one row per position, (B, 1, block, d_c + d_rope): the normed latent, then the RoPE key
    rotated at its position; no values."""
    model = tiny_model("sdpa", "mla_rope")
    idx, caches = tokens(t=5), model.kv_caches()
    with torch.no_grad():
        model.next_logits(idx[:, :2], caches)
        model.next_logits(idx[:, 2:5], caches)
        attn = model.blocks[0].attn
        _, c, k_rope = attn.qkv_proj(model.blocks[0].ln_1(model.embed(idx))).split(attn.qkv_sizes, dim=-1)
    assert caches[0].k.shape == (2, 1, BLOCK, 6 + 4) and caches[0].v is None
    torch.testing.assert_close(caches[0].k[:, :, :5, 6:], attn.rotary(k_rope.unsqueeze(1)), atol=1e-12, rtol=0)
    torch.testing.assert_close(caches[0].k[:, 0, :5, :6], attn.kv_norm(c), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"n_kv_head": 2, "pos_encoding": "rope", "attention": {"latent": {"d_c": 6, "d_rope": 4}}}, "model.n_kv_head"),
        ({"pos_encoding": "learned", "attention": {"latent": {"d_c": 6, "d_rope": 4}}}, "latent.d_rope"),
        ({"pos_encoding": "rope", "attention": {"latent": {"d_c": 6}}}, "latent.d_rope"),
        ({"pos_encoding": "rope", "attention": {"latent": {"d_rope": 4}}}, "latent.d_c"),
        ({"pos_encoding": "rope", "attention": {"latent": {"d_c": 6, "d_rope": 4}, "qk_norm": True}}, "qk_norm"),
    ],
)
def test_latent_attention_refuses_what_it_cannot_build_in_one_line(change, key):
    from attnlab.util.errors import ConfigError

    spec = dict(change)
    with pytest.raises(ConfigError, match=key) as err:
        GPT(GPTConfig(vocab_size=13, block_size=BLOCK, n_layer=1, n_head=4, d_model=16, **spec))
    assert "\n" not in str(err.value)


def test_cached_keys_are_rotated_at_their_own_positions():
    rotary = Rotary(8)
    x = torch.randn(2, 3, 10, 8, dtype=torch.float64)
    torch.testing.assert_close(rotary(x[:, :, 4:], 4), rotary(x)[:, :, 4:], atol=1e-12, rtol=0)
    model = tiny_model("scaled", "rope")
    idx, caches = tokens(t=6), model.kv_caches()
    with torch.no_grad():
        model.next_logits(idx[:, :2], caches)
        model.next_logits(idx[:, 2:6], caches)
        attn = model.blocks[0].attn
        k = model.blocks[0].ln_1(model.embed(idx)) @ attn.qkv_parts(attn.qkv_proj.weight).k.T
    torch.testing.assert_close(caches[0].k[:, :, :6], attn.rotary(attn._heads(k)), atol=1e-12, rtol=0)


def test_lm_head_runs_on_the_last_position_only():
    model = tiny_model("scaled", "learned")
    seen = []
    model.lm_head.register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    model.generate(tokens(t=5), 3)
    assert seen == [(2, 16)] * 3


def test_cache_and_positions_stop_at_block_size():
    cache = KVCache(4)
    cache.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="block_size") as err:
        cache.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))
    assert "\n" not in str(err.value)
    model = tiny_model("scaled", "learned")
    caches = model.kv_caches()
    with torch.no_grad():
        model.next_logits(tokens(t=BLOCK - 1), caches)
        with pytest.raises(ValueError, match="model.block_size=12"):
            model.next_logits(tokens(t=2), caches)


def test_sigmoid_weights_do_not_depend_on_the_forward_length():
    """sigmoid's -log n uses the keys a query sees at the full context (the block), not the keys of
    the forward: a prefix's logits are the full forward's first positions (what makes a cache
    possible), and a block-long forward is what it always was (n = T)."""
    model = tiny_model("scaled", "sigmoid")
    idx = tokens()
    with torch.no_grad():
        full = model(idx)[0]
        torch.testing.assert_close(model(idx[:, :5])[0], full[:, :5], atol=1e-10, rtol=0)
    layer = model.blocks[0].attn.attention
    q, k = (torch.randn(1, 4, BLOCK, 4, dtype=torch.float64) for _ in range(2))
    p = layer.weights(q, k).p
    logits = (q @ k.transpose(-2, -1)) * layer.softmax_scale()
    causal = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
    expected = torch.sigmoid(logits - torch.log(torch.tensor(float(BLOCK)))).masked_fill(~causal, 0)
    torch.testing.assert_close(p, expected.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("window,sinks,n", [(None, 0, BLOCK), (4, 0, 4), (4, 2, 6), (11, 3, BLOCK)])
def test_sigmoid_n_counts_the_keys_a_window_leaves_visible(window, sinks, n):
    model = GPT(
        GPTConfig(
            vocab_size=13,
            block_size=BLOCK,
            n_layer=1,
            n_head=2,
            d_model=8,
            attention={"normalize": "sigmoid", "window": window, "window_sinks": sinks},
        )
    )
    assert model.blocks[0].attn.attention.weight_rule().context_keys == n


@pytest.mark.parametrize("variant", ["alibi", "alibi_escape_mqa"])
def test_flash_with_alibi_is_refused_with_the_cache_too(variant):
    model = tiny_model("flash", variant)
    with pytest.raises(KernelUnavailable, match="no logit bias"):
        model.generate(tokens(t=3), 2)


def test_knockout_takes_no_cache():
    model = tiny_model("scaled", "learned")
    model.attention_layers()[0].knockout = Knockout(torch.zeros(2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="knockout"):
        model.generate(tokens(t=3), 2)


# ------------------------------------------------------------------------------ attnlab sample


def test_sample_and_its_timing_with_and_without_the_cache(make_cfg, capsys, tmp_path):
    import json
    from pathlib import Path

    from attnlab.inference.sample import main
    from attnlab.tools.bench import decode
    from attnlab.training.train import train

    cfg = make_cfg("trainer.max_steps=2", "model.n_layer=2", "model.pos_encoding=rope")
    train(cfg)
    run = str(Path(cfg.paths.output_dir))
    texts = []
    for flags in ([], ["--no-cache"]):
        main([run, "--tokens", "80", "--seed", "3", *flags])
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and len(texts[0]) > 80
    main([run, "--tokens", "80", "--seed", "3", "--stream", "16:2"])
    streamed = capsys.readouterr().out
    assert len(streamed) == len(texts[0]) and streamed[:15] == texts[0][:15]  # the same until the first eviction
    decode.main([f"{run}:20", "--repeats", "2", "--stream", "16:2", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "sample_speed.json").read_text())["runs"][0]
    assert row["tokens"] == 20 and row["identical_text"] and row["stream"] == {"capacity": 16, "sinks": 2}
    assert [len(row["seconds"][arm]) for arm in ("cached", "uncached", "stream")] == [2, 2, 2]
    assert row["speedup"] == pytest.approx(row["median_s"]["uncached"] / row["median_s"]["cached"])
    assert "| rope | 20 |" in (tmp_path / "sample_speed.md").read_text()


# ------------------------------------------------------------------- rolling (streaming) cache

CAPACITY, SINKS = 6, 2
ROLLING_VARIANTS = [
    "rope",
    "alibi",
    "nope",
    "gqa_rope",
    "learned_escape_gqa_rope",
    "alibi_escape_mqa",
    "mla_rope",
    "llama",
]
ROLLING_CASES = [(b, v) for b in backends.BACKENDS for v in ROLLING_VARIANTS if (b, v) not in REFUSED]
PIECES = [(0, 3), *((i, i + 1) for i in range(3, 9)), (9, 12), *((i, i + 1) for i in range(12, 16))]


def kept_tokens(idx: torch.Tensor, end: int) -> torch.Tensor:
    """The tokens a rolling cache holds after tokens 0..end-1: the sinks and the most recent ones."""
    if end <= CAPACITY:
        return idx[:, :end]
    return torch.cat([idx[:, :SINKS], idx[:, end - (CAPACITY - SINKS) : end]], dim=1)


@pytest.mark.parametrize("backend,variant", ROLLING_CASES)
def test_rolling_cache_equals_a_direct_recompute_over_the_kept_tokens(backend, variant):
    """One layer: a token's keys and values depend on that token alone, so each step's logits must
    be a full forward's over the kept tokens (sinks, then the most recent), at their positions in
    the cache; through evictions by single tokens and by a piece of three."""
    model = tiny_model(backend, variant)
    del model.blocks[1]
    idx = tokens(t=16)
    caches = model.rolling_kv_caches(CAPACITY, SINKS)
    with torch.no_grad():
        for start, end in PIECES:
            logits = model.next_logits(idx[:, start:end], caches)
            assert caches[0].length == min(end, CAPACITY)
            direct = model(kept_tokens(idx, end))[0][:, -1]
            torch.testing.assert_close(logits, direct, atol=1e-10, rtol=0, msg=f"after {end} tokens")


@pytest.mark.parametrize("variant", ["rope", "alibi", "gqa_rope"])
def test_rolling_cache_of_two_layers(variant):
    """Before any eviction it is the full forward; after, each layer holds the sinks' and the most
    recent tokens' entries, keys before RoPE (layer 0's are the kept tokens' own projections)."""
    model = tiny_model("sdpa", variant)
    idx = tokens(t=16)
    caches = model.rolling_kv_caches(CAPACITY, SINKS)
    with torch.no_grad():
        full = model(idx[:, :CAPACITY])[0]
        for start, end in PIECES:
            logits = model.next_logits(idx[:, start:end], caches)
            if end <= CAPACITY:
                torch.testing.assert_close(logits, full[:, end - 1], atol=1e-10, rtol=0)
        attn = model.blocks[0].attn
        x, parts = model.blocks[0].ln_1(model.wte(kept_tokens(idx, 16))), attn.qkv_parts(attn.qkv_proj.weight)
        k, v = x @ parts.k.T, x @ parts.v.T
    assert [c.length for c in caches] == [CAPACITY, CAPACITY]
    torch.testing.assert_close(caches[0].k, attn._heads(k), atol=1e-12, rtol=0)
    torch.testing.assert_close(caches[0].v, attn._heads(v), atol=1e-12, rtol=0)


def test_streaming_generation_runs_past_block_size():
    model = tiny_model("scaled", "rope")
    prompt = tokens(t=9)  # more than capacity - sinks: the prompt goes in in pieces
    out = [model.generate(prompt, 3 * BLOCK, top_k=1, stream=(CAPACITY, SINKS)) for _ in range(2)]
    assert out[0].shape == (2, 9 + 3 * BLOCK) and torch.equal(*out)
    short = model.generate(prompt[:, :2], CAPACITY - 2, top_k=1, stream=(CAPACITY, SINKS))
    assert torch.equal(short, model.generate(prompt[:, :2], CAPACITY - 2, top_k=1))  # no eviction yet: exact


@pytest.mark.parametrize(
    "variant,capacity,sinks,match",
    [
        ("learned", 6, 2, "model.pos_encoding=learned takes no rolling KV cache"),
        ("rope", BLOCK + 1, 2, "capacity=13; expected 1..model.block_size=12"),
        ("rope", 6, 6, "sinks=6 with capacity=6; expected 0 <= sinks < capacity"),
    ],
)
def test_rolling_cache_refusals_are_one_line(variant, capacity, sinks, match):
    model = tiny_model("scaled", variant)
    with pytest.raises(ValueError, match=match) as err:
        model.generate(tokens(t=3), 2, stream=(capacity, sinks))
    assert "\n" not in str(err.value)
    cache = RollingKVCache(6, 2)
    with pytest.raises(ValueError, match="at most capacity - sinks = 4 tokens at a time, got 5"):
        cache.update(torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8))


def test_sample_of_a_sigmoid_run_uses_the_cache(make_cfg, capsys):
    from pathlib import Path

    from attnlab.inference.sample import main
    from attnlab.training.train import train

    cfg = make_cfg("trainer.max_steps=2", "model.n_layer=1", "model.attention.normalize=sigmoid")
    train(cfg)
    capsys.readouterr()
    run = str(Path(cfg.paths.output_dir))
    main([run, "--tokens", "20", "--seed", "3"])
    cached = capsys.readouterr()
    main([run, "--tokens", "20", "--seed", "3", "--no-cache"])
    assert capsys.readouterr().out == cached.out and len(cached.out) > 20 and "no KV cache" not in cached.err


def test_sample_of_a_tokenized_run_reads_its_own_tokenizer(make_cfg, capsys, tmp_path):
    from pathlib import Path

    from attnlab.data.prepare import prepare
    from attnlab.data.text import shakespeare_text
    from attnlab.inference.sample import main
    from attnlab.training.train import train

    corpus = tmp_path / "bpe"
    prepare(corpus, shakespeare_text()[:50_000], "shakespeare[:50000]", vocab_size=300)
    cfg = make_cfg(
        "data=tokens",
        f"data.dir={corpus}",
        "trainer.max_steps=2",
        "model.n_layer=1",
        "model.d_model=32",
        "model.n_head=2",
        "model.block_size=32",
        "data.batch_size=4",
        "data.val_batches=2",
    )
    train(cfg)
    capsys.readouterr()
    texts = []
    for flags in ([], ["--no-cache"]):
        main([str(Path(cfg.paths.output_dir)), "--tokens", "40", "--prompt", "ROMEO:", *flags])
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("ROMEO:")
