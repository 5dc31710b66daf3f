"""The Bigram-Backcopy testbed (data=bigram_backcopy) and the extreme-token metrics, on hand-built
patterns: a head that attends only to <bos>, value vectors of known norm."""

import math

import numpy as np
import pytest
import torch

from attnlab.attention.stats import attention_stats, first_token_norm_ratio, layer_values
from attnlab.data.tasks import IGNORE, BigramBackcopyDataModule
from attnlab.util.errors import DataError


@pytest.fixture
def bb():
    dm = BigramBackcopyDataModule(
        vocab_size=24, n_triggers=3, block_size=48, batch_size=16, steps=6, val_batches=2, seed=5
    )
    dm.setup("fit")
    return dm


def test_triggers_are_followed_by_the_token_before_them_and_never_chain(bb):
    seq, scored = bb.generate(np.random.default_rng(0), 64)
    assert (seq[:, 0] == bb.n_tokens).all() and not bb.is_trigger[seq[:, 1]].any()  # <bos>, then a non-trigger
    hits = 0
    for row in seq:
        for t in range(1, len(row) - 1):
            if bb.is_trigger[row[t]]:
                hits += 1
                assert row[t + 1] == row[t - 1] and not bb.is_trigger[row[t - 1]]
            else:  # a bigram step: a successor the chain allows
                assert bb.transition[row[t], row[t + 1]] > 0
    assert hits > 64  # triggers are the most frequent tokens: they occur
    assert not scored[:, 0].any() and scored[:, 1:].all()


def test_the_chain_belongs_to_the_task_not_the_training_seed(bb):
    other = BigramBackcopyDataModule(vocab_size=24, n_triggers=3, block_size=48, batch_size=16, steps=6, seed=6)
    other.setup("fit")
    assert (other.transition == bb.transition).all() and (other.triggers == bb.triggers).all()
    assert not torch.equal(other.train_set[0][0], bb.train_set[0][0])  # the sequences are the seed's own
    moved = BigramBackcopyDataModule(vocab_size=24, block_size=48, chain_seed=1)
    assert not (moved.transition == bb.transition).all()


def test_metric_masks_split_the_scored_positions_into_copy_and_bigram(bb):
    x, y = bb.train_set[0]
    masks = bb.metric_masks(x)
    assert not (masks["copy"] & masks["bigram"]).any()
    assert torch.equal(masks["copy"] | masks["bigram"], y != IGNORE)
    assert torch.equal(masks["copy"], torch.from_numpy(bb.is_trigger)[x] & (y != IGNORE))
    assert set(bb.query_classes(x)) == {"active", "dormant"}


def test_the_shakespeare_chain_uses_the_corpus_characters():
    dm = BigramBackcopyDataModule(chain="shakespeare", block_size=32)
    assert dm.vocab_size == len(dm.chars) + 1 and " " in [dm.chars[i] for i in dm.triggers]  # space is the commonest
    assert abs(dm.transition.sum(1) - 1).max() < 1e-9


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"n_triggers": 0}, "data.n_triggers"),
        ({"chain": "zipf"}, "data.chain"),
        ({"bos": False}, "data.bos"),
        ({"chain_support": 99}, "data.chain_support"),
    ],
)
def test_bad_settings_name_the_key_in_one_line(kwargs, key):
    with pytest.raises(DataError) as err:
        BigramBackcopyDataModule(vocab_size=24, block_size=16, **kwargs)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_a_head_that_attends_only_to_bos_reads_as_a_dormant_sink():
    b, t, d = 2, 10, 8
    q = torch.ones(b, 2, t, d)
    k = torch.zeros(b, 2, t, d)
    k[:, 0, 0] = 10.0  # head 0: the first key wins every row by a logit of 80
    dormant = torch.ones(b, t, dtype=torch.bool)
    dormant[:, 5] = False
    active = ~dormant
    out = attention_stats(q, k, 1.0, query_classes={"dormant": dormant, "active": active})
    assert out["sink_mass_dormant"][0] == pytest.approx(1.0, abs=1e-6)
    assert out["sink_mass_active"][0] == pytest.approx(1.0, abs=1e-6)
    # head 1 (all keys equal): uniform, so a dormant query at position i puts 1/(i+1) on <bos>
    expected = sum(1 / (i + 1) for i in range(1, t) if i != 5) / (t - 2)
    assert out["sink_mass_dormant"][1] == pytest.approx(expected, rel=1e-5)
    assert out["sink_mass_active"][1] == pytest.approx(1 / 6, rel=1e-5)
    assert layer_values(out)["sink_mass_dormant"] == pytest.approx(1.0, abs=1e-6)  # the layer's strongest head


