"""The decode section of the bench: KV bytes per token read from the cache tensors equal
2 x layers x n_kv_head x d_k x element size (layers x (d_c + d_rope) x element size for latent attention), the concurrency ceiling follows from them, and every
ratio to multi-head attention is taken within one run's repeats."""

from __future__ import annotations

import json
import statistics

import pytest

from attnlab.tools.bench import decode


@pytest.fixture(scope="module")
def section():
    return decode.decode_section(**decode.DECODE["tiny"], log=lambda _: None)


def test_measured_kv_bytes_equal_the_formula(section):
    rows = section["rows"]
    assert {r["n_kv_head"] for r in rows} == {4, 2, 1}
    for r in rows:
        if r["latent_d_c"] is None:
            per_layer = 2 * r["n_kv_head"] * r["d_k"]
        else:  # the latent and the RoPE key, whatever the heads
            per_layer = r["latent_d_c"] + r["latent_d_rope"]
        formula = r["n_layer"] * per_layer * r["element_size"]
        assert (
            r["kv_bytes_per_token"] == r["kv_bytes_per_token_allocated"] == formula == r["kv_bytes_per_token_formula"]
        )
        # the escape slot stores nothing
        assert r["kv_bytes_ratio_to_mha"] == per_layer / (2 * r["n_head"] * r["d_k"])
        assert r["max_sequences"] == (r["budget_bytes"] - r["weights_bytes"]) // (formula * r["T"])
    # tiny shape: 4 heads of d_k 8; a latent of 4 d_k + d_k / 2 holds 36 values a layer, mha's 64
    mla = next(r for r in rows if r["variant"] == "mla_4dk")
    assert (mla["latent_d_c"], mla["latent_d_rope"], mla["kv_bytes_ratio_to_mha"]) == (32, 4, 36 / 64)


def test_ratios_to_mha_are_taken_within_the_repeats(section):
    setup = section["setup"]
    for T in setup["contexts"]:
        rows = {r["variant"]: r for r in section["rows"] if r["T"] == T}
        assert set(rows) == {
            "mha",
            "gqa",
            "mqa",
            "mla_4dk",
            "mla_2dk",
            "escape_zero_logit",
            "escape_learned",
            "softmax_scaled",
            "sigmoid",
        }
        mha = rows["mha"]
        for r in rows.values():
            assert len(r["decode_s"]) == setup["repeats"]
            pairs = [a / m for a, m in zip(r["decode_s"], mha["decode_s"])]
            assert r["ms_per_token_ratio_to_mha"] == pytest.approx(statistics.median(pairs), rel=1e-12)
            assert r["ms_per_token_ratio_range"] == [min(pairs), max(pairs)]
            for b in map(str, setup["batches"]):
                tp, base = r["throughput"][b], mha["throughput"][b]
                pairs = [a / m for a, m in zip(tp["per_repeat"], base["per_repeat"])]
                assert tp["ratio_to_mha"] == pytest.approx(statistics.median(pairs), rel=1e-12)
        assert mha["ms_per_token_ratio_to_mha"] == 1.0
    assert not section["refused"]


def test_bench_decode_section_lands_in_bench_json_and_md(tmp_path):
    from attnlab.tools.bench.__main__ import main

    assert (
        main(["--mode", "tiny", "--sections", "decode", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)])
        == 0
    )
    bench = json.loads((tmp_path / "bench.json").read_text())
    rows = bench["decode"]["rows"]
    assert rows and all({"n_kv_head", "n_layer", "d_k", "element_size", "kv_bytes_per_token"} <= set(r) for r in rows)
    table = (tmp_path / "bench.md").read_text()
    assert "## Decoding with the KV cache" in table
    assert sum(line.startswith("| mqa |") for line in table.splitlines()) == len(bench["decode"]["setup"]["contexts"])
