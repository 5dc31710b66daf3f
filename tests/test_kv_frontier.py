"""experiment=kv_frontier composes with every arm of its grid: each passes the config checks and
builds a model whose cache holds what the experiment states, at the parameters it states."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from attnlab.attention.module import kv_values_per_token
from attnlab.config import compose_config
from attnlab.config_checks import check_config
from attnlab.model import GPT, GPTConfig
from attnlab.studies.sweep import study_grid

GRID = study_grid("kv_frontier")
# cached values per token and layer (8 heads of 16), and the window's entries at most
CACHE = {"baseline": 256, "gqa_kv4": 128, "gqa_kv2": 64, "mqa": 32, "mla_dc64": 72, "mla_dc32": 40, "window_kept": 256}


@pytest.mark.parametrize("arm", GRID["variant"])
def test_the_experiment_composes_with_every_arm(arm, tmp_path):
    fixed = [f"{key}={values[0]}" for key, values in GRID.items() if key != "variant"]
    cfg = compose_config(["experiment=kv_frontier", *fixed, f"variant={arm}", "debug=smoke"], tmp_path)
    check_config(cfg)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    gpt = GPT(GPTConfig(**{**model, "vocab_size": 64}))
    assert (cfg.study, cfg.model.n_head, cfg.model.block_size, cfg.model.pos_encoding) == ("kv_frontier", 8, 64, "rope")
    assert kv_values_per_token(gpt.cfg.attention, gpt.cfg.n_kv_head, gpt.cfg.d_k) == CACHE[arm]
    attention_parameters = sum(p.numel() for p in gpt.blocks[0].attn.parameters())
    mha = 4 * 128 * 128
    if arm.startswith("mla") or arm in ("baseline", "window_kept"):  # matched: within the latents' norm weights
        assert abs(attention_parameters - mha) <= 300
    else:  # grouped / multi-query: the shared key/value heads' weights are gone
        kv_heads = gpt.cfg.n_kv_head
        assert attention_parameters == 2 * 128 * 128 + 2 * 128 * kv_heads * 16
    if arm == "window_kept":
        assert (gpt.cfg.attention.window, gpt.cfg.attention.window_sinks) == (32, 4)


def test_every_arm_is_in_the_grid():
    assert sorted(GRID["variant"]) == sorted(CACHE)
