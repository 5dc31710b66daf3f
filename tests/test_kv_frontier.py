"""experiment=kv_frontier composes with every arm of its grid: each passes the config checks and
builds a model whose cache holds what the experiment states, at the parameters it states; the KV
bytes every arm logs are those its cache holds at the run's context."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from attnlab.attention.config import kv_values_per_token
from attnlab.callbacks.peak_memory import PeakMemoryMonitor
from attnlab.config.compose import compose_config
from attnlab.config.schema import Schema
from attnlab.model import GPT, GPTConfig
from attnlab.studies import report
from attnlab.studies.report import data, frontier
from attnlab.sweeps.sweep import study_grid
from attnlab.util import significance

GRID = study_grid("kv_frontier")
# cached values per token and layer (4 heads of 32), and the window's entries at most
CACHE = {
    "baseline": 256,
    "gqa_kv2": 128,
    "mqa": 64,
    "mla_dc128": 144,
    "mla_dc64": 72,
    "mla_dc32": 40,
    "window_kept": 256,
}


def arm_config(arm: str, tmp_path):
    fixed = [f"{key}={values[0]}" for key, values in GRID.items() if key != "variant"]
    return compose_config(["experiment=kv_frontier", *fixed, f"variant={arm}", "debug=smoke"], tmp_path)


def model_config(cfg) -> GPTConfig:
    return GPTConfig(**{**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": 64})


@pytest.mark.parametrize("arm", GRID["variant"])
def test_the_experiment_composes_with_every_arm(arm, tmp_path):
    cfg = arm_config(arm, tmp_path)
    Schema.from_cfg(cfg)
    gpt = GPT(model_config(cfg))
    assert (cfg.study, cfg.model.n_head, cfg.model.block_size, cfg.model.pos_encoding) == ("kv_frontier", 4, 64, "rope")
    assert kv_values_per_token(gpt.cfg.attention, gpt.cfg.n_kv_head, gpt.cfg.d_k) == CACHE[arm]
    attention_parameters = sum(p.numel() for p in gpt.blocks[0].attn.parameters())
    mha = 4 * 128 * 128
    if arm == "mla_dc128":  # DeepSeek-V2's ratio: no query latent matches multi-head at this width
        assert attention_parameters == 80_552
        assert kv_values_per_token(gpt.cfg.attention, gpt.cfg.n_kv_head, gpt.cfg.d_k) == 2.25 * 2 * 32
    elif arm.startswith("mla") or arm in ("baseline", "window_kept"):  # matched: within the latents' norm weights
        assert abs(attention_parameters - mha) <= 300
    else:  # grouped / multi-query: the shared key/value heads' weights are gone
        kv_heads = gpt.cfg.n_kv_head
        assert attention_parameters == 2 * 128 * 128 + 2 * 128 * kv_heads * 32
    if arm == "window_kept":
        assert (gpt.cfg.attention.window, gpt.cfg.attention.window_sinks) == (32, 4)


def test_every_arm_is_in_the_grid():
    assert sorted(GRID["variant"]) == sorted(CACHE)


@pytest.fixture(scope="module")
def window_and_mha(tmp_path_factory):
    return tuple(model_config(arm_config(arm, tmp_path_factory.mktemp(arm))) for arm in ("window_kept", "baseline"))


@pytest.mark.parametrize("context", [1, 16, 36, 37, 64, 4096])
def test_a_window_cache_holds_its_window_and_kept_tokens_at_any_context(window_and_mha, context):
    window, mha = window_and_mha
    entry = window.n_layer * 2 * 8 * 16 * 4  # one position's keys and values, every layer, fp32
    assert window.kv_cache_bytes(context, 4) == entry * min(context, 32 + 4)
    assert mha.kv_cache_bytes(context, 4) == entry * context
    if context > 32 + 4:
        assert window.kv_cache_bytes(context, 4) < mha.kv_cache_bytes(context, 4)
    else:
        assert window.kv_cache_bytes(context, 4) == mha.kv_cache_bytes(context, 4)


@pytest.mark.parametrize("arm", ["window_kept", "baseline", "mla_dc32"])
def test_the_logged_kv_bytes_are_the_cache_at_the_block_size_per_token(arm, tmp_path):
    """The memory callback's mem/kv_cache_bytes_per_token is GPTConfig.kv_cache_bytes at the block size
    over it: the window arm's 36 of 64 positions, not multi-head's whole block."""
    cfg = model_config(arm_config(arm, tmp_path))
    monitor = PeakMemoryMonitor(every_n_steps=1)
    trainer = SimpleNamespace(global_step=0, precision="32-true", is_global_zero=True, loggers=[])
    module = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(cfg=cfg))
    batch = (torch.zeros(2, cfg.block_size, dtype=torch.long),) * 2
    monitor.on_train_batch_start(trainer, module, batch, 0)
    monitor.on_train_batch_end(trainer, module, None, batch, 0)
    logged = monitor.summary()
    per_entry = cfg.n_layer * CACHE[arm] * 4
    held = min(64, 36) if arm == "window_kept" else 64
    assert logged["mem/kv_cache_context"] == cfg.block_size == 64
    assert logged["mem/kv_cache_bytes_per_token"] == per_entry * held / 64


# ---- the frontier report, from a runs.csv written here
NOISE = (-0.01, -0.005, 0.0, 0.005, 0.01)  # five seeds: a 95 % interval of about +-0.01 around each mean


def runs_frame(arms: dict[str, tuple[float, float]], context: int = 64, spread: float = 1.0) -> pd.DataFrame:
    """runs.csv's rows: per arm (mean val loss, KV bytes per token), five seeds around the mean."""
    rows = [
        {
            "model.block_size": str(context),
            "variant": arm,
            "seed": seed,
            "budget": "default",
            "status": "ok",
            "error": "",
            "run": f"{arm}_{seed}",
            "val/loss": loss + spread * noise,
            "mem/kv_cache_bytes_per_token": per_token,
            "mem/kv_cache_context": float(context),
        }
        for arm, (loss, per_token) in arms.items()
        for seed, noise in enumerate(NOISE)
    ]
    return pd.DataFrame(rows)


