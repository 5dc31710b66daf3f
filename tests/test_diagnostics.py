"""Attention statistics, peak memory, gradient norms and the non-finite guard."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.analysis.probe import probe
from attnlab.attention import BACKENDS
from attnlab.attention.stats import STATS, attention_stats, uniform_sink_mass
from attnlab.model import GPT, GPTConfig
from attnlab.training.train import train
from attnlab.util.profiling import peak_bytes

BIG = 1e4  # a logit gap that makes softmax one-hot to fp32 precision


def test_uniform_rows_have_normalised_entropy_one():
    q = torch.zeros(2, 3, 20, 8)
    s = attention_stats(q, torch.randn(2, 3, 20, 8), 1.0, block=7)
    assert torch.allclose(s["entropy_norm"], torch.ones(3), atol=1e-6)
    assert torch.allclose(s["max_logit"], torch.zeros(3))
    expected_sink = sum(1 / (i + 1) for i in range(1, 20)) / 19  # uniform over i + 1 keys, row 0 left out
    assert torch.allclose(s["sink_mass"], torch.full((3,), expected_sink), atol=1e-6)
    assert torch.allclose(s["sink_mass"], torch.full((3,), uniform_sink_mass(20)), atol=1e-6)


def test_uniform_attention_by_hand_at_t16():
    """Worked by hand: rows 1..15 are uniform over i + 1 keys; row 0 (one key) is not counted."""
    q = torch.zeros(1, 2, 16, 4)
    s = attention_stats(q, torch.randn(1, 2, 16, 4), 1.0, block=16)
    harmonic = sum(1 / n for n in range(2, 17))  # 1/2 + ... + 1/16
    assert s["sink_mass"][0].item() == pytest.approx(harmonic / 15)  # 0.1587, not 0.211 with row 0
    assert s["sink_mass"][0].item() == pytest.approx(0.1587, abs=1e-4)
    assert s["max_prob"][0].item() == pytest.approx(harmonic / 15)  # max of a uniform row is 1/(i+1)
    assert s["max_prob_max"][0].item() == pytest.approx(0.5)  # row 1: two keys; below 1: no collapse
    assert s["entropy"][0].item() == pytest.approx(sum(math.log(n) for n in range(2, 17)) / 15)


def test_max_prob_max_below_one_unless_a_row_collapses():
    """Row 0 is one-hot by the mask; only a real collapse (here row 5) brings max_prob_max to 1."""
    t, d = 8, 8
    q, k = torch.zeros(1, 1, t, d), torch.zeros(1, 1, t, d)
    assert attention_stats(q, k, 1.0)["max_prob_max"].item() == pytest.approx(0.5)
    q[0, 0, 5, 0], k[0, 0, 3, 0] = 1.0, BIG  # query 5 puts all its weight on key 3
    s = attention_stats(q, k, 1.0)
    assert s["max_prob_max"].item() == pytest.approx(1.0)
    assert s["max_prob"].item() == pytest.approx((sum(1 / n for n in range(2, 9)) - 1 / 6 + 1) / 7)


def test_a_single_query_has_no_per_query_statistics():
    s = attention_stats(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 1.0)
    assert torch.isnan(s["max_prob_max"]).all() and torch.isnan(s["sink_mass"]).all()
    assert torch.isfinite(s["max_logit"]).all()


def test_one_hot_rows_have_entropy_zero_and_max_prob_one():
    t = d = 16
    q = k = (torch.eye(t) * math.sqrt(BIG)).expand(1, 2, t, d)  # each query sees only itself
    s = attention_stats(q, k, 1.0, block=5)
    assert torch.allclose(s["entropy_norm"], torch.zeros(2), atol=1e-6)
    assert torch.allclose(s["entropy"], torch.zeros(2), atol=1e-6)
    assert torch.allclose(s["max_prob"], torch.ones(2)) and torch.allclose(s["max_prob_max"], torch.ones(2))
    assert torch.allclose(s["max_logit"], torch.full((2,), BIG))
    assert torch.allclose(s["sink_mass"], torch.zeros(2))  # rows 1.. put nothing on key 0


def test_all_weight_on_first_token_is_sink_mass_one():
    t, d = 12, 4
    q = torch.zeros(1, 1, t, d)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, t, d)
    k[:, :, 0, 0] = BIG
    s = attention_stats(q, k, 1.0, block=4)
    assert s["sink_mass"].item() == pytest.approx(1.0)
    assert s["entropy_norm"].item() == pytest.approx(0.0, abs=1e-6)


def explicit_reference(q, k, scale):
    """The metric definitions applied to the full T x T probabilities of the explicit backend."""
    logits = (q.double() @ k.double().transpose(-2, -1)) * (
        scale.double().view(1, -1, 1, 1) if torch.is_tensor(scale) else scale
    )
    t = q.shape[-2]
    visible = torch.ones(t, t, dtype=torch.bool).tril()
    p = logits.masked_fill(~visible, -math.inf).softmax(-1).float()
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, H, T)
    n = torch.arange(1, t + 1)
    rows = slice(1, None)  # query 0 sees one key: left out of every per-query statistic
    return {
        "entropy": ent[..., rows].mean((0, 2)),
        "entropy_norm": (ent[..., rows] / n[rows].log()).mean((0, 2)),
        "max_prob": p[:, :, rows].amax(-1).mean((0, 2)),
        "max_prob_max": p[:, :, rows].amax(-1).amax((0, 2)),
        "max_logit": logits.masked_fill(~visible, -math.inf).amax((0, 2, 3)).float(),
        "sink_mass": p[:, :, rows, 0].mean((0, 2)),
        # Gu et al.'s sink head: first-token weight over every query that sees it (all, causally) above 0.3
        "sink_heads": (p[:, :, :, 0].mean((0, 2)) > 0.3).float(),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block", [1, 5, 16, 64])
def test_blockwise_stats_equal_explicit_ones(backend, block):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=30,
        block_size=33,
        n_layer=2,
        n_head=3,
        d_model=48,
        attention={"backend": backend, "scaling": "learned" if backend == "sdpa" else "inv_sqrt_d"},
    )
    model = GPT(cfg)
    x = torch.randint(0, 30, (2, 33))
    for rec in probe(model, x):
        got = attention_stats(rec.q, rec.k, rec.layer.weight_rule(), block=block)
        ref = explicit_reference(rec.q, rec.k, rec.scale)
        for name in STATS:
            torch.testing.assert_close(got[name], ref[name].float(), atol=1e-5, rtol=1e-5, msg=name)


def test_blockwise_stats_never_allocate_t_by_t():
    t = 4096
    q, k = torch.randn(1, 1, t, 16), torch.randn(1, 1, t, 16)
    full_matrix = t * t * 4
    peak = peak_bytes(lambda: attention_stats(q, k, 0.25, block=128))
    assert peak < full_matrix / 4, f"peak {peak / 2**20:.1f} MiB vs T^2 fp32 {full_matrix / 2**20:.0f} MiB"


def fwd_bwd_peak(backend: str, t: int) -> int:
    q, k, v = (torch.randn(1, 4, t, 64, requires_grad=True) for _ in range(3))

    def step():
        from attnlab.attention import attend

        out, _ = attend(backend, q, k, v, 0.125)
        out.sum().backward()

    return peak_bytes(step)


@pytest.mark.parametrize(
    "backend,low,high", [("naive", 1.7, 2.3), ("scaled", 1.7, 2.3), ("sdpa", 0.7, 1.3), ("flash", 0.7, 1.3)]
)
def test_peak_memory_exponent(backend, low, high):
    ts = [512, 1024, 2048]
    peaks = [fwd_bwd_peak(backend, t) for t in ts]
    slope = np.polyfit(np.log(ts), np.log(peaks), 1)[0]
    assert low < slope < high, f"{backend}: peak ~ T^{slope:.2f} ({peaks})"


def test_smoke_training_logs_every_metric_for_every_layer(make_cfg):
    cfg = make_cfg(
        "callbacks=default",
        "logger=csv",
        "callbacks.attention_stats.every_n_steps=2",
        "callbacks.peak_memory.every_n_steps=3",
    )
    metrics = train(cfg)
    out = Path(cfg.paths.output_dir)
    for layer in range(cfg.model.n_layer):
        for name in ("entropy", "entropy_norm", "max_prob", "max_logit", "sink_mass"):
            assert math.isfinite(metrics[f"attn/L{layer}/{name}"])
        assert metrics[f"grad/L{layer}/q_norm"] > 0 and metrics[f"grad/L{layer}/k_norm"] > 0
    assert metrics["mem/peak_bytes"] > 0 and metrics["mem/attn_matrix_bytes"] == 12 * 4 * 64 * 64 * 4
    history = [json.loads(line) for line in (out / "attention_stats.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 3, 5, 6]
    csv = (out / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "attn/L0/H0/entropy_norm" in csv and "attn/L3/sink_mass" in csv and "mem/peak_bytes" in csv
    assert list((out / "attention_maps").glob("step*.png"))
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["attn/L3/sink_mass"] == pytest.approx(metrics["attn/L3/sink_mass"])


def test_probe_restores_training_mode():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, d_model=16)).train()
    probe(model, torch.randint(0, 10, (1, 8)))
    assert model.training


class InjectNaN:
    """A forward hook that turns layer ``layer``'s attention output into NaN from step ``step`` on."""

    def __init__(self, layer: int, step: int):
        self.layer, self.step = layer, step

    def install(self, trainer, module):
        target = module.model.attention_layers()[self.layer]

        def hook(mod, args, output):
            return output * float("nan") if trainer.global_step >= self.step and mod.training else output

        target.register_forward_hook(hook)


