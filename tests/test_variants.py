"""Attention variants on the one weight path (attention/weights.py): sigmoid attention and
grouped-query attention against float64 references with gradients, and the statistics, the
knockout, the config checks and the metric registry that read that path."""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import ROOT

from attnlab.analysis.heads import cut_edges
from attnlab.attention import BACKENDS, Attention, AttentionConfig, WeightRule, attend
from attnlab.attention.sink import ESCAPES
from attnlab.attention.stats import METRICS, attention_stats, metrics_table
from attnlab.config.schema import Schema
from attnlab.model import GPT, GPTConfig
from attnlab.training.train import train
from attnlab.util.errors import ConfigError, KernelUnavailable


def reference(q, k, v, scale, normalize="softmax", bias=None, escape=None):
    """Float64 weights and output: key/value head h // (H / H_kv) for query head h, causal mask,
    softmax (with an appended escape column) or sigmoid(s q.k + bias - log T)."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    t = q.shape[-2]
    logits = q @ k.transpose(-2, -1) * (scale.double().view(1, -1, 1, 1) if torch.is_tensor(scale) else scale)
    if bias is not None:
        logits = logits + bias.double()
    logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    if normalize == "sigmoid":
        p = torch.sigmoid(logits - math.log(t))
    elif escape is not None:
        p = torch.softmax(torch.cat([logits, escape.double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)], -1), -1)[
            ..., :-1
        ]
    else:
        p = torch.softmax(logits, -1)
    return p @ v, p


def check_against_reference(attn: Attention, n_kv: int, seed: int, h: int = 4, t: int = 11, d: int = 8):
    """Output and every gradient (q, k, v, the learned scale and escape logit) against ``reference``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, h, t, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, n_kv, t, d, generator=gen, requires_grad=True) for _ in range(2))
    out = attn(q, k, v)
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    scale = attn.softmax_scale()
    scale_r = scale.detach().double().requires_grad_() if torch.is_tensor(scale) else scale
    escape = attn.escape_logit()
    escape_r = escape.detach().double().requires_grad_() if escape is not None else None
    bias = attn.logit_bias(torch.arange(t), torch.arange(t))
    ref, p = reference(qr, kr, vr, scale_r, attn.cfg.normalize, bias, escape_r)
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=1e-4)
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad)
    ref.backward(grad.double())
    for x, xr in ((q, qr), (k, kr), (v, vr)):
        assert x.grad.shape == x.shape
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-4, rtol=1e-3)
    if torch.is_tensor(scale):
        torch.testing.assert_close(
            attn.scale.log_scale.grad.double(), (scale_r.grad * scale_r).detach(), atol=1e-4, rtol=1e-3
        )
    if attn.escape is not None and attn.escape.kind == "learned":
        torch.testing.assert_close(attn.escape.logit.grad.double(), escape_r.grad, atol=1e-4, rtol=1e-3)
    # what the statistics and the head analysis read is what the kernel used
    torch.testing.assert_close(attn.probabilities(q, k).double(), p.detach(), atol=1e-5, rtol=1e-4)
    return p


@pytest.mark.parametrize("backend", ["naive", "scaled"])
@pytest.mark.parametrize("scaling", ["inv_sqrt_d", "learned"])
@pytest.mark.parametrize("alibi", [False, True])
def test_sigmoid_attention_matches_float64_reference(backend, scaling, alibi):
    attn = Attention(AttentionConfig(backend, scaling, normalize="sigmoid"), 4, 8, alibi=alibi)
    if scaling == "learned":
        attn.scale.log_scale.data = torch.log(torch.tensor([0.2, 0.4, 0.8, 1.6]))
    p = check_against_reference(attn, 4, seed=hash((backend, scaling, alibi)) % 1000)
    rows = p[..., 1:, :].sum(-1)
    assert (rows - 1).abs().max() > 0.1  # not a softmax in disguise: rows do not sum to 1


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_fused_backends_refuse_sigmoid_in_one_line(backend):
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(KernelUnavailable, match=f"attention={backend} normalises rows with softmax") as err:
        attend(backend, q, q, q, 0.35, normalize="sigmoid")
    assert "\n" not in str(err.value)


GQA_CASES = [(b, n_kv, e) for b in BACKENDS for n_kv in (1, 2) for e in ESCAPES]


@pytest.mark.parametrize("backend, n_kv, escape", GQA_CASES)
def test_grouped_query_attention_matches_float64_reference(backend, n_kv, escape):
    """4 query heads over 2 key/value heads (grouped) or 1 (multi-query), every backend, with and
    without an escape slot: native in SDPA and flash (enable_gqa), broadcast in the explicit kernels."""
    attn = Attention(AttentionConfig(backend, "inv_sqrt_d", sink=escape), 4, 8, n_kv_head=n_kv)
    if escape == "learned":
        attn.escape.logit.data = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    check_against_reference(attn, n_kv, seed=hash((backend, n_kv, escape)) % 1000)


def test_sigmoid_and_gqa_together():
    attn = Attention(AttentionConfig("scaled", "inv_sqrt_d", normalize="sigmoid"), 6, 8, n_kv_head=2)
    check_against_reference(attn, 2, seed=3, h=6)