def test_a_class_with_no_query_is_nan_not_zero():
    q = k = torch.randn(1, 1, 6, 4)
    out = attention_stats(q, k, 0.5, query_classes={"active": torch.zeros(1, 6, dtype=torch.bool)})
    assert math.isnan(float(out["sink_mass_active"][0]))


def test_value_drain_and_residual_peak_are_norm_ratios_of_the_first_token():
    v = torch.randn(3, 2, 7, 16)
    v = v / v.norm(dim=-1, keepdim=True) * 2.0  # every value vector of norm 2 ...
    v[:, 1, 0] *= 0.25  # ... but head 1's first, of norm 0.5
    drain = first_token_norm_ratio(v)
    assert drain.tolist() == pytest.approx([1.0, 0.25], rel=1e-5)
    h = torch.ones(3, 7, 4)
    h[:, 0] *= 5  # the first token's residual state 5x the others'
    assert float(first_token_norm_ratio(h)) == pytest.approx(5.0, rel=1e-6)


def test_a_training_run_logs_the_task_metrics_and_the_extreme_token_metrics(make_cfg):
    from attnlab.training.train import train

    metrics = train(
        make_cfg(
            "data=bigram_backcopy",
            "model.n_layer=1",
            "model.n_head=2",
            "model.block_size=32",
            "callbacks.attention_stats.every_n_steps=3",
        )
    )
    for key in (
        "val/copy/acc",
        "val/copy/loss",
        "val/bigram/acc",
        "val/bigram/loss",
        "attn/L0/sink_mass_dormant",
        "attn/L0/sink_mass_active",
        "attn/L0/value_drain",
        "attn/L0/residual_peak",
    ):
        assert math.isfinite(metrics[key]), key
    assert 0 <= metrics["val/copy/acc"] <= 1 and metrics["attn/L0/value_drain"] > 0


def test_the_study_table_shows_the_extreme_token_columns_and_the_formation_plot(tmp_path):
    import json

    from test_sweep import fake_run

    from attnlab.studies.report import build_report

    for sink in ("none", "learned"):
        for seed in (0, 1):
            extra = {
                "val/copy/acc": 0.99,
                "val/bigram/loss": 0.65,
                "attn/L0/sink_mass_dormant": 0.9 if sink == "none" else 0.1,
                "attn/L0/value_drain": 0.2,
                "attn/L0/residual_peak": 0.3,
            }
            name = f"{sink}-{seed}"
            fake_run(
                tmp_path / "sweep", name, [f"model.attention.sink={sink}", f"seed={seed}"], 0.66, n_layer=1, extra=extra
            )
            history = [
                {
                    "step": s,
                    "attn/L0/sink_mass_dormant": s / 1000,
                    "attn/L0/value_drain": 1 - s / 2000,
                    "attn/L0/residual_peak": 0.3,
                    "attn/L0/max_logit": 5.0,
                }
                for s in (1, 501, 1001)
            ]
            (tmp_path / "sweep" / name / "attention_stats.jsonl").write_text("\n".join(map(json.dumps, history)) + "\n")
    build_report(tmp_path / "sweep", reports=tmp_path / "r")
    runs = (tmp_path / "r" / "fake" / "runs.csv").read_text().splitlines()[0].split(",")
    assert {"val/copy/acc", "val/bigram/loss", "attn/L0/sink_mass_dormant", "attn/L0/value_drain"} <= set(runs)
    assert (tmp_path / "r" / "fake" / "sink_formation.png").stat().st_size > 0
