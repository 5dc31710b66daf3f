"""QK-clip (optim.qk_clip): a head whose largest logit passed the threshold is brought to it, the
others keep theirs; measured with the statistics' max_logit on the same input before and after."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import AttentionConfig, AttentionLayer
from attnlab.attention.stats import head_max_logits
from attnlab.training.train import train
from attnlab.util.errors import ConfigError


def layer_max_logits(layer: AttentionLayer, x: torch.Tensor) -> torch.Tensor:
    records = []
    layer.attention.record_to = records
    with torch.no_grad():
        layer(x)
    layer.attention.record_to = None
    return head_max_logits(layer.attention, records[0].q, records[0].k)


LATENT = {"d_c": 12, "d_rope": 4}


@pytest.mark.parametrize(
    ("n_kv_head", "attention", "pos_encoding"),
    [
        (4, {}, "rope"),
        (2, {}, "learned"),
        (1, {}, "rope"),
        (4, {"differential": True}, "rope"),
        (4, {"latent": LATENT}, "rope"),
        (4, {"latent": {**LATENT, "d_cq": 10}}, "rope"),
    ],
)
def test_a_logit_above_the_threshold_is_brought_to_it_and_heads_below_keep_theirs(n_kv_head, attention, pos_encoding):
    torch.manual_seed(0)
    layer = AttentionLayer(AttentionConfig("scaled", **attention), 32, 4, 8, n_kv_head, pos_encoding=pos_encoding)
    layer = layer.double()
    q_proj = layer.qkv_parts(layer.qkv_proj.weight)[0] if layer.latent is None or not layer.q_up else layer.q_up.weight
    with torch.no_grad():  # heads 0 and 2 grow large logits; 1 and 3 stay small
        q_proj.view(4, -1, q_proj.shape[-1])[[0, 2]] *= 40
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    before = layer_max_logits(layer, x)
    threshold = float((before[[0, 2]].min() + before[[1, 3]].max()) / 2)
    assert before[[0, 2]].min() > threshold > before[[1, 3]].max()
    weight = layer.qkv_proj.weight.detach().clone()

    assert layer.clip_qk(before, threshold) == 2
    after = layer_max_logits(layer, x)
    torch.testing.assert_close(after[[0, 2]], torch.full((2,), threshold))
    torch.testing.assert_close(after[[1, 3]], before[[1, 3]])
    if (
        n_kv_head == 4 and layer.latent is None
    ):  # no key head shared with a clipped head: head 1's and 3's rows are untouched
        rows = layer.qkv_parts(layer.qkv_proj.weight)
        old = layer.qkv_parts(weight)
        for part in (0, 1):
            assert torch.equal(rows[part].view(4, 8, -1)[[1, 3]], old[part].view(4, 8, -1)[[1, 3]])
        assert torch.equal(rows.v, old.v)


def test_no_head_over_the_threshold_changes_nothing():
    torch.manual_seed(1)
    layer = AttentionLayer(AttentionConfig("scaled"), 32, 4, 8)
    x = torch.randn(1, 6, 32)
    before = layer_max_logits(layer, x)
    weight = layer.qkv_proj.weight.detach().clone()
    assert layer.clip_qk(before, float(before.max()) + 1.0) == 0
    assert torch.equal(layer.qkv_proj.weight, weight)


def test_training_with_qk_clip_clips_heads_and_refuses_qk_norm_and_compile(make_cfg):
    # a threshold below the logits at init: every step clips some heads
    metrics = train(make_cfg("callbacks=none", "optim.qk_clip=0.001", "trainer.max_steps=2"))
    assert metrics["train/qk_clipped_heads"] > 0
    with pytest.raises(ConfigError, match="optim.qk_clip=0.5 .*qk_norm=true"):
        train(make_cfg("callbacks=none", "optim.qk_clip=0.5", "model.attention.qk_norm=true"))
    with pytest.raises(ConfigError, match="optim.qk_clip=0.5 .*model.compile=true"):
        train(make_cfg("callbacks=none", "optim.qk_clip=0.5", "model.compile=true"))