def test_statistics_per_query_head_and_of_unnormalised_rows():
    """GQA: every statistic is per query head (the same as with k expanded to every head);
    sigmoid: row_mass is what rows sum to, entropy describes the row renormalised, no escape_mass."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 20, 8, generator=gen), torch.randn(2, 2, 20, 8, generator=gen)
    grouped = attention_stats(q, k, 0.35, block=7)
    expanded = attention_stats(q, k.repeat_interleave(2, 1), 0.35, block=7)
    assert grouped.keys() == expanded.keys()
    for name in grouped:
        assert grouped[name].shape == (4,)
        torch.testing.assert_close(grouped[name], expanded[name], atol=1e-6, rtol=1e-6, msg=name)
    stats = attention_stats(q, k, WeightRule(scale=0.35, normalize="sigmoid"), block=7)
    _, p = reference(q, k, k, 0.35, "sigmoid")
    rows = p[:, :, 1:]  # query 0 sees one key: left out
    torch.testing.assert_close(stats["row_mass"], rows.sum(-1).mean((0, 2)).float(), atol=1e-5, rtol=1e-5)
    placed = rows / rows.sum(-1, keepdim=True)
    entropy = -(placed * placed.clamp_min(1e-300).log()).sum(-1)
    torch.testing.assert_close(stats["entropy"], entropy.mean((0, 2)).float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["sink_mass"], rows[..., 0].mean((0, 2)).float(), atol=1e-6, rtol=1e-5)
    assert "escape_mass" not in stats and "row_mass" not in grouped


def test_knockout_is_an_edit_of_the_weight_path():
    """Softmax: the cut head's row is renormalised over the keys left (and its escape); sigmoid: its
    other weights are kept as they were. Other heads are untouched."""
    gen = torch.Generator().manual_seed(1)
    t = 9
    edges = torch.zeros(2, t, t, dtype=torch.bool)
    edges[:, 4:, 1] = True
    for normalize, n_kv in (("softmax", 2), ("sigmoid", 1)):
        model = GPT(
            GPTConfig(
                vocab_size=13,
                block_size=t,
                n_layer=1,
                n_head=4,
                n_kv_head=n_kv,
                d_model=32,
                attention=dict(backend="scaled", normalize=normalize),
            )
        ).eval()
        layer = model.attention_layers()[0]
        seen = {}
        hook = layer.register_forward_hook(lambda m, a, o, seen=seen: seen.update(q=a[0], k=a[1], v=a[2], out=o))
        idx = torch.randint(13, (2, t), generator=gen)
        with torch.no_grad():
            model(idx)
            base = seen["out"]
            with cut_edges(model, 0, 2, edges):
                model(idx)
        hook.remove()
        _, p = reference(seen["q"], seen["k"], seen["v"], layer.softmax_scale(), normalize)
        kept = p[:, 2].masked_fill(edges, 0.0)
        if normalize == "softmax":
            kept = kept / kept.sum(-1, keepdim=True)
        expected = kept @ seen["v"].double().repeat_interleave(4 // n_kv, 1)[:, 2]
        torch.testing.assert_close(seen["out"][:, 2].double(), expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(seen["out"][:, [0, 1, 3]], base[:, [0, 1, 3]], atol=0, rtol=0)
        assert not torch.allclose(seen["out"][:, 2], base[:, 2])


def test_a_grouped_model_has_fewer_key_value_weights_and_agrees_across_backends():
    outs = {}
    for backend in BACKENDS:
        torch.manual_seed(0)
        model = GPT(
            GPTConfig(
                vocab_size=17,
                block_size=12,
                n_layer=2,
                n_head=4,
                n_kv_head=1,
                d_model=32,
                attention=dict(backend=backend),
            )
        ).eval()
        outs[backend] = model(torch.arange(12).view(1, 12) % 17)[0]
    attn = model.blocks[0].attn
    assert attn.qkv_sizes == (32, 8, 8) and attn.qkv_proj.out_features == 48
    for backend in BACKENDS[1:]:
        torch.testing.assert_close(outs[backend], outs["naive"], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides, key, accepted",
    [
        (["model.n_kv_head=3"], "model.n_kv_head", "a divisor of model.n_head=4"),
        (
            ["attention=sdpa", "model.attention.normalize=sigmoid"],
            "model.attention.normalize",
            "sigmoid runs on naive and scaled",
        ),
        (["model.attention.normalize=cosine"], "model.attention.normalize", "one of softmax, sigmoid"),
        (
            ["model.attention.normalize=sigmoid", "model.attention.escape=zero_logit"],
            "model.attention.escape",
            "none with",
        ),
    ],
)
def test_bad_variant_config_is_one_line_naming_the_key(make_cfg, overrides, key, accepted):
    with pytest.raises(ConfigError) as err:
        Schema.from_cfg(make_cfg(*overrides))
    assert key in str(err.value) and accepted in str(err.value) and "\n" not in str(err.value)


def test_a_sigmoid_gqa_run_logs_every_registry_metric(make_cfg):
    """One training run of both variants: the callbacks log what the registry lists for it (row_mass,
    attn_out_norm, no escape_mass), the KV-cache size, and the head analysis runs."""
    cfg = make_cfg("model.attention.normalize=sigmoid", "model.n_kv_head=2", "callbacks=default")
    metrics = train(cfg)
    for m in METRICS:
        if m.name not in (
            "escape_mass",
            "gate_mean",
            "diff_abs_mass",
            "diff_neg_mass",
        ):  # no escape slot, gate or differential map
            assert f"attn/L0/{m.name}" in metrics, m.name
    assert "attn/L0/escape_mass" not in metrics
    n_layer, d_k = cfg.model.n_layer, cfg.model.d_model // cfg.model.n_head
    assert metrics["mem/kv_cache_bytes_per_token"] == 2 * n_layer * 2 * d_k * 4
    assert any(k.startswith("heads/") for k in metrics)


def test_docs_metrics_table_is_the_registry():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    block = re.search(r"<!-- metrics registry: start -->\n(.*?)\n<!-- metrics registry: end -->", doc, re.S)
    assert block is not None, "docs/metrics.md lost its registry table markers"
    assert block.group(1) == metrics_table(), (
        "docs/metrics.md's table differs from attention.stats.METRICS: regenerate it"
    )


def test_the_escape_slots_old_key_is_read_with_a_one_line_notice(make_cfg, tmp_path, capsys):
    """model.attention.sink was renamed model.attention.escape (every metric called sink means the
    first-token phenomenon): the old key still sets it, in configs, checkpoints' model configs and
    recorded sweeps, for one release."""
    from attnlab.config.schema import apply_renamed_keys
    from attnlab.studies.report.aggregate import RunResult

    cfg = make_cfg("model.attention.sink=learned")
    notices = apply_renamed_keys(cfg)
    assert notices == [
        "model.attention.sink is now model.attention.escape (set to learned); the old key is read until the next release"
    ]
    assert cfg.model.attention.escape == "learned" and cfg.model.attention.sink is None
    Schema.from_cfg(cfg)
    assert (
        GPTConfig(attention={"sink": "zero_logit"}).attention.escape == "zero_logit"
    )  # an old checkpoint's model config
    old_run = RunResult(tmp_path, {"overrides": ["model.attention.sink=zero_logit", "seed=0"]})
    assert old_run.overrides == {"model.attention.escape": "zero_logit", "seed": "0"}
    capsys.readouterr()
    metrics = train(make_cfg("model.attention.sink=learned"))
    assert capsys.readouterr().err.count("model.attention.sink is now model.attention.escape") == 1
    assert "attn/L0/escape_mass" in metrics


def test_a_checkpoint_with_the_old_layer_name_still_loads():
    """block.attn.attn is now block.attn.attention and its escape logit ``escape.logit`` (was
    ``sink.logit``): a state dict saved before loads into the renamed layer, values intact."""
    cfg = dict(
        vocab_size=11,
        block_size=8,
        n_layer=2,
        n_head=2,
        d_model=16,
        attention=dict(scaling="learned", escape="learned"),
    )
    model = GPT(GPTConfig(**cfg))
    state = {
        k.replace("attn.attention.", "attn.attn.").replace("escape.logit", "sink.logit"): v + 0.5
        if "log_scale" in k or "escape.logit" in k
        else v
        for k, v in model.state_dict().items()
    }
    assert "blocks.1.attn.attn.scale.log_scale" in state and "blocks.0.attn.attn.sink.logit" in state
    fresh = GPT(GPTConfig(**cfg))
    fresh.load_state_dict(state)  # strict: every key found under its new name
    torch.testing.assert_close(
        fresh.blocks[1].attn.attention.scale.log_scale, model.blocks[1].attn.attention.scale.log_scale + 0.5
    )
    torch.testing.assert_close(
        fresh.blocks[0].attn.attention.escape.logit, model.blocks[0].attn.attention.escape.logit + 0.5
    )


def test_a_checkpoint_with_separate_q_k_v_projections_still_loads():
    """Checkpoints written before the fused projection hold q_proj, k_proj and v_proj: they load
    into qkv_proj's rows (q, k, v in that order, grouped-query sizes too) and give the same outputs."""
    cfg = dict(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_kv_head=2, d_model=16)
    model = GPT(GPTConfig(**cfg)).eval()
    state = {}
    for key, value in model.state_dict().items():
        if key.endswith("qkv_proj.weight"):
            prefix = key[: -len("qkv_proj.weight")]
            for name, part in model.blocks[0].attn.qkv_parts(value)._asdict().items():
                state[f"{prefix}{name}_proj.weight"] = part.clone()
        else:
            state[key] = value
    assert state["blocks.1.attn.k_proj.weight"].shape == (8, 16) and "blocks.1.attn.qkv_proj.weight" not in state
    fresh = GPT(GPTConfig(**cfg)).eval()
    fresh.load_state_dict(state)  # strict
    x = torch.arange(8).view(1, 8)
    assert torch.equal(fresh(x)[0], model(x)[0])
