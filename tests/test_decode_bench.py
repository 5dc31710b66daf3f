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
            "mla_4dk_expanded",
            "mla_2dk",
            "mla_2dk_expanded",
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
    hf_rows = bench["decode"]["transformers"]["rows"]  # the hf extra is installed wherever the tests run
    assert [r["batch"] for r in hf_rows] == list(decode.DECODE_HF["tiny"]["batches"])
    table = (tmp_path / "bench.md").read_text()
    assert "## Decoding with the KV cache" in table
    main, goal = table.split("Latent attention against its goal")
    setup = bench["decode"]["setup"]
    for variant in ("mqa", "mla_4dk", "mla_2dk_expanded"):  # a row per context, latent arms beside the others
        assert sum(line.startswith(f"| {variant} |") for line in main.splitlines()) == len(setup["contexts"])
        if variant.startswith("mla"):  # and a row per context and batch against the goal
            rows = sum(line.startswith(f"| {variant} |") for line in goal.splitlines())
            assert rows == len(setup["contexts"]) * len(setup["batches"])


def test_latent_arms_decode_in_the_form_they_name(section):
    """The plain latent arms' steps absorb (the caches' auto) and the _expanded arms' re-expand, with the
    same cache bytes per token."""
    for T in section["setup"]["contexts"]:
        rows = {r["variant"]: r for r in section["rows"] if r["T"] == T}
        for arm in ("mla_4dk", "mla_2dk"):
            assert (rows[arm]["latent_path"], rows[f"{arm}_expanded"]["latent_path"]) == ("absorbed", "expanded")
            assert rows[arm]["kv_bytes_per_token"] == rows[f"{arm}_expanded"]["kv_bytes_per_token"]
        assert rows["mha"]["latent_path"] is None


def test_a_rows_roofline_counts_what_a_token_reads_and_computes(section):
    """mha: every weight once over the batch plus the cache; absorbed latent attention drops kv_up and
    reads the folded projections; re-expanding reads the expanded keys and values besides the cache."""
    s = section["setup"]
    elem, layers, h, d = 4, 2, 4, 8  # the tiny shape
    for T in s["contexts"]:
        rows = {r["variant"]: r for r in section["rows"] if r["T"] == T}
        for b in map(str, s["batches"]):
            mha, absorbed, expanded = (rows[v]["throughput"][b] for v in ("mha", "mla_4dk", "mla_4dk_expanded"))
            d_model, vocab = 32, 65
            per_layer = 3 * h * d * d_model + d_model * h * d + 2 * 4 * d_model * d_model  # qkv, out, MLP
            weights = layers * per_layer + vocab * d_model
            assert mha["macs_per_token"] == weights + layers * T * h * 2 * d
            assert mha["bytes_read_per_token"] == pytest.approx(weights * elem / int(b) + layers * T * 2 * h * d * elem)
            d_c, d_rope = 4 * d, d // 2
            attn_absorbed = layers * T * h * 2 * (d_c + d_rope)
            folded = layers * ((h * (d_c + d_rope) + d_c + d_rope) * d_model + d_model * h * d_c)
            assert (
                absorbed["macs_per_token"]
                == weights - layers * (per_layer - 2 * 4 * d_model * d_model) + folded + attn_absorbed
            )
            cache = layers * T * (d_c + d_rope) * elem
            assert expanded["bytes_read_per_token"] - cache - layers * T * h * (2 * d + d_rope) * elem == pytest.approx(
                (expanded["macs_per_token"] - layers * (T * d_c * 2 * h * d + T * h * (2 * d + d_rope))) * elem / int(b)
            )
            for tp in (mha, absorbed, expanded):
                y = s["yardsticks"]
                seconds = (
                    tp["bytes_read_per_token"] / (y["read_gb_per_s"] * 1e9),
                    2 * tp["macs_per_token"] / (y["matmul_gflops"] * 1e9),
                )
                assert tp["roofline_s_per_token"] == max(seconds)
                assert tp["bound"] == ("bytes" if seconds[0] >= seconds[1] else "multiply-adds")