def on_frontier(arms: dict[str, tuple[float, float]], **kw) -> set[str]:
    found, _ = frontier.arms(runs_frame(arms, **kw), "kv_frontier")
    return {a.name for a in found if a.on_frontier}


def test_an_arm_leaves_the_frontier_when_a_cheaper_arm_is_lower_beyond_seed_noise():
    arms = {"baseline": (1.00, 2048.0), "gqa_kv2": (1.20, 512.0), "mqa": (1.50, 256.0)}
    assert on_frontier(arms) == {"baseline", "gqa_kv2", "mqa"}  # each cheaper arm is worse: a trade
    arms["mqa"] = (1.10, 256.0)  # cheaper than gqa_kv2 and lower: gqa_kv2 is dominated, baseline is not
    assert on_frontier(arms) == {"baseline", "mqa"}
    arms["mqa"] = (0.90, 256.0)  # cheapest and lowest: it alone
    assert on_frontier(arms) == {"mqa"}
    found, _ = frontier.arms(runs_frame(arms), "kv_frontier")
    assert {a.name: sorted(a.dominated_by) for a in found} == {"baseline": ["mqa"], "gqa_kv2": ["mqa"], "mqa": []}


def test_a_lower_loss_within_seed_noise_dominates_nothing():
    arms = {"baseline": (1.000, 2048.0), "mqa": (0.995, 256.0)}
    assert on_frontier(arms, spread=3.0) == {"baseline", "mqa"}  # 0.005 lower, seeds +-0.03: not resolved
    assert on_frontier(arms, spread=0.1) == {"mqa"}  # the same means, seeds +-0.001: resolved


