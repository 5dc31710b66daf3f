"""The sink papers' measurements in the metric registry, on constructed inputs with known answers:
the share of sink heads (Gu et al. 2024, epsilon 0.3), the residual stream's massive activations
(max / median, kurtosis) and the output gate's mean score."""

from __future__ import annotations

import pytest
import torch

from attnlab.analysis.probe import probe
from attnlab.attention.masks import Visibility
from attnlab.attention.stats import (
    attention_stats,
    kurtosis,
    layer_values,
    max_over_median,
    record_stats,
    uniform_sink_mass,
)
from attnlab.attention.weights import WeightRule
from attnlab.model import GPT, GPTConfig

T = 16


def first_key_heads() -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (1, 3, T, 1) whose heads put nearly all weight on the first key (head 0), spread it
    uniformly (head 1: mean first-token weight 0.159 at T = 16) and avoid it (head 2)."""
    k = torch.zeros(1, 3, T, 1)
    k[:, :, 0] = 20.0
    q = torch.tensor([1.0, 0.0, -1.0]).view(1, 3, 1, 1).expand(1, 3, T, 1).clone()
    return q, k


def test_sink_heads_is_the_share_of_heads_over_epsilon():
    q, k = first_key_heads()
    stats = attention_stats(q, k)
    assert stats["sink_mass"][1] == pytest.approx(uniform_sink_mass(T), abs=1e-6)
    assert stats["sink_heads"].tolist() == [1.0, 0.0, 0.0]
    assert layer_values(stats)["sink_heads"] == pytest.approx(1 / 3)


def test_sink_heads_averages_over_the_queries_that_see_the_first_key():
    """Under a window of 4 keys, queries 4.. no longer see key 0: head 0's mean over those that do
    is about 1 (a sink head), while its sink_mass over every query is 3/15 = 0.2, under 0.3; the
    uniform head 1 gives queries 1..3 weights 1/2, 1/3, 1/4 on it, mean 0.361: a sink head too."""
    q, k = first_key_heads()
    stats = attention_stats(q, k, WeightRule(scale=1.0, visibility=Visibility(True, 4, 0)))
    assert stats["sink_mass"][0] == pytest.approx(3 / 15, abs=1e-6)
    assert stats["sink_heads"].tolist() == [1.0, 1.0, 0.0]


def test_sink_heads_threshold_is_strict_at_epsilon():
    """A head whose first-token weight is exactly p at every query: 1 above 0.3, 0 at or below it."""
    for p, want in ((0.35, 1.0), (0.25, 0.0)):
        # query i > 0 sees i + 1 keys; logit c on key 0, 0 elsewhere: p = e^c / (e^c + i), so c = log(p i / (1 - p))
        rows = torch.arange(1, T)
        c = torch.log(p * rows / (1 - p))
        w_rule = WeightRule(scale=1.0, bias=lambda r, keys, c=c: first_key_bias(r, keys, c))
        stats = attention_stats(torch.zeros(1, 1, T, 1), torch.zeros(1, 1, T, 1), w_rule)
        assert stats["sink_heads"].item() == want


def first_key_bias(rows: torch.Tensor, keys: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    bias = torch.zeros(1, len(rows), len(keys))
    for n, row in enumerate(rows.tolist()):
        if row > 0:
            bias[0, n, 0] = c[row - 1]
    return bias


def test_massive_activation_ratio_and_kurtosis_have_their_known_values():
    h = torch.ones(2, 8, 16)
    h[1, 3, 5] = 1000.0
    assert float(max_over_median(h)) == pytest.approx(1000.0)
    signs = torch.tensor([1.0, -1.0]).repeat(64).view(2, 4, 16)  # +-1 equally often: kurtosis 1
    assert float(kurtosis(signs)) == pytest.approx(1.0)
    gaussian = torch.randn(4, 256, 256, generator=torch.Generator().manual_seed(0))
    assert float(kurtosis(gaussian)) == pytest.approx(3.0, abs=0.05)
    # one entry 1 among n - 1 zeros: m2 = (n - 1) / n^2, m4 = (n - 1)((n - 1)^3 + 1) / n^5, so m4 / m2^2 = n - 2 + 1/(n - 1)
    n = 1000
    spike = torch.zeros(n)
    spike[0] = 1.0
    assert float(kurtosis(spike)) == pytest.approx(n - 2 + 1 / (n - 1), rel=1e-5)


def test_the_probe_logs_gate_mean_and_the_residual_metrics_per_layer():
    """A headwise gate whose projection is zero scores sigmoid(0) = 0.5 on every head; the residual
    metrics are one value per layer, those of the block's output; no gate, no gate_mean."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, d_model=16, attention={"gate": "headwise"})
    model = GPT(cfg)
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.gate_proj.weight)
    records = probe(model, torch.randint(0, 11, (3, 12)))
    for rec in records:
        values = record_stats(rec)
        assert values["gate_mean"].tolist() == [0.5, 0.5]
        assert values["residual_max_ratio"].dim() == 0 and values["residual_kurtosis"].dim() == 0
        assert float(values["residual_max_ratio"]) == pytest.approx(float(max_over_median(rec.residual)))
    plain = probe(
        GPT(GPTConfig(vocab_size=11, block_size=12, n_layer=1, n_head=2, d_model=16)), torch.zeros(1, 4).long()
    )
    assert "gate_mean" not in record_stats(plain[0])


def test_one_sink_rule_at_the_threshold_for_every_reader():
    """Gu et al.'s rule is strict: a head at exactly 0.3 is no sink, in the statistic, the head types and the
    text-sink search alike."""
    import torch

    from attnlab.analysis.heads import head_type
    from attnlab.attention.stats import SINK_EPSILON, is_sink
    from attnlab.studies import sink_search

    at, above = SINK_EPSILON, SINK_EPSILON + 1e-6
    assert not is_sink(at) and is_sink(above)
    assert is_sink(torch.tensor([at, above])).tolist() == [False, True]
    base = {"induction": 0.0, "previous_token": 0.0, "positional": 0.0, "entropy_norm": 0.5}
    assert head_type({**base, "sink": at}) == "content" and head_type({**base, "sink": above}) == "sink"
    assert head_type({**base, "sink": 0.0, "escape": at}) == "content"
    assert head_type({**base, "sink": 0.0, "escape": above}) == "escape"
    assert sink_search.step_reached([{"step": 500, "sink_max": at}, {"step": 1000, "sink_max": above}]) == 1000