def test_the_goal_table_explains_each_absorbed_row_short_of_its_goal(section):
    """Every absorbed row under its goal gets a line, with its measured ratio; rows at or over it none."""
    import copy

    s = copy.deepcopy(section)
    rows = [r for r in s["rows"] if r["latent_path"] == "absorbed"]
    for i, r in enumerate(rows):  # alternately just under and at the goal
        for b, tp in r["throughput"].items():
            tp["ratio_to_mha"] = decode.latent_goal(r["T"], int(b)) - (0.01 if i % 2 == 0 else 0.0)
    lines = decode.latent_goal_table(s)
    why = [line for line in lines if line.startswith("- ")]
    short = [(r, b) for i, r in enumerate(rows) if i % 2 == 0 for b in r["throughput"]]
    assert len(why) == len(short)
    for line, (r, b) in zip(why, short):
        goal = decode.latent_goal(r["T"], int(b))
        assert line.startswith(
            f"- {r['variant']} at T {r['T']}, B {b}: {goal - 0.01:.2f}x against a goal of {goal:.1f}x"
        )
    assert decode.latent_goal(1024, 1) == decode.latent_goal(2048, 16) == 1.0
    assert decode.latent_goal(512, 1) == decode.latent_goal(2048, 4) == 0.8


# ------------------------------------------------------------------ transformers' generate() beside attnlab


@pytest.fixture(scope="module")
def hf_section():
    pytest.importorskip("transformers")  # the hf extra, which CI installs
    return decode.transformers_section(**decode.DECODE_HF["tiny"], log=lambda _: None)


def test_transformers_rows_decode_the_same_tokens_from_the_same_weights(hf_section):
    setup = hf_section["setup"]
    assert [(r["shape"], r["batch"]) for r in hf_section["rows"]] == [("micro", b) for b in setup["batches"]]
    assert all(r["identical_tokens"] for r in hf_section["rows"])
    assert all(r["logits_equal"] for r in hf_section["rows"])


def test_the_logits_check_tells_the_twin_from_other_weights():
    """transformers' copy computes attnlab's logits; a model with one weight changed does not pass."""
    import torch

    from attnlab.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**decode.HF_SHAPES["micro"], **decode.GPT2_BLOCK)).eval()
    twin = decode.transformers_twin(model)
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, model(ids)[0], **decode.LOGITS_TOLERANCE)
    assert decode.same_logits(model, twin, ids)[1]
    with torch.no_grad():
        twin.transformer.h[1].mlp.c_proj.bias[0] += 0.1  # one channel: LayerNorm would remove a shift of all
    diff, equal = decode.same_logits(model, twin, ids)
    assert not equal and diff > decode.LOGITS_TOLERANCE["atol"]


def test_transformers_ratio_is_taken_within_the_repeats(hf_section):
    setup = hf_section["setup"]
    for r in hf_section["rows"]:
        tps = {arm: [r["batch"] * setup["new_tokens"] / s for s in v] for arm, v in r["seconds"].items()}
        assert [len(v) for v in tps.values()] == [setup["repeats"]] * 2
        pairs = [a / t for a, t in zip(tps["attnlab"], tps["transformers"])]
        assert r["ratio"] == pytest.approx(statistics.median(pairs), rel=1e-12)
        assert r["ratio_range"] == [min(pairs), max(pairs)]
        for arm, v in tps.items():
            assert r["tokens_per_s"][arm] == pytest.approx(statistics.median(v), rel=1e-12)
            assert r["tokens_per_s_range"][arm] == pytest.approx([min(v), max(v)], rel=1e-12)


def test_attnlab_greedy_is_generate_with_top_k_1():
    import torch

    from attnlab.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**decode.HF_SHAPES["micro"], **decode.GPT2_BLOCK)).eval()
    prompt = torch.randint(0, 61, (2, 4), generator=torch.Generator().manual_seed(0))
    assert torch.equal(decode.attnlab_greedy(model, prompt, 9), model.generate(prompt, 9, top_k=1))


def test_any_batch_list_is_measured_latency_at_batch_1_included():
    """Without batch 1 in the list, the latency and cache bytes are still measured at batch 1, and throughput
    only at the batches asked for."""
    section = decode.decode_section(**{**decode.DECODE["tiny"], "contexts": (16,), "batches": (4,)}, log=lambda _: None)
    for r in section["rows"]:
        assert list(r["throughput"]) == ["4"] and r["ms_per_token"] > 0 and r["prefill_s"] > 0
        assert r["kv_bytes_per_token"] == r["kv_bytes_per_token_formula"]