def test_equal_bytes_leave_the_arm_with_the_lower_loss():
    """At T <= window + kept the window arm's cache is multi-head's: the lower loss beyond noise wins."""
    assert on_frontier({"baseline": (1.0, 2048.0), "window_kept": (1.1, 2048.0)}, context=32) == {"baseline"}
    assert on_frontier({"baseline": (1.1, 2048.0), "window_kept": (1.0, 2048.0)}, context=32) == {"window_kept"}
    assert on_frontier({"baseline": (1.0, 2048.0), "window_kept": (1.0, 2048.0)}, context=32) == {
        "baseline",
        "window_kept",
    }


def test_bytes_and_sequences_per_gib_are_the_cache_formula(window_and_mha, tmp_path):
    window, mha = window_and_mha
    context = window.block_size
    per_token = {
        arm: cfg.kv_cache_bytes(context, 4) / context for arm, cfg in zip(("window_kept", "baseline"), (window, mha))
    }
    frame = runs_frame({"baseline": (1.0, per_token["baseline"]), "window_kept": (1.3, per_token["window_kept"])})
    data.write_runs(frame, tmp_path / "runs.csv")
    summary = report.write_report(tmp_path, {"study": "kv_frontier", "attention_free_level": None}, draw=False)
    arms = {a["arm"]: a for a in summary["frontier"]["arms"]}
    for arm, cfg in (("window_kept", window), ("baseline", mha)):
        assert arms[arm]["kv_bytes_per_token"] == cfg.kv_cache_bytes(context, 4) / context
        assert arms[arm]["kv_bytes_per_sequence"] == cfg.kv_cache_bytes(context, 4)
        assert arms[arm]["sequences_per_gib"] == 2**30 / cfg.kv_cache_bytes(context, 4)
    assert arms["window_kept"]["kv_bytes_per_sequence"] == window.n_layer * 256 * 4 * 36
    assert summary["frontier"]["context"] == 64
    assert set(summary["frontier"]["on_frontier"]) == {"baseline", "window_kept"}  # cheaper but worse: a trade
    assert (tmp_path / "frontier.md").is_file()


def test_the_reference_contrast_is_welch_with_holm_over_the_arms():
    arms = {"baseline": (1.0, 2048.0), "gqa_kv2": (1.05, 512.0), "mqa": (1.2, 256.0)}
    frame = runs_frame(arms)
    found, reference = frontier.arms(frame, "kv_frontier")
    assert reference == "baseline" and found[0].name == "baseline" and found[0].vs_reference is None
    losses = {arm: frame[frame["variant"] == arm]["val/loss"] for arm in arms}
    tests = [significance.welch(losses["baseline"], losses[a.name]) for a in found[1:]]
    assert [a.vs_reference for a in found[1:]] == tests
    assert [a.p_holm for a in found[1:]] == significance.holm([t.p for t in tests])


def test_the_reference_arm_above_the_attention_free_level_makes_the_question_untested(tmp_path):
    data.write_runs(runs_frame({"baseline": (1.0, 2048.0), "mqa": (1.2, 256.0)}), tmp_path / "runs.csv")
    for bigram, untested in ((1.5, False), (0.9, True)):
        meta = {"study": "kv_frontier", "attention_free_level": {"bigram": bigram, "unigram": 2.0}}
        assert report.write_report(tmp_path, meta, draw=False)["frontier"]["untested"] is untested


def test_the_figure_is_drawn(tmp_path):
    data.write_runs(runs_frame({"baseline": (1.0, 2048.0), "mqa": (1.2, 256.0)}), tmp_path / "runs.csv")
    frontier.write(data.read_runs(tmp_path / "runs.csv"), "kv_frontier", 1.5, tmp_path)
    assert (tmp_path / "frontier.png").stat().st_size > 0


@pytest.mark.parametrize("column", ["mem/kv_cache_context", "mem/kv_cache_bytes_per_token"])
def test_a_runs_table_without_the_cache_columns_is_refused_before_anything_is_written(column, tmp_path):
    frame = runs_frame({"baseline": (1.0, 2048.0), "mqa": (1.2, 256.0)}).drop(columns=[column])
    with pytest.raises(SystemExit, match=column):
        frontier.write(frame, "kv_frontier", None, tmp_path)
    assert not list(tmp_path.iterdir())
