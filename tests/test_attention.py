"""Every backend against a float64 reference; causality; scaling rules; masks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import BACKENDS, Attention, AttentionConfig, attend, static_scale
from attnlab.attention.scaling import qk_component_std


def reference(q, k, v, scale, key_padding_mask=None):
    """softmax(scale q k^T + causal/padding mask) v in float64; rows with no visible key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    t = q.shape[-2]
    logits = q @ k.transpose(-2, -1) * (scale.double().view(1, -1, 1, 1) if torch.is_tensor(scale) else scale)
    allowed = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(logits, -1).nan_to_num(0.0)  # all -inf rows -> 0 by definition
    return probs @ v


# fp32 inputs vs a float64 reference: rounding of a length-d dot product and a length-T
# weighted sum, each ~sqrt(n) * 6e-8 relative; 2e-5 absolute leaves a wide margin at T, d <= 64
# yet catches any wrong scale, mask or softmax (errors of order 1e-2 and up).
ATOL = 2e-5


@settings(max_examples=30, deadline=None)
@given(
    backend=st.sampled_from(BACKENDS),
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    t=st.integers(1, 40),
    d=st.sampled_from([8, 16, 32, 64]),
    padded=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_backend_matches_float64_reference(backend, b, h, t, d, padded, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=gen, requires_grad=True) for _ in range(3))
    kpm = (torch.rand(b, t, generator=gen) > 0.3) if padded else None
    scale = 1 / math.sqrt(d)
    out, _ = attend(backend, q, k, v, scale, key_padding_mask=kpm)
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, scale, kpm)
    torch.testing.assert_close(out.double(), ref.detach(), atol=ATOL, rtol=1e-4)
    grad_out = torch.randn(out.shape, generator=gen)
    out.backward(grad_out)
    ref.backward(grad_out.double())
    for x, xr in ((q, qr), (k, kr), (v, vr)):
        assert torch.isfinite(x.grad).all()
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_head_tensor_scale(backend):
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    scale = torch.tensor([0.1, 0.5, 2.0])
    out, _ = attend(backend, q, k, v, scale)
    torch.testing.assert_close(out.double(), reference(q, k, v, scale), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causality(backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 16) for _ in range(3))
    t = 5
    out, _ = attend(backend, q, k, v, 0.25)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 10
    out2, _ = attend(backend, q2, k2, v2, 0.25)
    assert torch.equal(out[:, :, : t + 1], out2[:, :, : t + 1])
    assert not torch.allclose(out[:, :, t + 1 :], out2[:, :, t + 1 :])


def test_naive_is_scaled_with_prescaled_logits():
    """naive (no scale) on q / sqrt(d) gives exactly what scaled gives on q: they differ only by s."""
    torch.manual_seed(1)
    d = 64
    q, k, v = (torch.randn(2, 4, 16, d) for _ in range(3))
    naive = Attention(AttentionConfig("naive", "none"), 4, d)
    scaled = Attention(AttentionConfig("scaled", "inv_sqrt_d"), 4, d)
    assert naive.softmax_scale() == 1.0 and scaled.softmax_scale() == 1 / 8
    # 1/8 is a power of two, so pre-dividing q is exact and the outputs agree bit for bit
    assert torch.equal(naive(q / 8, k, v), scaled(q, k, v))
    assert not torch.allclose(naive(q, k, v), scaled(q, k, v), atol=1e-3)


def test_scaling_rules():
    assert static_scale("none", 64) == 1.0
    assert static_scale("inv_sqrt_d", 64) == 0.125
    assert static_scale("inv_d", 64) == 1 / 64
    # sigma: unit-variance logits at init whatever the init std
    sigma = qk_component_std(0.02, 128, qk_norm=False)
    assert sigma == pytest.approx(0.02 * math.sqrt(128))
    assert static_scale("sigma", 64, sigma, sigma) == pytest.approx(1 / (sigma**2 * 8))
    assert qk_component_std("fan_in", 128, False) == 1.0
    assert qk_component_std(0.02, 128, qk_norm=True) == 1.0
    with pytest.raises(ValueError, match="unknown scaling"):
        static_scale("bogus", 64)


def test_sigma_scaling_gives_unit_variance_logits_at_init():
    """The sigma rule's claim, measured: q.k * s has std ~1 for LayerNorm'd inputs and init std 0.02."""
    from attnlab.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(
        GPTConfig(n_layer=1, n_head=4, d_model=256, d_k=64, attention={"backend": "scaled", "scaling": "sigma"})
    )
    attn = model.blocks[0].attn
    x = torch.nn.functional.layer_norm(torch.randn(8, 64, 256), (256,))
    parts = attn.qkv_parts(attn.qkv_proj.weight)
    q, k = attn._heads(x @ parts.q.T), attn._heads(x @ parts.k.T)
    logits = (q @ k.transpose(-2, -1)) * attn.attention.softmax_scale()
    assert logits.std().item() == pytest.approx(1.0, rel=0.15)


def test_learned_scale_is_a_positive_per_head_parameter():
    attn = Attention(AttentionConfig("sdpa", "learned"), 4, 16)
    s = attn.softmax_scale()
    assert s.shape == (4,) and torch.allclose(s, torch.full((4,), 0.25))
    q, k, v = (torch.randn(1, 4, 6, 16) for _ in range(3))
    attn(q, k, v).sum().backward()
    assert attn.scale.log_scale.grad is not None and attn.scale.log_scale.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_are_zero_not_nan(backend):
    q, k, v = (torch.randn(2, 2, 6, 8, requires_grad=True) for _ in range(3))
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[0, :3] = False  # rows 0..2 of batch 0 see no key at all under the causal mask
    out, _ = attend(backend, q, k, v, 0.3, key_padding_mask=kpm)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, :, :3], torch.zeros_like(out[0, :, :3]))
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_kernel_names():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    assert attend("scaled", q, k, v, 0.25)[1] == "eager"
    assert attend("flash", q, k, v, 0.25)[1] == "sdpa:flash"
    assert attend("sdpa", q, k, v, 0.25)[1].startswith("sdpa:")


def test_flash_never_falls_back_silently(monkeypatch):
    """When PyTorch's flash kernel refuses the inputs, attention=flash stops with one line naming
    the alternative instead of running another kernel."""
    import types

    from attnlab.attention import backends
    from attnlab.util.errors import KernelUnavailable

    def no_kernel(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.\nmore detail")

    monkeypatch.setattr(backends, "F", types.SimpleNamespace(scaled_dot_product_attention=no_kernel))
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with pytest.raises(KernelUnavailable) as err:
        attend("flash", q, k, v, 0.25)
    message = str(err.value)
    assert "\n" not in message and "attention=sdpa" in message and "No available kernel" in message
