"""The gate, the sliding window and the differential map against float64 references with gradients
on every backend; the layer's intermediates record; the refusals, one line each."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from attnlab.analysis.probe import probe
from attnlab.attention import (
    BACKENDS,
    Attention,
    AttentionConfig,
    AttentionLayer,
    Knockout,
    Visibility,
    WeightRule,
    allowed_mask,
    backends,
)
from attnlab.attention.module import differential_lambda_init
from attnlab.attention.stats import attention_stats, signed_map_mass, uniform_sink_mass
from attnlab.model import GPT, GPTConfig
from attnlab.util.errors import KernelUnavailable

D_MODEL, H, D, T = 16, 2, 8, 9


def visible(t_q: int, t_k: int, window: int | None = None, sinks: int = 0) -> torch.Tensor:
    """(t_q, t_k) bool written out by position: query i (the last t_q of t_k) sees key j <= i
    with i - j < window, or j < sinks."""
    i = torch.arange(t_k - t_q, t_k)[:, None]
    j = torch.arange(t_k)[None, :]
    near = torch.ones(t_q, t_k, dtype=torch.bool) if window is None else (i - j < window) | (j < sinks)
    return (j <= i) & near


def softmax_attention(q, k, v, scale, allowed, escape=None):
    """Float64 softmax(s q k^T + M) v; an appended escape logit column with ``escape`` (H,)."""
    logits = (q.double() @ k.double().transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    if escape is not None:
        column = escape.double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        return torch.softmax(torch.cat([logits, column], -1), -1)[..., :-1] @ v.double()
    return torch.softmax(logits, -1) @ v.double()


def layer_reference(layer: AttentionLayer, x: torch.Tensor, window=None, sinks=0) -> torch.Tensor:
    """The whole layer in float64 from its own parameters: projections, window, gate, output projection."""
    cfg = layer.attention.cfg
    b, t, _ = x.shape
    w_q, w_k, w_v = (w.double() for w in layer.qkv_parts(layer.qkv_proj.weight))
    heads = lambda y: y.view(b, t, H, D).transpose(1, 2)  # noqa: E731
    x = x.double()
    out = softmax_attention(
        heads(x @ w_q.T), heads(x @ w_k.T), heads(x @ w_v.T), 1 / math.sqrt(D), visible(t, t, window, sinks)
    )
    if cfg.gate != "none":
        g = torch.sigmoid(x @ layer.gate_proj.weight.double().T)  # (B, T, H) or (B, T, H * D)
        out = out * g.view(b, t, H, -1).transpose(1, 2)
    return out.transpose(1, 2).reshape(b, t, H * D) @ layer.out_proj.weight.double().T


def make_layer(**attention) -> AttentionLayer:
    torch.manual_seed(0)
    layer = AttentionLayer(AttentionConfig(**attention), D_MODEL, H, D)
    for p in layer.parameters():  # the model's init: N(0, 0.02) would leave the reference check too easy
        torch.nn.init.normal_(p, std=0.3)
    return layer


def grads(layer: AttentionLayer, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1)
    target = torch.randn(y.shape)  # float32 draws for both: a float64 draw would be other numbers
    params = [x, *layer.parameters()]
    return torch.autograd.grad((y * target.to(y.dtype)).sum(), params)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gate_matches_float64_reference_with_gradients(backend, gate):
    layer = make_layer(backend=backend, gate=gate)
    x = torch.randn(2, T, D_MODEL, requires_grad=True)
    y = layer(x)
    ref_layer = make_layer(backend=backend, gate=gate).double()
    x_ref = x.detach().double().requires_grad_()
    ref = layer_reference(ref_layer, x_ref)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(layer, x, y), grads(ref_layer, x_ref, ref)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_at_the_models_init_depends_on_the_input(gate):
    """Not a constant: a zero-initialised gate would be sigmoid(0) = 0.5 everywhere, plain
    attention halved, which a check at init cannot tell from a gate that ignores its input."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=20, block_size=T, n_layer=1, n_head=H, d_model=D_MODEL, attention={"gate": gate})
    ).eval()
    (rec,) = probe(model, torch.randint(20, (4, T)))
    assert rec.gate.shape == (4, H, T, 1 if gate == "headwise" else D)
    assert float(rec.gate.std()) > 0.01
    assert not torch.allclose(rec.out, 0.5 * rec.attended, atol=1e-4)
    torch.testing.assert_close(rec.out, rec.attended * rec.gate)


