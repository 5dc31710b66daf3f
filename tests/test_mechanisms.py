"""Position encodings (RoPE, ALiBi, NoPE) and the softmax escape slot, against float64 references;
the statistics and head scores see the same rotated / biased / escaped probabilities."""

from __future__ import annotations

import pytest
import torch

from attnlab.analysis.heads import head_scores, head_type, layer_probs
from attnlab.analysis.probe import probe
from attnlab.attention import BACKENDS, Attention, AttentionConfig, WeightRule
from attnlab.attention.position import Rotary, alibi_bias, alibi_slopes
from attnlab.attention.sink import ESCAPES
from attnlab.attention.stats import attention_stats
from attnlab.model import GPT, GPTConfig
from attnlab.util.errors import ConfigError


def reference(q, k, v, scale, bias=None, sink=None, key_padding_mask=None):
    """Float64 softmax(s q k^T + bias + causal mask) v, with an appended escape logit column if
    ``sink``; also returns the real-key weights. Rows with no visible key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    t = q.shape[-2]
    logits = q @ k.transpose(-2, -1) * (scale.double().view(1, -1, 1, 1) if torch.is_tensor(scale) else scale)
    if bias is not None:
        logits = logits + bias.double()
    allowed = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        column = sink.double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        p = torch.softmax(torch.cat([logits, column], -1), -1)[..., :-1]
    else:
        p = torch.softmax(logits, -1).nan_to_num(0.0)
    return p @ v, p


def rope_reference(x: torch.Tensor) -> torch.Tensor:
    """RoPE in complex numbers, float64: component pair (c, c + d/2) times exp(i t theta_c)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    t = torch.arange(x.shape[-2], dtype=torch.float64)[:, None]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(
        torch.ones_like(t * theta), t * theta
    )
    return torch.cat([z.real, z.imag], -1)


def test_rope_matches_complex_reference_and_depends_on_offset_only():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 20, 16, generator=gen)
    torch.testing.assert_close(Rotary(16)(x).double(), rope_reference(x), atol=1e-5, rtol=1e-5)
    # the same q and k vectors at every position: the logit depends on i - j alone
    q = torch.randn(1, 1, 1, 16, generator=gen).expand(1, 1, 20, 16)
    k = torch.randn(1, 1, 1, 16, generator=gen).expand(1, 1, 20, 16)
    logits = Rotary(16)(q) @ Rotary(16)(k).transpose(-2, -1)
    for offset in (0, 3, 7):
        diagonal = torch.diagonal(logits[0, 0], offset=-offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(torch.diagonal(logits[0, 0], -1)[0], torch.diagonal(logits[0, 0], -3)[0])


def test_alibi_slopes_and_bias():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    assert alibi_slopes(4).tolist() == pytest.approx([2 ** -(2 * (i + 1)) for i in range(4)])
    six = alibi_slopes(6).tolist()  # 4 of the 4-head set, then every other of the 8-head set
    assert six == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    bias = alibi_bias(torch.tensor([0.5, 1.0]), torch.arange(4), torch.arange(4))
    assert bias.shape == (2, 4, 4) and bias[1, 3, 0] == -3.0 and bias[0, 3, 1] == -1.0 and bias[0, 2, 2] == 0


CASES = [
    (b, pe, s) for b in BACKENDS for pe in ("none", "alibi") for s in ESCAPES if not (b == "flash" and pe == "alibi")
]


@pytest.mark.parametrize("backend, pos, sink", CASES)
@pytest.mark.parametrize("scaling", ["inv_sqrt_d", "learned"])
def test_attention_matches_float64_reference_with_bias_and_escape(backend, pos, sink, scaling):
    """Every backend x {no bias, ALiBi} x escape slot x {float, per-head} scale: output and every
    gradient (q, k, v, the learned escape logit) agree with the explicit float64 reference."""
    gen = torch.Generator().manual_seed(hash((backend, pos, sink, scaling)) % 1000)
    h, t, d = 3, 13, 16
    attn = Attention(AttentionConfig(backend, scaling, sink=sink), h, d, alibi=pos == "alibi")
    if sink == "learned":
        attn.escape.logit.data = torch.tensor([-1.0, 0.5, 2.0])
    if scaling == "learned":
        attn.scale.log_scale.data = torch.log(torch.tensor([0.1, 0.3, 0.6]))
    q, k, v = (torch.randn(2, h, t, d, generator=gen, requires_grad=True) for _ in range(3))
    out = attn(q, k, v)
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    scale = attn.softmax_scale()
    scale_r = scale.detach().double().requires_grad_() if torch.is_tensor(scale) else scale
    sink_r = attn.escape_logit().detach().double().requires_grad_() if sink != "none" else None
    bias = attn.logit_bias(torch.arange(t), torch.arange(t))
    ref, p = reference(qr, kr, vr, scale_r, bias, sink_r)
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=1e-4)
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad)
    ref.backward(grad.double())
    for x, xr in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-4, rtol=1e-3)
    if sink == "learned":
        torch.testing.assert_close(attn.escape.logit.grad.double(), sink_r.grad, atol=1e-4, rtol=1e-3)
    if scaling == "learned":
        torch.testing.assert_close(
            attn.scale.log_scale.grad.double(), (scale_r.grad * scale_r).detach(), atol=1e-4, rtol=1e-3
        )
    # the probabilities the statistics recompute are the ones the kernel used
    torch.testing.assert_close(attn.probabilities(q, k).double(), p.detach(), atol=1e-5, rtol=1e-4)
    if sink != "none":
        placed = p[..., 1:, :].sum(-1)
        assert (placed < 1).all() and placed.mean() < 0.99  # weight went nowhere in every row


