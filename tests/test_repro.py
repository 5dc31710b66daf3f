"""Tests of attnlab.repro: each measurement on a small case with a known answer, the verdict logic,
the report rendering, and the fast mode end to end."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.repro import equivalence, jacobian, masks, memory, numerics, report, runner, training
from attnlab.repro.verdict import AGREES, DIFFERS, Claim, Table, combine, compare, same_printed, within

FAST_IDS = sorted(set(range(1, 16)) - set(runner.TRAINING_IDS))
KEYS = {"id", "claim", "source", "measured", "verdict", "detail"}


# ---------------------------------------------------------------- verdict logic
def test_compare_agrees_within_tolerance():
    ok, dmax, rel = compare([1.0, 2.0], [1.0004, 1.9996], abs_tol=5e-4)
    assert ok and dmax == pytest.approx(4e-4) and rel == pytest.approx(4e-4)


def test_compare_differs_beyond_tolerance():
    ok, dmax, _ = compare([0.55, 0.20], [0.579, 0.213], abs_tol=0.005)
    assert not ok and dmax == pytest.approx(0.029)


def test_within_never_agrees_with_nan_and_uses_relative_tolerance():
    assert not within(1.0, float("nan"), abs_tol=10)
    assert within(100.0, 104.0, rel_tol=0.05) and not within(100.0, 106.0, rel_tol=0.05)


def test_same_printed_reads_numbers_at_the_source_precision():
    assert same_printed([4.001, 1.040], [4.00149, 1.0398], 3)
    assert not same_printed([4.001], [4.0016], 3)


def test_combine_names_the_failing_parts():
    assert combine({"p1": True, "p2": True}) == (AGREES, "All parts hold")
    v, why = combine({"p1": True, "p2": False, "p3": False})
    assert v == DIFFERS and "p2" in why and "p3" in why and "p1" not in why


def test_claim_rejects_other_verdicts():
    with pytest.raises(ValueError):
        Claim(1, "x", 1, 1, "partly", "")
    assert set(Claim(1, "x", {"a": float("nan")}, 1.23456789, AGREES, "d").to_json()) == KEYS


# ---------------------------------------------------------------- numerics (claims 1-3, 9, 10)
def test_dot_std_follows_sigma_squared_sqrt_d():
    # Var(q.k) = d sigma^4 for independent N(0, sigma^2) components; 20k pairs: ~0.5 % standard error
    assert numerics.dot_std_large_sample(64, 20_000, seed=5, sigma=0.5) == pytest.approx(0.25 * 8, rel=0.03)


def test_dot_std_as_written_scaled_column_is_std_over_sqrt_d():
    rows = numerics.dot_std_as_written(dims=(4, 9), n=50, seed=1)
    for r in rows:
        assert r["scaled_std"] == pytest.approx(r["std"] / math.sqrt(r["d"]))


def test_saturation_with_zero_logits_is_uniform():
    (row,) = numerics.saturation_as_written(ns=(8,), scales=(0.0,), rows=10)
    assert row["max_p"] == pytest.approx(1 / 8)
    assert row["entropy_xlogy"] == pytest.approx(math.log(8), abs=1e-6)
    assert row["entropy"] == pytest.approx(math.log(8), abs=1e-6)  # the +1e-10 is negligible here


def test_saturation_curve_is_monotone_in_logit_scale():
    maxp, hnorm = numerics.saturation_curve(16, [0.0, 1.0, 4.0, 64.0], rows=200)
    assert maxp[0] == pytest.approx(1 / 16) and hnorm[0] == pytest.approx(1.0)
    assert maxp == sorted(maxp) and hnorm == sorted(hnorm, reverse=True) and maxp[-1] > 0.95


def test_unscaled_as_written_reproduces_the_scalar_entropy_bug():
    for r in numerics.unscaled_as_written(dims=(16, 64), n=50, seed=0):
        b = r["max_p_scaled"]
        assert r["entropy"] == pytest.approx(-b * math.log(b), rel=1e-4)  # -b log b, not an entropy
        assert r["uniform"] == pytest.approx(math.log(r["d"]))  # log d, though the softmax has 50 entries


def test_unscaled_corrected_is_a_real_entropy():
    for r in numerics.unscaled_corrected(dims=(16,), n=50, trials=20):
        assert 0 < r["entropy_unscaled"] < r["entropy_scaled"] <= math.log(50) + 1e-9
        assert 1 / 50 <= r["max_p_scaled"] < r["max_p_unscaled"] <= 1


def test_numpy_softmax_matches_the_closed_form():
    p, p11 = numerics.softmax_numpy_as_written()
    e = [math.exp(x) for x in (2.0, 1.0, 0.5, 0.0)]
    assert p.tolist() == pytest.approx([x / sum(e) for x in e])
    assert p11[1] == pytest.approx(math.exp(-11) / (1 + math.exp(-11) + math.exp(-16.5) + math.exp(-22)))


def test_model_logit_std_at_init_is_sigma_q_sigma_k_sqrt_dk():
    r = numerics.model_logit_std(d_k=64)
    sigma = 0.02 * math.sqrt(128)
    assert r["logit_std"] == pytest.approx(sigma**2 * 8, rel=0.15)


# ---------------------------------------------------------------- equivalence (claims 4, 5)
def test_manual_attention_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 2, generator=g, dtype=torch.float64) for _ in range(3))
    out = equivalence.manual_attention(q, k, v, torch.triu(torch.ones(3, 3, dtype=torch.bool), 1))
    for i in range(3):
        s = [float(q[0, 0, i] @ k[0, 0, j]) / math.sqrt(2) for j in range(i + 1)]
        w = [math.exp(x - max(s)) for x in s]
        expect = sum(w[j] / sum(w) * v[0, 0, j] for j in range(i + 1))
        assert torch.allclose(out[0, 0, i], expect)


def test_causality_as_written():
    m = equivalence.equivalence_as_written()
    assert m["diff_before_5"] == 0.0 and m["diff_from_5"] > 1.0 and m["max_diff_sdpa"] < 1e-5


def test_copy_rows_hit_on_a_perfect_copy_map():
    attn = torch.full((8, 8), 0.01)
    for i in range(4, 8):
        attn[i, i - 4] = attn[i, i] = 0.45
    hit = equivalence.copy_rows_hit(attn)
    assert hit["hit_rate"] == 1.0 and hit["source_weight"] == pytest.approx(0.45) and hit["twin_gap"] == 0.0


def test_copy_attention_has_tied_twin_columns():
    attn = equivalence.copy_attention(seed=3)
    assert torch.equal(attn[:, :4], attn[:, 4:]) and torch.allclose(attn.sum(-1), torch.ones(8))


# ---------------------------------------------------------------- masks (claims 7, 11)
def _classify(row, visible, masked=None, unmasked=None, tol=1e-5):
    n = len(row)
    masked = torch.tensor(masked if masked is not None else [1.0 / n] * n, dtype=torch.float64)
    unmasked = torch.tensor(unmasked if unmasked is not None else [0.7] + [0.3 / (n - 1)] * (n - 1), dtype=torch.float64)
    return masks.classify(torch.tensor(row), torch.tensor(visible), masked, unmasked, tol)


def test_classify_names_each_outcome():
    assert _classify([float("nan")] * 4, [False] * 4) == "NaN"
    assert _classify([0.0] * 4, [False] * 4) == "zeros"
    assert _classify([0.25] * 4, [False] * 4) == "uniform"
    assert _classify([0.7, 0.1, 0.1, 0.1], [False] * 4) == "unmasked"
    assert _classify([0.5, 0.5, 0.0, 0.0], [True, True, False, False], masked=[0.5, 0.5, 0, 0]) == "ok"
    assert _classify([0.4, 0.4, 0.2, 0.0], [True, True, False, False], masked=[0.5, 0.5, 0, 0]) == "leak"


def test_mask_grid_measures_the_known_torch_behaviour():
    grid = masks.mask_grid()
    # a row of -inf has no finite max: exp(-inf - (-inf)) = NaN in a plain softmax
    assert masks.lookup(grid, path="explicit softmax", dtype="fp32", fill="-inf", row="full") == "NaN"
    # equal fills everywhere -> exp(0) for each key -> uniform
    assert masks.lookup(grid, path="explicit softmax", dtype="bf16", fill="-1e9", row="full") == "uniform"
    assert all(g["outcome"] == "ok" for g in grid if g["row"] == "partial" and g["outcome"] != "error")
    errors = [g for g in grid if g["outcome"] == "error"]
    assert errors and all(g["fill"] == "-1e9" and g["dtype"] == "fp16" and "overflow" in g["message"] for g in errors)
    assert len(grid) == 2 * 3 * (4 + 5 + 5)  # rows x dtypes x (explicit fills + SDPA fills incl. bool mask)


# ---------------------------------------------------------------- memory (claims 6, 14, 15)
def test_cpu_peak_bytes_sees_live_tensors_only():
    def two_alive():
        a = torch.ones(250_000)  # 1 MB
        b = torch.ones(250_000)
        return a, b

    def one_at_a_time():
        for _ in range(3):
            torch.ones(250_000)

    assert 2_000_000 <= memory.cpu_peak_bytes(two_alive) < 2_100_000
    assert 1_000_000 <= memory.cpu_peak_bytes(one_at_a_time) < 1_100_000


def test_naive_attention_peak_holds_the_t_by_t_matrix():
    t, h = 256, 2
    peak = memory.cpu_peak_bytes(memory.attention_step("naive", t, d=8, heads=h))
    assert peak >= memory.attention_matrix_bytes(1, h, t, 4)
    assert memory.cpu_peak_bytes(memory.attention_step("flash", t, d=8, heads=h)) < memory.attention_matrix_bytes(1, h, t, 4)


def test_memory_arithmetic():
    assert memory.attention_matrix_bytes(2, 32, 4096, 2) == 2 * 32 * 4096 * 4096 * 2
    assert memory.loglog_slope([1, 2, 4, 8], [3, 12, 48, 192]) == pytest.approx(2.0)
    assert memory.hbm_flash(1024, 64, 4096) == pytest.approx(1024**2 * 64**2 / 4096)


# ---------------------------------------------------------------- jacobian (claim 8)
def test_jacobian_of_uniform_and_one_hot():
    n = 5
    j = jacobian.softmax_jacobian(torch.full((n,), 1 / n, dtype=torch.float64))
    # diag(p) - pp^T for uniform p = (I - 11^T/n)/n: eigenvalues 1/n (n-1 times) and 0
    assert torch.linalg.matrix_norm(j, "fro") == pytest.approx(math.sqrt(n - 1) / n)
    assert torch.count_nonzero(jacobian.softmax_jacobian(torch.tensor([0.0, 1.0, 0.0]))) == 0


def test_jacobian_shrinks_with_logit_std():
    rows = jacobian.jacobian_vs_logit_std([0.0, 1.0, 16.0], n=8, rows=200)
    assert rows[0]["jac_fro"] == pytest.approx(math.sqrt(7) / 8) and rows[0]["jac_spec"] == pytest.approx(1 / 8)
    # not monotone from uniform (two equal entries maximise ||J||_F), but it vanishes as p -> one-hot
    assert rows[2]["jac_fro"] < rows[1]["jac_fro"] / 3 and rows[2]["grad_norm"] < rows[1]["grad_norm"] / 3


# ---------------------------------------------------------------- training helpers (claims 8, 12, 13)
def test_head_scores_on_hand_made_maps():
    t = 8
    prev = torch.zeros(1, 3, t, t)
    prev[0, 0, 0, 0] = 1
    prev[0, 0, torch.arange(1, t), torch.arange(t - 1)] = 1  # head 0: previous token
    prev[0, 1, :, 0] = 1  # head 1: sink
    prev[0, 2] = torch.eye(t)  # head 2: self
    ind = torch.zeros(1, 3, 6, 6)
    rows = torch.arange(3, 6)
    ind[0, 2, rows, rows - 3 + 1] = 1  # head 2: induction on a length-3 sequence repeated
    s = training.head_scores(prev, ind, half=3)
    assert s["prev"].tolist() == [1.0, pytest.approx(1 / (t - 1)), 0.0]  # the sink head's query 1 also hits i-1 = 0
    assert s["sink"].tolist() == [pytest.approx(2 / t), 1.0, pytest.approx(1 / t)]  # queries 0 and 1 of head 0 look at 0
    assert s["induction"].tolist() == [0.0, 0.0, 1.0]
    kinds = training.classify_heads([s])[0]
    assert kinds == {"positional": [0], "induction": [2], "sink": [1]}


def test_uniform_sink_mass_and_progress_ratio():
    assert training.uniform_sink_mass(2) == 0.5 and training.uniform_sink_mass(3) == pytest.approx((1 / 2 + 1 / 3) / 2)
    run = lambda a, b: {"init": {"loss": a}, "final": {"loss": b}}  # noqa: E731
    assert training.progress_ratio(run(4.0, 3.0), run(4.0, 2.0)) == pytest.approx(0.5)


@pytest.mark.slow
def test_train_run_keeps_both_models_and_probes_them(tmp_path):
    run = training.train_run("t", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "data.batch_size=2"], 3, tmp_path)
    assert run.metrics["step"] == 3
    assert any(not torch.equal(a, b) for a, b in zip(run.init.state_dict().values(), run.final.state_dict().values()))
    s = training.summarize(run, training.probe_batches(n=1))
    assert len(s["final"]["grad"]["q"]) == 1 and s["final"]["grad"]["qk_mean"] > 0 and len(s["init"]["sink_mass"]) == 1


# ---------------------------------------------------------------- reports
def _result(i, v):
    return {"id": i, "claim": f"claim {i}", "source": 1, "measured": 2, "verdict": v, "detail": f"detail {i}. Failing: x."}


def test_readme_section_sorts_claims_into_right_and_wrong():
    md = report.readme_section([_result(2, DIFFERS), _result(1, AGREES)])
    assert md.startswith(report.README_TITLE)
    right, wrong = md.split("**Wrong or only partly right:**")
    assert "**1. claim 1.**" in right and "**2. claim 2.**" in wrong and "Failing" not in md


def test_table_md_escapes_pipes():
    md = report.table_md(Table("t", ["max |d|"], [["a|b"]], note="n"))
    assert "max \\|d\\|" in md and "a\\|b" in md and "_n_" in md


def test_fast_pipeline_in_process_writes_every_fast_id(tmp_path, monkeypatch):
    small = dict(samples=2000, trials=5, copy_trials=10, mem_ts=(32, 64), jac_rows=50, training=False)
    monkeypatch.setitem(runner.MODES, "fast", small)
    claims = runner.main("fast", tmp_path, log=lambda m: None)
    assert [c.id for c in claims] == FAST_IDS
    results = json.loads((tmp_path / "repro.json").read_text())
    assert [r["id"] for r in results] == FAST_IDS
    assert all(set(r) == KEYS and r["verdict"] in (AGREES, DIFFERS) for r in results)
    md = (tmp_path / "repro.md").read_text()
    assert all(f"## Claim {i}" in md for i in FAST_IDS) and "## Claim 8" not in md
    assert (tmp_path / "README_section.md").read_text().startswith(report.README_TITLE)
    for png in ("saturation.png", "dot_std.png", "memory.png"):
        assert (tmp_path / png).stat().st_size > 1000


@pytest.mark.slow
def test_cli_fast_mode_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnlab.repro", "--mode", "fast", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(Path(tmp_path, "repro.json").read_text())
    assert [r["id"] for r in results] == FAST_IDS
    assert all(set(r) == KEYS and r["verdict"] in (AGREES, DIFFERS) for r in results)
    assert (tmp_path / "repro.md").exists() and (tmp_path / "README_section.md").exists()
