"""Latent attention's absorbed decoding (attention/latent.py): the same logits and greedy tokens as
the re-expanding form on every backend, scaling, normalisation and variant that decodes, the cache
d_c + d_rope per token either way, and the expanded form wherever a per-head key is read."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.attention import backends
from attnlab.attention.latent import step_macs
from attnlab.attention.module import Knockout
from attnlab.attention.normalizations import NORMALIZATIONS
from attnlab.attention.scaling import SCALINGS
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.util.errors import KernelUnavailable

BLOCK, VOCAB = 12, 13
LATENT = {"d_c": 6, "d_rope": 4}
VARIANTS = {
    "rope": {"pos_encoding": "rope"},
    "query_latent": {"pos_encoding": "rope", "attention": {"latent": {"d_c": 6, "d_rope": 2, "d_cq": 10}}},
    "nope": {"pos_encoding": "none", "attention": {"latent": {"d_c": 8}}},
    "learned_positions": {"pos_encoding": "learned", "attention": {"latent": {"d_c": 8}}},
    "alibi": {"pos_encoding": "alibi", "attention": {"latent": {"d_c": 8}}},
    "escape_zero_logit": {"pos_encoding": "rope", "attention": {"escape": "zero_logit"}},
    "escape_learned": {"pos_encoding": "rope", "attention": {"escape": "learned"}},
    "gate_headwise": {"pos_encoding": "rope", "attention": {"gate": "headwise"}},
    "gate_elementwise": {"pos_encoding": "rope", "attention": {"gate": "elementwise"}},
    "window": {"pos_encoding": "rope", "attention": {"window": 4, "window_sinks": 1}},
    "biases_llama_block": {"pos_encoding": "rope", "bias": True, "norm": "rmsnorm", "mlp": "swiglu"},
    "wide_head": {"pos_encoding": "rope", "attention": {"latent": {"d_c": 2, "d_rope": 2}}},  # d_c < d_k
}


def model_of(backend: str, variant: str = "rope", scaling: str | None = None, normalize: str = "softmax") -> GPT:
    """A 2-layer float32 model, every parameter drawn at std 0.3: weights far from uniform."""
    torch.manual_seed(0)
    spec = dict(VARIANTS[variant])
    attention = {"backend": backend, "normalize": normalize, **spec.pop("attention", {})}
    attention["latent"] = {**LATENT, **attention.get("latent", {})} if "latent" in attention else dict(LATENT)
    if spec.get("pos_encoding") != "rope":
        attention["latent"].pop("d_rope", None)
    if scaling is not None:
        attention["scaling"] = scaling
    cfg = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, d_model=16, attention=attention, **spec)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
    return model


@torch.no_grad()
def greedy(model: GPT, mode: str, prompt: torch.Tensor, steps: int = 7) -> tuple[torch.Tensor, list, list[str]]:
    """Greedy decoding after ``prompt`` with caches read ``mode``: (tokens, logits per step, layer 0's path per step)."""
    caches = model.kv_caches(mode)
    logits, paths = [model.next_logits(prompt, caches)], [model.blocks[0].attn.latent_path]
    out = [logits[-1].argmax(-1, keepdim=True)]
    for _ in range(steps):
        logits.append(model.next_logits(out[-1], caches))
        paths.append(model.blocks[0].attn.latent_path)
        out.append(logits[-1].argmax(-1, keepdim=True))
    return torch.cat(out, dim=1), logits, paths


def prompt(b: int = 3, t: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(1))


def assert_same_decoding(model: GPT) -> None:
    """Absorbed and expanded decoding give the same tokens and logits (float32), each form having run."""
    try:
        expanded = greedy(model, "expanded", prompt())
    except KernelUnavailable as err:  # a backend that does not decode this variant refuses both forms alike
        with pytest.raises(KernelUnavailable, match=str(err).split("(")[0][:40]):
            greedy(model, "absorbed", prompt())
        return
    absorbed = greedy(model, "absorbed", prompt())
    assert set(expanded[2]) == {"expanded"} and set(absorbed[2]) == {"absorbed"}
    assert torch.equal(absorbed[0], expanded[0])
    for a, e in zip(absorbed[1], expanded[1]):
        torch.testing.assert_close(a, e)


SCALING_CASES = [
    (b, s, n)
    for b in backends.BACKENDS
    for s in SCALINGS
    for n in NORMALIZATIONS
    if n == "softmax" or b in backends.EXPLICIT  # sigmoid runs on the explicit kernels only
]


@pytest.mark.parametrize("backend,scaling,normalize", SCALING_CASES)
def test_absorbed_decoding_equals_expanded_for_every_scaling_and_normalization(backend, scaling, normalize):
    assert_same_decoding(model_of(backend, "rope", scaling, normalize))


@pytest.mark.parametrize("backend", backends.BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_absorbed_decoding_equals_expanded_for_every_variant(backend, variant):
    assert_same_decoding(model_of(backend, variant))


@pytest.mark.parametrize("backend", ["scaled", "sdpa"])
def test_absorbed_decoding_over_a_rolling_cache(backend):
    """Through evictions (keys stored before RoPE, rotated at their index in the cache)."""
    model = model_of(backend)
    idx = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(2))
    outs = {}
    for mode in ("absorbed", "expanded"):
        caches = model.rolling_kv_caches(6, 2)
        for c in caches:
            c.latent_decode = mode
        with torch.no_grad():
            outs[mode] = [model.next_logits(idx[:, i : i + 1], caches) for i in range(14)]
        assert model.blocks[0].attn.latent_path == mode
    for a, e in zip(outs["absorbed"], outs["expanded"]):
        torch.testing.assert_close(a, e)


def test_the_cache_holds_d_c_plus_d_rope_per_token_in_either_form():
    model = model_of("sdpa")
    rows = {}
    for mode in ("absorbed", "expanded"):
        caches = model.kv_caches(mode)
        with torch.no_grad():
            model.next_logits(prompt(t=5), caches)
            model.next_logits(prompt(t=1), caches)
        assert all(c.k.shape == (3, 1, BLOCK, 6 + 4) and c.v is None for c in caches)
        rows[mode] = caches[1].k[:, :, :6]
    torch.testing.assert_close(rows["absorbed"], rows["expanded"])


def test_auto_takes_the_form_with_fewer_multiply_adds():
    """d_c = 6 > d_k = 4: a prefill expands, a step absorbs; with d_c = 2 < d_k both absorb."""
    assert step_macs(1, 10, 4, 4, 6, 4) == {
        "expanded": 10 * 6 * 2 * 4 * 4 + 10 * 4 * 12,
        "absorbed": 2 * 4 * 4 * 6 + 40 * 20,
    }
    for variant, prefill in (("rope", "expanded"), ("wide_head", "absorbed")):
        _, _, paths = greedy(model_of("sdpa", variant), "auto", prompt(t=BLOCK - 7))
        assert paths == [prefill] + ["absorbed"] * 7


def test_recording_statistics_falls_back_to_the_expanded_keys():
    """A recorded forward needs every head's key: it expands even when the cache asks to absorb."""
    model = model_of("sdpa")
    caches, records = model.kv_caches("absorbed"), []
    layer = model.attention_layers()[0]
    with torch.no_grad():
        model.next_logits(prompt(t=5), caches)
        layer.record_to = records
        recorded = model.next_logits(prompt(t=1), caches)
    assert model.blocks[0].attn.latent_path == "expanded"
    assert records[0].k.shape == (3, 4, 6, 4 + 4)  # (B, H, T_k, d_k + d_rope): per-head keys
    again = model.kv_caches("expanded")
    with torch.no_grad():
        model.next_logits(prompt(t=5), again)
        torch.testing.assert_close(recorded, model.next_logits(prompt(t=1), again))


def test_a_knockout_falls_back_to_the_expanded_keys():
    """A knockout recomputes one head's weights from its own keys: a cached prefill under a knockout
    expands and equals the full forward's edit."""
    model = model_of("sdpa")
    idx = prompt(t=6)
    model.attention_layers()[0].knockout = Knockout(torch.eye(6, dtype=torch.bool).expand(3, 6, 6), head=1)
    caches = model.kv_caches("absorbed")
    with torch.no_grad():
        cached = model.next_logits(idx, caches)
        full = model(idx)[0][:, -1]
    assert model.blocks[0].attn.latent_path == "expanded"
    torch.testing.assert_close(cached, full)


def test_the_folded_weights_follow_an_edit_and_carry_gradients():
    """An in-place edit of kv_up reaches the absorbed form's folded copy; with autograd on, the
    absorbed form's gradients are the expanded form's."""
    model = model_of("sdpa")
    greedy(model, "absorbed", prompt())
    with torch.no_grad():
        model.blocks[0].attn.kv_up.weight.mul_(-1.5)
    assert_same_decoding(model)
    grads = {}
    for mode in ("absorbed", "expanded"):
        model.zero_grad()
        caches = model.kv_caches(mode)
        with torch.no_grad():
            model.next_logits(prompt(t=5), caches)
        model.next_logits(prompt(t=1), caches).square().sum().backward()
        grads[mode] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(grads["absorbed"]) == len(grads["expanded"]) > 0
    for a, e in zip(grads["absorbed"], grads["expanded"]):
        torch.testing.assert_close(a, e)