@pytest.mark.parametrize("backend", ["naive", "sdpa", "flash"])
def test_escape_with_padding_gives_zero_rows_and_matches_reference(backend):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=gen) for _ in range(3))
    kpm = torch.ones(2, 9, dtype=torch.bool)
    kpm[0, :3] = False  # rows 0..2 of batch 0 see no real key: all their weight escapes
    attn = Attention(AttentionConfig(backend, "inv_sqrt_d", sink="zero_logit"), 2, 8)
    try:
        out = attn(q, k, v, key_padding_mask=kpm)
    except Exception as err:  # the forced flash kernel may refuse an explicit mask on this machine
        pytest.skip(f"{backend} refuses a padding mask here: {err}")
    ref, _ = reference(q, k, v, 8**-0.5, None, torch.zeros(2), kpm)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(out[0, :, :3], torch.zeros_like(out[0, :, :3]))


def model(pos, sink="none", backend="sdpa", **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=17, block_size=12, n_layer=2, n_head=2, d_model=16, pos_encoding=pos)
    return GPT(GPTConfig(**{**cfg, **kw}, attention=dict(backend=backend, scaling="inv_sqrt_d", sink=sink))).eval()


@pytest.mark.parametrize(
    "pos, sink", [("rope", "none"), ("alibi", "learned"), ("none", "zero_logit"), ("rope", "learned")]
)
def test_statistics_and_head_scores_see_what_the_model_computes(pos, sink):
    """Rebuild each layer's output from the probabilities the statistics use: they must agree
    with what the layer returned (rotation, bias and escape included)."""
    m = model(pos, sink)
    if sink == "learned":
        for layer in m.attention_layers():
            layer.escape.logit.data = torch.tensor([-0.5, 1.5])
    x = torch.randint(17, (3, 12))
    seen = []
    hooks = [
        layer.register_forward_hook(lambda mod, args, out: seen.append((args[2], out)))
        for layer in m.attention_layers()
    ]
    probs, _ = layer_probs(m, x)
    for hook in hooks:
        hook.remove()
    for p, (v, out) in zip(probs, seen):
        torch.testing.assert_close(p @ v, out, atol=1e-5, rtol=1e-4)
    for rec, p in zip(probe(m, x), probs):
        stats = attention_stats(rec.q, rec.k, rec.layer.weight_rule(), block=5)
        rows = p[:, :, 1:]  # row 0 left out
        torch.testing.assert_close(stats["sink_mass"], rows[..., 0].mean((0, 2)), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(stats["max_prob"], rows.amax(-1).mean((0, 2)), atol=1e-5, rtol=1e-4)
        if sink == "none":
            assert "escape_mass" not in stats
        else:
            escape = 1 - rows.sum(-1)
            torch.testing.assert_close(stats["escape_mass"], escape.mean((0, 2)), atol=1e-5, rtol=1e-4)
            scores = head_scores(p, p, 3, 1, escape=True)
            torch.testing.assert_close(scores["escape"], escape.mean((0, 2)), atol=1e-6, rtol=1e-5)


def test_escape_mass_of_softmax_plus_one_on_equal_logits():
    # all logits 0: query i spreads over i + 1 keys and the slot, so escape_i = 1 / (i + 2)
    t = 6
    q, k = torch.zeros(1, 1, t, 4), torch.zeros(1, 1, t, 4)
    stats = attention_stats(q, k, WeightRule(escape=torch.zeros(1)))
    expected = sum(1 / (i + 2) for i in range(1, t)) / (t - 1)
    assert stats["escape_mass"].item() == pytest.approx(expected, rel=1e-6)
    assert stats["sink_mass"].item() == pytest.approx(sum(1 / (i + 2) for i in range(1, t)) / (t - 1), rel=1e-6)
    assert stats["entropy_norm"].item() == pytest.approx(1.0, rel=1e-6)  # the placed weight is uniform


def test_a_head_that_parks_its_weight_in_the_slot_is_classed_escape():
    t = 10
    p = torch.tril(torch.ones(t, t)) * 0.2 / torch.arange(1, t + 1).view(-1, 1)  # 0.2 spread, 0.8 nowhere
    p = p.expand(2, 1, t, t)
    s = {name: float(v[0]) for name, v in head_scores(p, p, 4, 1, escape=True).items()}
    assert s["escape"] == pytest.approx(0.8) and s["entropy_norm"] == pytest.approx(1.0, abs=1e-5)
    assert head_type(s) == "escape"


def test_position_encodings_change_parameters_only_where_they_must():
    learned = set(model("learned").state_dict())
    assert "wpe.weight" in learned and not any("rotary" in k or "escape" in k or "alibi" in k for k in learned)
    for pos in ("rope", "alibi", "none"):
        assert set(model(pos).state_dict()) == learned - {"wpe.weight"}
    assert set(model("learned", "zero_logit").state_dict()) == learned  # a fixed zero is not a parameter
    escape = set(model("learned", "learned").state_dict()) - learned
    assert escape == {f"blocks.{i}.attn.attention.escape.logit" for i in range(2)}


def test_config_refuses_alibi_with_forced_flash_and_unknown_values(make_cfg):
    from attnlab.config.schema import Schema

    Schema.from_cfg(make_cfg("attention=sdpa", "model.pos_encoding=alibi"))
    with pytest.raises(ConfigError, match="model.pos_encoding='alibi'.*attention=flash"):
        Schema.from_cfg(make_cfg("attention=flash", "model.pos_encoding=alibi"))
    with pytest.raises(ConfigError, match="model.pos_encoding='sinusoidal'.*learned, rope, alibi, none"):
        Schema.from_cfg(make_cfg("model.pos_encoding=sinusoidal"))
    with pytest.raises(ConfigError, match="model.attention.escape='one'.*none, zero_logit, learned"):
        Schema.from_cfg(make_cfg("model.attention.escape=one"))
    with pytest.raises(ConfigError, match="model.d_k=5.*even"):
        Schema.from_cfg(make_cfg("model.pos_encoding=rope", "model.d_k=5"))


def test_phase_change_plot_reads_the_head_history_and_the_csv_loss(tmp_path):
    import json

    from attnlab.analysis.phase import main, train_loss

    history = [
        {
            "step": s,
            "in_context_score": -s / 100,
            "L1/induction_max": s / 300,
            "repeat_acc": s / 400,
            "L1/induction_knockout_all_heads": s / 500,
        }
        for s in (0, 100, 200)
    ]
    (tmp_path / "heads.json").write_text(json.dumps({"heads": [], "history": history}))
    (tmp_path / "csv" / "version_0").mkdir(parents=True)
    (tmp_path / "csv" / "version_0" / "metrics.csv").write_text("step,train/loss,val/acc\n0,3.5,\n1,3.25,\n1,,0.5\n")
    assert train_loss(tmp_path) == [(0, 3.5), (1, 3.25)]
    main([str(tmp_path), "--out", str(tmp_path / "p.png")])
    assert (tmp_path / "p.png").stat().st_size > 5000
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])


def test_phase_change_step_is_the_first_step_copying_reaches_the_level():
    from attnlab.analysis.phase import phase_change_step

    history = [
        {"step": 0, "repeat_acc": 0.04},
        {"step": 100, "repeat_acc": 0.3},
        {"step": 200, "repeat_acc": 0.6},
        {"step": 300, "repeat_acc": 0.4},
    ]
    assert phase_change_step(history) == 200 and phase_change_step(history, level=0.25) == 100
    assert phase_change_step(history[:2]) is None and phase_change_step([]) is None