def test_guard_names_step_layer_and_tensor_and_leaves_loadable_checkpoint(make_cfg, monkeypatch):
    import lightning as L

    from attnlab.callbacks import NonFiniteError
    from attnlab.training.lit_module import GPTModule

    injector = InjectNaN(layer=2, step=3)

    class Injector(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            injector.install(trainer, pl_module)

    import attnlab.training.train as train_module

    original = train_module.build_callbacks
    monkeypatch.setattr(train_module, "build_callbacks", lambda cfg: [Injector(), *original(cfg)])
    cfg = make_cfg("callbacks=default", "logger=csv")
    with pytest.raises(NonFiniteError) as err:
        train(cfg)
    message = str(err.value)
    assert "layer 2" in message and "step 3" in message and "NaN" in message and "\n" not in message
    out = Path(cfg.paths.output_dir)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed" and "layer 2" in results["error"]
    ckpt = out / "checkpoints" / "last-finite.ckpt"
    restored = GPTModule.load_from_checkpoint(ckpt, map_location="cpu")
    assert all(torch.isfinite(p).all() for p in restored.parameters())
    assert (out / "csv" / "version_0" / "metrics.csv").exists()  # what was logged before is kept


def test_the_guard_reads_a_scalar_as_one_number_and_a_tensor_whole():
    from attnlab.callbacks.guard import all_finite

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert all_finite(torch.tensor(2.5, dtype=dtype)) is True
        for bad in (math.nan, math.inf, -math.inf):
            assert all_finite(torch.tensor(bad, dtype=dtype)) is False
    assert all_finite(torch.ones(3)) and not all_finite(torch.tensor([1.0, math.inf]))
    assert all_finite(torch.ones(1, 1)) and not all_finite(torch.full((1, 1), math.nan))


def test_guard_catches_a_non_finite_gradient_before_the_step(make_cfg, monkeypatch):
    import lightning as L

    import attnlab.training.train as train_module
    from attnlab.callbacks import NonFiniteError

    class PoisonGradient(L.Callback):
        def on_after_backward(self, trainer, pl_module):
            if trainer.global_step == 2:
                pl_module.model.blocks[1].attn.qkv_proj.weight.grad[-1, 0] = float("inf")

    original = train_module.build_callbacks
    monkeypatch.setattr(train_module, "build_callbacks", lambda cfg: [PoisonGradient(), *original(cfg)])
    with pytest.raises(NonFiniteError, match=r"Inf in gradient of model\.blocks\.1\.attn\.qkv_proj\.weight at step 2"):
        train(make_cfg("callbacks=default", "logger=none"))


def test_a_bounded_probe_changes_nothing_up_to_its_bounds_and_measures_the_chosen_rows_beyond():
    from attnlab.analysis.probe import probe_plan

    assert probe_plan(8, 64, 2048, 1024) == (8, None) and probe_plan(8, 256, 2048, 1024) == (8, None)
    assert probe_plan(8, 1024, 2048, 1024) == (2, None) and probe_plan(8, 4096, None, None) == (8, None)
    n, rows = probe_plan(8, 4096, 2048, 1024)
    assert n == 1 and len(rows) == 1024 and rows[0] == 0 and rows[-1] == 4095 and (rows.diff() > 0).all()
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 8)
    every = attention_stats(q, k, 0.35, block=7)
    assert all(
        torch.equal(every[m], v) for m, v in attention_stats(q, k, 0.35, block=7, positions=torch.arange(40)).items()
    )
    chosen = torch.tensor([0, 5, 13, 21, 39])
    got = attention_stats(q, k, 0.35, block=2, positions=chosen)
    ref = explicit_reference(
        q, k, 0.35
    )  # over rows 1..T-1; recompute over the chosen rows (row 0 sees one key: left out)
    logits = (q.double() @ k.double().transpose(-2, -1)) * 0.35
    p = logits.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf).softmax(-1)[:, :, chosen[1:]]
    torch.testing.assert_close(got["sink_mass"], p[..., 0].mean((0, 2)).float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got["max_prob"], p.amax(-1).mean((0, 2)).float(), atol=1e-6, rtol=1e-5)
    assert (got["max_logit"] <= ref["max_logit"] + 1e-6).all()  # a max over fewer rows