@pytest.mark.parametrize("backend", ["naive", "scaled", "sdpa"])
@pytest.mark.parametrize("window, sinks", [(1, 0), (3, 0), (3, 2), (T, 0)])
def test_window_matches_float64_reference_with_gradients(backend, window, sinks):
    layer = make_layer(backend=backend, window=window, window_sinks=sinks)
    x = torch.randn(2, T, D_MODEL, requires_grad=True)
    y = layer(x)
    ref_layer = make_layer(backend=backend, window=window, window_sinks=sinks).double()
    x_ref = x.detach().double().requires_grad_()
    ref = layer_reference(ref_layer, x_ref, window, sinks)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(layer, x, y), grads(ref_layer, x_ref, ref)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    if window < T:  # a real window changes the output
        plain = make_layer(backend=backend)
        assert not torch.allclose(plain(x), y, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS[:3])
def test_window_with_an_escape_slot_and_fewer_queries_than_keys(backend):
    """The escape slot's extra key and a block of queries over cached keys keep the window's offsets."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, n, D, generator=gen) for n in (4, T, T))
    attn = Attention(AttentionConfig(backend, escape="learned", window=3, window_sinks=1), H, D)
    attn.escape.logit.data = torch.tensor([-0.5, 1.0])
    want = softmax_attention(q, k, v, 1 / math.sqrt(D), visible(4, T, 3, 1), attn.escape.logit)
    torch.testing.assert_close(attn(q, k, v).double(), want, atol=1e-5, rtol=1e-5)


class FlashAttnWindowStandIn:
    """flash_attn_func's contract with window_size=(left, right): key j visible to query i (bottom-right
    aligned) when i - left <= j <= i + right, and causal; -1 for no limit."""

    def __init__(self):
        self.window_sizes = []

    def __call__(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)):
        assert q.dtype in (torch.float16, torch.bfloat16)
        self.window_sizes.append(window_size)
        q, k, v = (x.transpose(1, 2).double() for x in (q, k, v))
        t_q, t_k = q.shape[-2], k.shape[-2]
        i = torch.arange(t_k - t_q, t_k)[:, None]
        j = torch.arange(t_k)[None, :]
        left, right = window_size
        allowed = j <= i if causal else torch.ones(t_q, t_k, dtype=torch.bool)
        allowed = allowed & ((j >= i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
        out = torch.softmax((q @ k.transpose(-2, -1) * softmax_scale).masked_fill(~allowed, float("-inf")), -1) @ v
        return out.transpose(1, 2).to(torch.bfloat16)


def test_window_on_flash_attn_and_the_forced_kernels_refusal(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, T, D, generator=gen) for _ in range(3))
    attn = Attention(AttentionConfig("flash", window=3), H, D)
    with pytest.raises(KernelUnavailable, match="model.attention.window=3") as err:
        attn(q, k, v)
    assert "\n" not in str(err.value)
    fn = FlashAttnWindowStandIn()
    module = types.ModuleType("flash_attn")
    module.flash_attn_func = fn
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(backends, "FLASH_ATTN_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(backends, "_FLASH_ATTN", {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(q, k, v)
    assert attn.kernel == "flash_attn" and fn.window_sizes == [(2, 0)]
    want = softmax_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 1 / math.sqrt(D), visible(T, T, 3))
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    with (
        pytest.raises(KernelUnavailable, match="model.attention.window_sinks=2") as err,
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        Attention(AttentionConfig("flash", window=3, window_sinks=2), H, D)(q, k, v)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("window, sinks", [(None, 0), (3, 0), (3, 1)])
def test_window_visibility_is_the_one_mask_the_statistics_read(window, sinks):
    """Uniform rows (q = 0) under the window: the weights vanish outside it, entropy is log k_i of
    each query's k_i visible keys, and sink_mass is the windowed uniform reference."""
    mask = allowed_mask(T, T, True, None, window=window, window_sinks=sinks)[0, 0]
    assert torch.equal(mask, visible(T, T, window, sinks))
    k = torch.randn(1, H, T, D, generator=torch.Generator().manual_seed(5))
    q = torch.zeros(1, H, T, D)
    attn = Attention(AttentionConfig("scaled", window=window, window_sinks=sinks), H, D)
    p = attn.probabilities(q, k)
    assert torch.all(p[..., ~mask] == 0) and torch.allclose(p.sum(-1), torch.ones(1, H, T))
    stats = attention_stats(q, k, attn.weight_rule(fp32=True))
    n = mask.sum(-1)[mask.sum(-1) > 1].double()
    torch.testing.assert_close(stats["entropy"].double(), n.log().mean().expand(H), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        stats["sink_mass"].double(),
        torch.full((H,), uniform_sink_mass(T, Visibility(True, window, sinks)), dtype=torch.float64),
        atol=1e-6,
        rtol=1e-5,
    )
    if window is None:
        assert uniform_sink_mass(T) == pytest.approx(sum(1 / (i + 1) for i in range(1, T)) / (T - 1))


