"""experiment=kv_frontier composes with every arm of its grid: each passes the config checks and
builds a model whose cache holds what the experiment states, at the parameters it states; the KV
bytes every arm logs are those its cache holds at the run's context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.attention.config import kv_values_per_token
from attnlab.callbacks.peak_memory import PeakMemoryMonitor
from attnlab.config.compose import compose_config
from attnlab.config.schema import Schema
from attnlab.config.study import load_study
from attnlab.model import GPT, GPTConfig

GRID = load_study("kv_frontier").grid
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
