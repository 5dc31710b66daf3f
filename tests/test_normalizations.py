"""A normalization is registered in one place (attention/normalizations.py) and the rest follows its
flags: the config accepts its name, the schema and the fused kernels refuse it where they cannot compute
it, model.init_from refuses it where no init is neutral, decoding refuses a KV cache where its weights
depend on the forward's length, and the statistics log the row mass where rows need not sum to 1. The
test registers ReLU attention (relu(s q.k) / n, Wortsman et al. 2023) twice, under probe names, with n fixed by the context
and with n the keys of the forward, and checks each consumer against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.attention import normalizations
from attnlab.attention.backends import attend
from attnlab.attention.config import AttentionConfig
from attnlab.attention.normalizations import Normalization, register
from attnlab.attention.stats import attention_stats
from attnlab.attention.weights import WeightRule
from attnlab.config.schema import Schema
from attnlab.interop import neutral
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.util.errors import ConfigError, KernelUnavailable

BLOCK = 10


@pytest.fixture
def probe_relu():
    """probe_relu (n: the keys a query sees at the full context, so it caches) and probe_relu_forward (n: the
    keys of this forward, so a cached step would see other weights), removed again after the test; named apart
    from docs/development.md's worked example, which registers relu itself."""
    added = [
        register(
            Normalization(
                name=name,
                weights=weights,
                rows_sum_to_one=False,
                fused=False,
                takes_escape=False,
                neutral=False,
                caches=caches,
                doc="relu(logit) / n",
            )
        )
        for name, weights, caches in (
            ("probe_relu", lambda s, n: torch.relu(s) / n, True),
            ("probe_relu_forward", lambda s, _n: torch.relu(s) / s.shape[-1], False),
        )
    ]
    yield added
    for n in added:
        del normalizations.REGISTRY[n.name]


def reference(q, k, v, scale, n):
    """float64 relu(s q.k) / n over the causal keys, times v."""
    t = q.shape[-2]
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return (torch.relu(s).masked_fill(~causal, 0) / n) @ v.double()


def tiny(normalize: str, backend: str = "scaled") -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=13,
        block_size=BLOCK,
        n_layer=2,
        n_head=2,
        d_model=8,
        pos_encoding="rope",
        attention={"backend": backend, "normalize": normalize},
    )
    model = GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.5)
    return model


def test_the_config_accepts_a_registered_name_and_names_every_accepted_value(probe_relu):
    assert AttentionConfig(normalize="probe_relu").normalize == "probe_relu"
    with pytest.raises(ValueError) as err:
        AttentionConfig(normalize="cosine")
    assert "model.attention.normalize='cosine'" in str(err.value)
    assert str(err.value).endswith(", probe_relu, probe_relu_forward")  # every registered name, these last
    with pytest.raises(ValueError, match="registered already"):
        register(probe_relu[0])


@pytest.mark.parametrize("backend", ["naive", "scaled"])
def test_the_explicit_kernels_compute_it(probe_relu, backend):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, _ = attend(backend, q, k, v, 0.5, normalize="probe_relu", context_keys=BLOCK)
    torch.testing.assert_close(out, reference(q, k, v, 0.5, BLOCK), atol=1e-12, rtol=1e-12)
    # probe_relu_forward's n is the forward's own key count: 7 here
    out, _ = attend(backend, q, k, v, 0.5, normalize="probe_relu_forward", context_keys=BLOCK)
    torch.testing.assert_close(out, reference(q, k, v, 0.5, 7), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_the_fused_kernels_and_the_schema_refuse_it_by_its_flag(probe_relu, backend, make_cfg):
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(KernelUnavailable, match="model.attention.normalize=probe_relu runs on naive and scaled"):
        attend(backend, q, k, v, 0.5, normalize="probe_relu")
    with pytest.raises(ConfigError) as err:
        Schema.from_cfg(make_cfg(f"attention={backend}", "model.attention.normalize=probe_relu"))
    assert str(err.value).startswith("model.attention.normalize='probe_relu'") and "softmax" in str(err.value)
    with pytest.raises(ConfigError) as err:
        Schema.from_cfg(make_cfg("model.attention.normalize=probe_relu", "model.attention.escape=learned"))
    assert str(err.value).startswith("model.attention.escape='learned'")
    assert Schema.from_cfg(make_cfg("model.attention.normalize=probe_relu")).model.attention.normalize == "probe_relu"


def test_init_from_refuses_a_normalization_that_is_not_neutral(probe_relu):
    problem = neutral.refusal({"normalize": "probe_relu"})
    assert problem.startswith("model.attention.normalize=probe_relu: no init reproduces the checkpoint")
    assert problem.endswith("expected softmax")
    assert neutral.refusal({"normalize": "softmax"}) is None


def test_decoding_follows_the_caches_flag(probe_relu):
    """probe_relu caches: a cached step gives the full forward's logits. probe_relu_forward does not: the KV cache is
    refused naming the key, and generation falls back to rerunning the window (the same tokens as
    cache=False)."""
    x = torch.randint(0, 13, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    model = tiny("probe_relu")
    full = model(x)[0]
    caches = model.kv_caches()
    model.next_logits(x[:, :4], caches)
    steps = [model.next_logits(x[:, t : t + 1], caches) for t in range(4, BLOCK)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], atol=1e-10, rtol=1e-10)

    forward = tiny("probe_relu_forward")
    with pytest.raises(ValueError, match="model.attention.normalize=probe_relu_forward takes no KV cache"):
        forward.kv_caches()
    with pytest.raises(ValueError, match="takes no KV cache"):
        forward.rolling_kv_caches(6, 1)
    outs = [
        forward.generate(x[:1, :3], 5, top_k=1, generator=torch.Generator().manual_seed(0), cache=c)
        for c in (True, False)
    ]
    assert torch.equal(*outs)


def test_the_statistics_log_the_row_mass_where_rows_need_not_sum_to_one(probe_relu):
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(2))
    stats = attention_stats(q, k, WeightRule(scale=0.5, normalize="probe_relu", context_keys=6))
    s = (q @ k.transpose(-2, -1)) * 0.5
    mass = (torch.relu(s).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), 0) / 6).sum(-1)
    torch.testing.assert_close(
        stats["row_mass"], mass[:, :, 1:].mean((0, 2)), atol=1e-6, rtol=1e-5
    )  # query 0: left out
    assert "row_mass" not in attention_stats(q, k, WeightRule(scale=0.5))