@pytest.mark.parametrize("backend", ["scaled", "sdpa"])
def test_kv_cache_with_a_window_gives_the_full_forwards_logits(backend):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=20,
            block_size=16,
            n_layer=2,
            n_head=H,
            d_model=D_MODEL,
            pos_encoding="rope",
            attention={"backend": backend, "window": 4, "window_sinks": 1},
        )
    ).eval()
    idx = torch.randint(20, (2, 12))
    full = model(idx)[0]
    caches = model.kv_caches()
    with torch.no_grad():
        steps = [model.next_logits(idx[:, :5], caches)] + [
            model.next_logits(idx[:, i : i + 1], caches) for i in range(5, 12)
        ]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="model.attention.window=4 takes no rolling KV cache") as err:
        model.rolling_kv_caches(8, 1)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key, value, accepted",
    [
        ("window", 0, "null or an integer >= 1"),
        ("window_sinks", -1, "null or an integer >= 0"),
        ("gate", "both", "none, headwise, elementwise"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(key, value, accepted):
    with pytest.raises(ValueError, match=f"model.attention.{key}") as err:
        AttentionConfig(**{key: value, **({"window": 4} if key == "window_sinks" else {})})
    assert accepted in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="model.attention.window_sinks=2 needs model.attention.window"):
        AttentionConfig(window_sinks=2)


@dataclass(frozen=True)
class Chunked(Visibility):
    """A rule defined here alone: query i sees key j only inside its own chunk of ``chunk`` positions."""

    chunk: int = 4

    @property
    def beyond_causal(self) -> bool:
        return True

    def near(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return rows[:, None] // self.chunk == keys[None, :] // self.chunk


def chunked_visible(t_q: int, t_k: int, chunk: int) -> torch.Tensor:
    """(t_q, t_k) bool written out by position: query i (the last t_q of t_k) sees key j <= i of its chunk."""
    i = torch.arange(t_k - t_q, t_k)[:, None]
    j = torch.arange(t_k)[None, :]
    return (j <= i) & (i // chunk == j // chunk)


class ChunkedAttention(Attention):
    @property
    def visibility(self) -> Visibility:
        return Chunked(self.causal, chunk=3)


@pytest.mark.parametrize("backend", BACKENDS[:3])
@pytest.mark.parametrize("escape", ["none", "learned"])
@pytest.mark.parametrize("t_q", [1, 4, T])
def test_a_visibility_rule_defined_in_masks_alone_reaches_every_consumer(backend, escape, t_q):
    """A Visibility subclass runs unchanged through the explicit and SDPA kernels (the escape
    slot's route included), WeightRule and Attention, agreeing with a float64 reference."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, H, n, D, generator=gen) for n in (t_q, T, T))
    allowed, s = chunked_visible(t_q, T, 3), 1 / math.sqrt(D)
    rule = Chunked(chunk=3)
    assert torch.equal(rule.mask(t_q, T)[0, 0], allowed)
    attn = ChunkedAttention(AttentionConfig(backend, escape=escape), H, D)
    assert torch.equal(attn.visible(T), chunked_visible(T, T, 3))
    logit = None
    if escape != "none":
        attn.escape.logit.data = torch.tensor([-0.5, 1.0])
        logit = attn.escape.logit
    want = softmax_attention(q, k, v, s, allowed, logit)
    torch.testing.assert_close(attn(q, k, v).double(), want, atol=1e-5, rtol=1e-5)
    out, _ = backends.attend(backend, q, k, v, s, escape=logit, visibility=rule)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    p = WeightRule(scale=s, visibility=rule, escape=logit)(q, k).p
    torch.testing.assert_close(p.double() @ v.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn.weights(q, k).p, p)
    with pytest.raises(KernelUnavailable, match="forced flash kernel takes no mask") as err:
        backends.attend("flash", q, k, v, s, visibility=rule)
    assert "\n" not in str(err.value)


def differential_reference(attn: Attention, q, k, v) -> torch.Tensor:
    """Ye et al. 2024 in float64: (A1 - lambda A2) v, RMSNorm per head, times 1 - lambda_init."""
    (q1, q2), (k1, k2) = q.double().chunk(2, -1), k.double().chunk(2, -1)
    allowed, s = visible(q.shape[-2], k.shape[-2]), 1 / math.sqrt(q.shape[-1] // 2)
    lam = (
        torch.exp((attn.lambda_q1.double() * attn.lambda_k1.double()).sum())
        - torch.exp((attn.lambda_q2.double() * attn.lambda_k2.double()).sum())
        + attn.lambda_init
    )
    out = softmax_attention(q1, k1, v, s, allowed) - lam * softmax_attention(q2, k2, v, s, allowed)
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.head_norm.weight.double()
    return out * (1 - attn.lambda_init)


@pytest.mark.parametrize("backend", BACKENDS)
def test_differential_matches_float64_reference_with_gradients(backend):
    torch.manual_seed(0)
    d = 16  # halves of 8: the smallest head dim PyTorch's CPU flash kernel takes
    attn = Attention(AttentionConfig(backend, differential=True), H, d, index=2)
    assert attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.6))
    with torch.no_grad():
        attn.head_norm.weight.normal_(1.0, 0.3)
    q, k, v = (torch.randn(2, H, T, d, requires_grad=True) for _ in range(3))
    out = attn(q, k, v)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = differential_reference(attn, *leaves)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    target = torch.randn_like(want)
    params = [attn.lambda_q1, attn.lambda_k2, attn.head_norm.weight]
    got = torch.autograd.grad((out * target.float()).sum(), [q, k, v, *params])
    ref = torch.autograd.grad((want * target).sum(), leaves + params)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r.double(), atol=1e-4, rtol=1e-4)
    assert differential_lambda_init(0) == pytest.approx(0.2)


def test_differential_weights_are_the_signed_map_and_a_knockout_of_nothing_is_the_forward():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=20,
            block_size=T,
            n_layer=2,
            n_head=H,
            d_model=D_MODEL,
            pos_encoding="rope",
            attention={"differential": True},
        )
    )
    idx = torch.randint(20, (2, T))
    model(idx, idx)[1].backward()
    assert model.blocks[1].attn.attention.lambda_q1.grad is not None
    for rec in probe(model, idx):
        layer = rec.layer
        (q1, k1), (q2, k2) = layer.maps(rec.q, rec.k)
        rule = layer.weight_rule(fp32=True)
        want = rule(q1, k1).p - layer.differential_lambda().detach() * rule(q2, k2).p
        torch.testing.assert_close(layer.weights(rec.q, rec.k).p, want)
        # the knockout's recomputation (signed map, head norm) cutting nothing gives the kernel's output
        layer.knockout = Knockout(torch.zeros(2, T, T, dtype=torch.bool), head=1)
        with torch.no_grad():
            out = layer(rec.q, rec.k, rec.v)
        layer.knockout = None
        torch.testing.assert_close(out, rec.attended, atol=1e-5, rtol=1e-5)


def test_the_differential_maps_absolute_and_negative_mass_have_their_known_values():
    """A1 one-hot on the first key, A2 uniform, lambda = lambda_init = 0.2 (index 0): row i of
    A1 - lambda A2 is 1 - lambda/(i+1) on key 0 and -lambda/(i+1) on the i others, so its negative
    mass is lambda i/(i+1) and its absolute mass 1 - lambda/(i+1) + lambda i/(i+1)."""
    attn = Attention(AttentionConfig("scaled", differential=True), 1, 2)
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        torch.nn.init.zeros_(getattr(attn, name))
    lam = differential_lambda_init(0)
    q = torch.tensor([1.0, 0.0]).expand(1, 1, T, 2).clone()  # half 1: logit 40 on key 0; half 2: all zero
    k = torch.zeros(1, 1, T, 2)
    k[..., 0, 0] = 40.0
    rec = types.SimpleNamespace(layer=attn, q=q, k=k)
    i = torch.arange(1, T, dtype=torch.float64)
    assert float(signed_map_mass(rec, "neg")[0]) == pytest.approx(float((lam * i / (i + 1)).mean()), abs=1e-6)
    want_abs = (1 - lam / (i + 1) + lam * i / (i + 1)).mean()
    assert float(signed_map_mass(rec, "abs")[0]) == pytest.approx(float(want_abs), abs=1e-6)
    plain = types.SimpleNamespace(layer=Attention(AttentionConfig("scaled"), 1, 2), q=q, k=k)
    assert signed_map_mass(plain, "abs") is None


def test_the_intermediates_record_holds_each_quantity_once_per_layer():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=20,
            block_size=T,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            d_model=D_MODEL,
            attention={"gate": "headwise"},
        )
    ).eval()
    idx = torch.randint(20, (3, T))
    records = probe(model, idx)
    assert [r.index for r in records] == [0, 1]
    with torch.no_grad():
        x = model.embed(idx)
        for block, rec in zip(model.blocks, records):
            h = block.ln_1(x)
            y = block.attn(h)
            x = block(x)
            torch.testing.assert_close(rec.x, h)
            torch.testing.assert_close(rec.y, y)
            torch.testing.assert_close(rec.residual, x)
            parts = block.attn.qkv_parts(block.attn.qkv_proj.weight)
            torch.testing.assert_close(rec.v, (h @ parts.v.T).view(3, T, 2, -1).transpose(1, 2))
            assert rec.q.shape == (3, 4, T, D_MODEL // 4) and rec.k.shape == (3, 2, T, D_MODEL // 4)
    assert all(layer.record_to is None for layer in model.attention_layers())  # the probe leaves no layer recording


def test_config_checks_the_new_keys_and_takes_differential_with_the_measurements(make_cfg):
    from attnlab.config.schema import Schema
    from attnlab.util.errors import ConfigError

    Schema.from_cfg(
        make_cfg("model.attention.gate=headwise", "model.attention.window=8", "model.attention.window_sinks=1")
    )
    with pytest.raises(ConfigError, match="model.attention.gate='both'.*none, headwise, elementwise"):
        Schema.from_cfg(make_cfg("model.attention.gate=both"))
    Schema.from_cfg(make_cfg("model.attention.differential=true", "callbacks=default"))


@pytest.mark.parametrize(
    "attention",
    [
        {"gate": "elementwise"},
        {"gate": "headwise", "backend": "sdpa"},
        {"differential": True},
        {"differential": True, "backend": "sdpa"},
    ],
)
def test_kv_cache_with_a_gate_or_a_differential_map_gives_the_full_forwards_logits(attention):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=20, block_size=16, n_layer=2, n_head=H, d_model=D_MODEL, pos_encoding="rope", attention=attention
        )
    ).eval()
    idx = torch.randint(20, (2, 10))
    full = model(idx)[0]
    caches = model.kv_caches()
    with torch.no_grad():
        steps = [model.next_logits(idx[:, :4], caches)] + [
            model.next_logits(idx[:, i : i + 1], caches) for i in range(4, 10)
        ]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], atol=1e-5, rtol=1e-5)


def test_head_scores_count_the_keys_the_window_leaves_visible():
    """Uniform rows over the window's keys: entropy_norm 1 and a purely positional pattern, as
    uniform causal rows read without a window."""
    from attnlab.analysis.heads import head_scores

    attn = Attention(AttentionConfig("scaled", window=3, window_sinks=1), H, D)
    mask = attn.visible(T)
    assert torch.equal(mask, visible(T, T, 3, 1))
    p = (mask / mask.sum(-1, keepdim=True)).expand(2, H, T, T)
    scores = head_scores(p, p, 3, 1, visible=mask)
    torch.testing.assert_close(scores["entropy_norm"], torch.ones(H))
    plain = head_scores(p, p, 3, 1)  # read as if every earlier key were visible
    assert float(plain["entropy_norm"].max()) < 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the fused kernels as a GPU runs them")
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
@pytest.mark.parametrize(
    "attention",
    [
        {"gate": "headwise"},
        {"gate": "elementwise"},
        {"window": 5},
        {"differential": True},
        {"differential": True, "window": 5},
    ],
)
def test_variants_on_cuda_kernels_match_the_float64_explicit_path(backend, attention):
    torch.manual_seed(0)
    layer = AttentionLayer(AttentionConfig(backend, **attention), 64, 4, 16).cuda()
    x = torch.randn(2, 33, 64, device="cuda")
    if backend == "flash" and "window" in attention and backends.flash_attn_package() is None:
        with (
            pytest.raises(KernelUnavailable, match="model.attention.window"),
            torch.autocast("cuda", dtype=torch.bfloat16),
        ):
            layer(x)  # PyTorch's forced flash kernel takes no mask
        return
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    layer.attention.cfg.backend = "scaled"
    want = layer.double()(x.double())
    torch.testing.assert_close(y.double(), want, atol=3e-2, rtol=3e-2)


def test_a_differential_run_with_the_default_callbacks_logs_both_maps_and_the_signed_masses(make_cfg):
    """attention=sdpa, differential=true (with a headwise gate) and callbacks=default: the run
    completes with the statistics of A1 and A2, the signed map's masses, the gate's score, the
    sink and residual metrics, the head analysis and the attention maps."""
    from pathlib import Path

    from attnlab.training.train import train

    cfg = make_cfg(
        "attention=sdpa", "model.attention.differential=true", "model.attention.gate=headwise", "callbacks=default"
    )
    metrics = train(cfg)
    for i in range(cfg.model.n_layer):
        for name in ("entropy_norm", "a2_entropy_norm", "max_logit", "a2_max_logit", "sink_heads", "a2_sink_mass"):
            assert math.isfinite(metrics[f"attn/L{i}/{name}"]), name
        neg, total = metrics[f"attn/L{i}/diff_neg_mass"], metrics[f"attn/L{i}/diff_abs_mass"]
        assert 0 <= neg < total  # the absolute mass counts the negative part and the positive one
        assert 0 < metrics[f"attn/L{i}/gate_mean"] < 1
        assert metrics[f"attn/L{i}/residual_max_ratio"] >= 1
    assert any(k.startswith("heads/") for k in metrics)
    assert list((Path(cfg.paths.output_dir) / "attention_maps").glob("step*.png"))
