"""attnlab.tools.bench: the FLOP count, the exponent fit, the peak-memory probe, pairing, and the CLI's bench.json."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from attnlab.config.compose import compose_config
from attnlab.tools.bench import attention_flops, longctx, median_and_range, paired_ratios, throughput
from attnlab.tools.bench import kernels as kernels_mod
from attnlab.tools.bench.__main__ import main as bench_main
from attnlab.tools.bench.bench_report import (
    VERDICT_CELLS,
    longctx_outcome,
    longctx_table,
    longctx_verdict,
    memory_summary,
    write_json,
    write_markdown,
    write_plots,
)
from attnlab.tools.bench.breakdown import breakdown
from attnlab.tools.bench.endtoend import alternated, plain_spec, run_attnlab, run_plain
from attnlab.tools.bench.kernels import KernelPlan, bench_one, kernel_variants, run_kernels
from attnlab.tools.bench.longctx import LongctxPlan, run_overrides, run_settings, summarize
from attnlab.tools.bench.phase_rows import EXPECTED
from attnlab.tools.bench.phase_rows import rows as phase_rows
from attnlab.tools.bench.throughput import callback_intervals, representative_window, seconds_per_step
from attnlab.tools.bench.timing import against_target, measure
from attnlab.training import phases
from attnlab.util.errors import KernelUnavailable
from attnlab.util.profiling import fit_exponent, peak_bytes

BACKENDS = ("naive", "scaled", "sdpa", "flash")
KERNEL_FIELDS = ("backend", "T", "fwd_ms", "fwd_bwd_ms", "peak_bytes", "gflops")
TRAIN_FIELDS = ("backend", "lightning_tokens_per_s", "plain_tokens_per_s", "ratio", "ratio_to_scaled")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def multiply_adds(batch, heads, t, d, causal):
    """Count multiply-adds of QK^T and PV one query at a time (causal: query i sees i+1 keys)."""
    per_query = [(i + 1 if causal else t) for i in range(t)]
    return batch * heads * sum(2 * keys * d for keys in per_query)  # QK^T row + PV row


@pytest.mark.parametrize("t,d", [(16, 8), (64, 64), (100, 32)])
def test_attention_flops_matches_counted_work(t, d):
    b, h = 2, 3
    assert attention_flops(b, h, t, d, causal=False) == 2 * multiply_adds(b, h, t, d, causal=False)
    # the causal count is the usual T^2/2 convention; the exact count has T(T+1)/2 visible pairs
    exact = 2 * multiply_adds(b, h, t, d, causal=True)
    assert attention_flops(b, h, t, d, causal=True) == pytest.approx(exact * t / (t + 1))
    assert attention_flops(b, h, t, d, causal=True, backward=True) == pytest.approx(3.5 * attention_flops(b, h, t, d))


def test_fit_exponent_recovers_known_powers():
    xs = [256, 512, 1024, 4096]
    assert fit_exponent(xs, [3.0 * x**2 for x in xs]) == pytest.approx(2.0)
    assert fit_exponent(xs, [0.5 * x**1.25 for x in xs]) == pytest.approx(1.25)
    # a constant plus a quadratic: the slope lies between 0 and 2 and rises with the quadratic's weight
    low = fit_exponent(xs, [1e7 + x**2 for x in xs])
    high = fit_exponent(xs, [1e5 + x**2 for x in xs])
    assert 0 < low < high < 2
    assert math.isnan(fit_exponent([1024], [5.0]))


def test_memory_summary_exponent_and_ratio():
    rows = [
        {"backend": b, "T": t, "peak_bytes": c * t**p}
        for b, c, p in (("naive", 16, 2), ("sdpa", 1000, 1))
        for t in (256, 1024, 2048, 8192)
    ]
    s = memory_summary(rows)
    assert s["memory_exponent"]["naive"] == pytest.approx(2.0)
    assert s["memory_exponent"]["sdpa"] == pytest.approx(1.0)
    assert s["memory_ratio_8192_1024"] == {"naive": pytest.approx(64.0), "sdpa": pytest.approx(8.0)}
    assert s["memory_fit_T"]["naive"] == [1024, 8192]  # the asymptotic range only


def test_cpu_peak_bytes_sums_allocations_in_time_order():
    existing = torch.ones(1 << 20, dtype=torch.uint8)  # allocated before: not part of the peak

    def work():
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(1 << 19, dtype=torch.uint8)
        del a
        c = torch.empty(1 << 18, dtype=torch.uint8)
        return b, c

    assert peak_bytes(work) == (1 << 20) + (1 << 19)
    assert existing.numel() == 1 << 20


FREE_EARLIER_BLOCK = """
import sys, torch
from attnlab.util.profiling import PeakMemory, UNKNOWN_BLOCK
from torch.profiler import ProfilerActivity, profile
earlier = torch.ones(1 << 16)
if sys.argv[1] == "raw":
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        del earlier
else:
    with PeakMemory("cpu") as mem:
        del earlier
        print("line of the step", file=sys.stderr)
        x = torch.ones(1 << 10)
    print(mem.peak_bytes)
"""


@pytest.mark.parametrize("window", ["raw", "peak_memory"])
def test_a_freed_earlier_block_logs_only_outside_the_peak_memory_window(window):
    """Freeing a tensor from before the window makes c10 log a line to fd 2 (once per process): the raw profiler
    lets it through, PeakMemory drops that line and keeps the step's own stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", FREE_EARLIER_BLOCK, window], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    from attnlab.util.profiling import UNKNOWN_BLOCK

    if window == "raw":
        assert proc.stderr.count(UNKNOWN_BLOCK) == 1
    else:
        assert UNKNOWN_BLOCK not in proc.stderr and proc.stderr.splitlines() == ["line of the step"]
        assert int(proc.stdout) == 4 * (1 << 10)  # the window's own allocation; the earlier block's free is not seen


def test_explicit_attention_peak_holds_the_matrix_and_sdpa_does_not():
    plan = KernelPlan((), (2048,), batch=1, heads=4, head_dim=64)
    variants = kernel_variants(torch.device("cpu"))
    rows = {b: bench_one(b, variants[b], 2048, plan, torch.device("cpu"), timed=False) for b in ("scaled", "sdpa")}
    matrix = 4 * 2048 * 2048 * 4  # H x T x T fp32
    assert rows["scaled"]["peak_bytes"] >= 2 * matrix  # logits and probabilities at least
    assert rows["sdpa"]["peak_bytes"] < matrix / 2
    assert rows["sdpa"]["kernel"].startswith("sdpa:")


def test_bench_one_times_in_milliseconds_against_an_independent_clock():
    """The row's fwd+bwd time, in ms, agrees with a plain perf_counter timing of the same work (a units
    or bookkeeping slip is off by 1000x or more), and backward adds time to the forward."""
    t = 512
    plan = KernelPlan((t,), (), repeats=3, warmup=1, min_sample_s=0.0)
    kernel = kernel_variants(torch.device("cpu"))["scaled"]
    row = bench_one("scaled", kernel, t, plan, torch.device("cpu"), timed=True)
    q, k, v = (torch.randn(1, 4, t, 64, requires_grad=True) for _ in range(3))
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        kernel(q, k, v, 0.125)[0].sum().backward()
        samples.append((time.perf_counter() - t0) * 1e3)
    independent_ms = sorted(samples)[1]
    assert independent_ms / 4 < row["fwd_bwd_ms"] < independent_ms * 4, (row["fwd_bwd_ms"], independent_ms)
    assert row["fwd_bwd_ms"] > row["fwd_ms"]
    assert row["fwd_peak_bytes"] < row["peak_bytes"]  # backward keeps the probabilities and their gradient


def test_explicit_kernels_memory_grows_quadratically_in_T():
    plan = KernelPlan((), (128, 256, 512), batch=1, heads=2, head_dim=16)
    rows = [
        r for r in run_kernels(plan, torch.device("cpu"), log=lambda line: None) if r["backend"] in ("naive", "scaled")
    ]
    for backend in ("naive", "scaled"):
        peaks = [r["peak_bytes"] for r in sorted(rows, key=lambda r: r["T"]) if r["backend"] == backend]
        assert peaks[0] < peaks[1] < peaks[2], (backend, peaks)
        assert peaks[2] / peaks[1] > 3, (backend, peaks)  # a T x T matrix: about 4x per doubling


def test_run_kernels_records_failures_and_stops_growing(monkeypatch):
    def grows_out_of_memory(q, k, v, scale, causal=True):
        if q.shape[-2] >= 64:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return q.clone(), "fake"

    def unavailable(q, k, v, scale, causal=True):
        raise KernelUnavailable("not on this device")

    monkeypatch.setattr(
        kernels_mod, "kernel_variants", lambda device: {"oom": grows_out_of_memory, "none": unavailable}
    )
    plan = KernelPlan((32, 64, 128), (), repeats=5, warmup=1, min_sample_s=0.0)
    rows = {(r["backend"], r["T"]): r for r in run_kernels(plan, torch.device("cpu"), log=lambda line: None)}
    assert rows[("oom", 32)]["error"] is None and rows[("oom", 32)]["kernel"] == "fake"
    assert rows[("oom", 64)]["error"] == "out of memory"
    assert rows[("oom", 128)]["error"].startswith("skipped") and rows[("oom", 128)]["peak_bytes"] is None
    assert all(rows[("none", t)]["error"] == "not on this device" for t in (32, 64, 128))


def test_paired_ratios_and_summary():
    s = paired_ratios([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 2.0, 3.0, 3)
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])
    assert median_and_range([5.0, 1.0, 3.0, 100.0, 2.0])["median"] == 3.0


def test_measure_batches_short_calls():
    calls = []
    samples = measure(lambda: calls.append(1), torch.device("cpu"), repeats=5, warmup=1, min_sample_s=0.001)
    assert len(samples) == 5
    assert len(calls) > 6  # a call far shorter than 1 ms is repeated within each sample


def test_seconds_per_step_skips_warmup():
    assert seconds_per_step([0.0, 10.0, 11.0, 13.0], warmup=2) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        seconds_per_step([0.0, 1.0], warmup=2)


def test_representative_window_is_the_common_period():
    assert representative_window({"a": 10, "b": 100, "c": 250, "d": 500, "e": 1000, "f": 1}, cap=2000) == 1000
    assert representative_window({"a": 7, "b": 11}, cap=2000) == 77
    assert representative_window({"a": 999, "b": 1000}, cap=2000) == 1000  # lcm too long: the longest interval


def test_callback_intervals_come_from_the_composed_config():
    intervals = callback_intervals(compose_config(["callbacks=default"]))
    assert intervals and all(v > 0 for v in intervals.values())
    window = representative_window(intervals, cap=10**9)
    assert all(window % v == 0 for v in intervals.values())
    assert callback_intervals(compose_config(["callbacks=none"])) == {}


def synthetic_bench():
    kernels = [
        {
            "backend": b,
            "T": t,
            "kernel": "eager",
            "fwd_ms": 1.0,
            "fwd_ms_range": [0.9, 1.1],
            "fwd_bwd_ms": 3.0,
            "fwd_bwd_ms_range": [2.9, 3.2],
            "fwd_gflops": 10.0,
            "gflops": 12.0,
            "peak_bytes": t**2,
            "fwd_peak_bytes": t,
            "error": None,
        }
        for b in BACKENDS
        for t in (1024, 8192)
    ]
    kernels.append({"backend": "naive", "T": 16384, "kernel": None, "error": "out of memory", "peak_bytes": None})
    bench = {
        "mode": "tiny",
        "wall_s": 1.0,
        "machine": {
            "device": "cpu",
            "cpu": "x",
            "threads": 1,
            "torch": "t",
            "load_before": [1.0, 1, 1],
            "load_after": [float("nan")],
            "matmul_gflops": 50.0,
            "matmul_gflops_range": [40.0, 60.0],
            "matmul_n": 512,
            "matmul_dtype": "float32",
        },
        "kernel_setup": {"batch": 1, "heads": 4, "head_dim": 64, "dtype": "float32", "repeats": 5},
        "kernels": kernels,
        "train": [],
        "callbacks": {"overhead_ratio": 1.02, "representative": True},
    }
    bench.update(memory_summary(kernels))
    return bench


def test_report_files(tmp_path):
    bench = synthetic_bench()
    data = json.loads(write_json(bench, tmp_path).read_text())
    assert data["machine"]["load_after"] == [None]  # NaN becomes null, the file stays valid JSON
    md = write_markdown(bench, tmp_path).read_text()
    assert "| naive | eager | 8192 |" in md and "out of memory" in md and "1.020" in md
    for png in write_plots(bench, tmp_path):
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 200_000


def test_a_run_of_other_sections_only_reports_no_kernels(tmp_path):
    """``--sections e2e`` alone measures no kernels: bench.md has no empty Kernels table and no links
    to plots it did not draw."""
    md = write_markdown(synthetic_bench() | {"kernels": []}, tmp_path).read_text()
    assert "## Kernels" not in md and "time_vs_T.png" not in md and "## Memory scaling" not in md
    assert "Matmul yardstick" in md and "## Callback cost" in md


def _e2e_row(arm: str, walls: list[tuple[float, float]]) -> dict:
    ratios = [a / p for a, p in walls]
    sample = {"median_step_s": 0.03, "val_loss": 1.87}
    return {
        "arm": arm,
        "overrides": [],
        "steps": 10,
        "attnlab_wall_s": 1.0,
        "attnlab_wall_range": [1.0, 1.0],
        "plain_wall_s": 1.0,
        "plain_wall_range": [1.0, 1.0],
        "wall_ratio": sorted(ratios)[len(ratios) // 2],
        "wall_ratio_range": [min(ratios), max(ratios)],
        "step_ratio": 1.0,
        "step_ratio_range": [1.0, 1.0],
        "attnlab_step_ms": 30.0,
        "plain_step_ms": 30.0,
        "val_loss": {"attnlab": [1.87], "plain": [1.87]},
        "samples": {
            "attnlab": [sample | {"wall_s": a} for a, _ in walls],
            "plain": [sample | {"wall_s": p} for _, p in walls],
        },
    }


def test_the_end_to_end_section_lists_every_pair_and_reads_the_target_with_their_spread(tmp_path):
    """bench.md states each pair (make train / plain seconds and their ratio, in run order) and per arm whether
    the pairs are within the target: yes only when all are, no when none is, open when they straddle it."""
    e2e = {
        "repeats": 3,
        "rows": [
            _e2e_row("inside", [(100.0, 100.0), (102.0, 100.0), (99.0, 100.0)]),
            _e2e_row("straddles", [(104.0, 100.0), (107.0, 100.0), (101.0, 100.0)]),
            _e2e_row("outside", [(110.0, 100.0), (106.0, 100.0), (120.0, 100.0)]),
        ],
        "load": [[1.0]],
    }
    md = write_markdown(synthetic_bench() | {"e2e": e2e}, tmp_path).read_text().split("## End to end")[1]
    rows = {line.split(" ")[1]: line for line in md.splitlines() if line.startswith("| ") and "(`" in line}
    assert [r.rsplit("|", 2)[1].strip() for r in rows.values()] == ["yes", "open", "**no**"]
    pairs = [line for line in md.splitlines() if line.startswith("- ")]
    assert pairs[1] == "- straddles: 104.0 / 100.0 (1.040), 107.0 / 100.0 (1.070), 101.0 / 100.0 (1.010)"
    assert len(pairs) == 3 and all(line.count("(") == 3 for line in pairs)


def test_cli_kernels_only(tmp_path, capsys):
    assert bench_main(["--mode", "tiny", "--out", str(tmp_path), "--device", "cpu", "--sections", "kernels"]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {r["backend"] for r in data["kernels"]} == set(BACKENDS)
    assert data["machine"]["matmul_gflops"] > 0
    assert all(r["peak_fraction"] == pytest.approx(r["gflops"] / r["matmul_gflops"]) for r in data["kernels"])
    assert [r["backend"] for r in data["kernels"][:4]] == list(BACKENDS)  # backends alternate within each T
    assert set(data["memory_exponent"]) == set(BACKENDS)
    assert (tmp_path / "time_vs_T.png").exists() and (tmp_path / "memory_vs_T.png").exists()


def test_a_merge_that_keeps_the_kernels_reports_its_own_threads_load_and_yardstick(tmp_path):
    """--merge without the kernels section keeps the earlier run's "machine" (the kernels' yardstick):
    the header must still say what the rerun sections ran on (``merged.now``, ``merged.load``), and
    the earlier run's figures only beside the kept sections."""
    bench = synthetic_bench()
    bench["merged"] = {
        "kept_from": "earlier",
        "rerun": ["e2e"],
        "kept": ["kernels"],
        "previous_load": [[0.8], [1.0]],
        "now": {
            "threads": 2,
            "matmul_gflops": 93.1,
            "matmul_gflops_range": [88.6, 95.2],
            "matmul_n": 2048,
            "matmul_dtype": "float32",
        },
        "load": [[1.9, 1, 1], [2.2, 1, 1]],
    }
    header = write_markdown(bench, tmp_path).read_text().split("## Kernels")[0]
    assert "2 thread(s)" in header and "load average 1.90 before, 2.20 after" in header
    assert "Matmul yardstick (this run): 2048x2048 float32 matmul, median 93.1 GFLOP/s (range 88.6-95.2)" in header
    assert (
        "kept from the run of earlier (`--merge`), load average 0.80 at its start, 1 thread(s), matmul yardstick "
        "50.0 GFLOP/s there." in header
    )


def test_cli_merge_keeps_sections_not_rerun(tmp_path):
    kept_train = [
        {
            "backend": b,
            "lightning_tokens_per_s": 1.0,
            "plain_tokens_per_s": 1.0,
            "ratio": 1.0,
            "ratio_to_scaled": 1.0,
            "setup": {
                "batch_size": 1,
                "block_size": 1,
                "tokens_per_step": 1,
                "precision": "32",
                "steps": 2,
                "warmup_steps": 1,
                "repeats": 5,
            },
        }
        for b in BACKENDS
    ]
    (tmp_path / "bench.json").write_text(
        json.dumps({"created": "before", "train": kept_train, "kernels": [], "callbacks": {"overhead_ratio": 1.5}})
    )
    assert (
        bench_main(["--mode", "tiny", "--out", str(tmp_path), "--device", "cpu", "--sections", "kernels", "--merge"])
        == 0
    )
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["train"] == kept_train and data["callbacks"] == {"overhead_ratio": 1.5}
    assert {r["backend"] for r in data["kernels"]} == set(BACKENDS)  # the rerun section is new
    assert data["merged"]["kept_from"] == "before"
    assert data["merged"]["measured"] == {"train": "before", "callbacks": "before"}


def test_a_merge_of_a_merge_names_the_run_that_measured_each_kept_section(tmp_path):
    """Kernels from a first run, e2e rerun later, then decode rerun: the header names the first run for
    the kernels and the second for e2e, not the file each was last kept in."""
    from attnlab.tools.bench.__main__ import merge_previous

    prior = {
        "created": "second",
        "kernels": [{"T": 1}],
        "e2e": {"pairs": 1},
        "merged": {"kept_from": "first", "rerun": ["e2e"], "kept": ["kernels"]},
    }
    (tmp_path / "bench.json").write_text(json.dumps(prior))
    merged = merge_previous({"decode": {}}, tmp_path, ["decode"])["merged"]
    assert merged["measured"] == {"kernels": "first", "e2e": "second"}
    (tmp_path / "bench.json").write_text(json.dumps({**prior, "merged": merged, "created": "third"}))
    again = merge_previous({}, tmp_path, ["train"])["merged"]
    assert again["measured"] == {"kernels": "first", "e2e": "second"}  # decode was empty: nothing kept
    bench = synthetic_bench()
    bench["merged"] = {**merged, "previous_load": [[0.8], [1.0]]}
    header = write_markdown(bench, tmp_path).read_text().split("## Kernels")[0]
    assert "Sections kernels are kept from the run of first, e2e from the run of second (`--merge`)" in header


def test_default_out_is_the_committed_bench_only_for_what_it_holds():
    from attnlab.tools.bench.__main__ import COMMITTED, SECTIONS, default_out

    assert default_out("full", list(SECTIONS), merge=False) == COMMITTED
    assert default_out("full", ["longctx"], merge=True) == COMMITTED
    assert default_out("breakdown", [], merge=False) == COMMITTED
    beside = [
        default_out("fast", list(SECTIONS), merge=False),
        default_out("fast", ["decode"], merge=True),
        default_out("tiny", list(SECTIONS), merge=False),
        default_out("full", ["decode"], merge=False),
        default_out("breakdown", [], merge=False, overrides=["attention=sdpa"]),
    ]
    assert len(set(beside)) == 4 and all(p.parent == COMMITTED for p in beside)


def test_a_fast_bench_leaves_the_committed_bench_as_it_is(tmp_path, monkeypatch, capsys):
    """`make bench BENCH=fast` with no --out, every section's runner stubbed: its files land in reports/bench/fast/,
    the committed reports/bench/ keeps its bytes, and the console names the directory it wrote."""
    from attnlab.tools.bench import __main__ as bench_cli

    monkeypatch.chdir(tmp_path)
    committed = tmp_path / "reports" / "bench"
    committed.mkdir(parents=True)
    (committed / "bench.json").write_text('{"mode": "full"}')
    (committed / "bench.md").write_text("full bench")
    monkeypatch.setattr(bench_cli, "longctx_plan", lambda args, device: None)
    monkeypatch.setattr(bench_cli, "run_kernels", lambda plan, device: [])
    monkeypatch.setattr(bench_cli, "train_throughput", lambda *a, **k: [])
    monkeypatch.setattr(bench_cli, "callback_overhead", lambda **k: {})
    monkeypatch.setattr(bench_cli, "end_to_end", lambda arms, **k: {})
    monkeypatch.setattr(bench_cli, "long_context", lambda plan, on_progress: {})
    monkeypatch.setattr(bench_cli, "compile_throughput", lambda **k: [])
    monkeypatch.setattr(bench_cli, "decode_section", lambda **k: {})
    monkeypatch.setattr(bench_cli, "latent_train_section", lambda **k: {})

    assert bench_cli.main(["--mode", "fast", "--device", "cpu"]) == 0
    fast = committed / "fast"
    assert json.loads((fast / "bench.json").read_text())["mode"] == "fast" and (fast / "bench.md").is_file()
    assert json.loads((committed / "bench.json").read_text()) == {"mode": "full"}
    assert (committed / "bench.md").read_text() == "full bench"
    assert sorted(p.name for p in committed.iterdir()) == ["bench.json", "bench.md", "fast"]
    assert str(Path("reports/bench/fast")) in capsys.readouterr().out


def test_cli_rejects_unknown_section(tmp_path, capsys):
    assert bench_main(["--out", str(tmp_path), "--sections", "kernels,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err


def check_bench_json(data: dict, full_memory: bool) -> None:
    assert data["machine"]["matmul_gflops"] > 0 and data["machine"]["threads"] >= 1
    assert {r["backend"] for r in data["kernels"]} >= set(BACKENDS)
    for row in data["kernels"]:
        assert all(k in row for k in KERNEL_FIELDS), row
        if row["timed"]:
            assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and row["gflops"] > 0 and row["peak_bytes"] > 0
    for backend in BACKENDS:
        assert math.isfinite(data["memory_exponent"][backend])
        assert backend in data["memory_ratio_8192_1024"]
        if full_memory:
            assert data["memory_ratio_8192_1024"][backend] > 1
    assert {r["backend"] for r in data["train"]} == set(BACKENDS)
    for row in data["train"]:
        assert all(row[k] is not None and row[k] > 0 for k in TRAIN_FIELDS[1:]), row
        tokens = row["setup"]["tokens_per_step"]
        assert len(row["lightning_samples"]) == len(row["plain_samples"]) == row["setup"]["repeats"]
        # tokens/s, not steps/s or ms: a tiny-preset step on CPU takes between 0.1 ms and 10 s
        assert all(tokens / 10 < v < tokens * 1e4 for v in row["lightning_samples"] + row["plain_samples"]), row
    cb = data["callbacks"]
    samples = cb["step_s_samples"]
    assert len(samples["with"]) == len(samples["without"]) == len(samples["plain"]) == cb["repeats"]
    assert all(0 < v < 10 for vs in samples.values() for v in vs)  # seconds per step


def test_cli_tiny_writes_every_field(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.tools.bench",
            "--mode",
            "tiny",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--sections",
            "kernels,train,callbacks",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    check_bench_json(json.loads((tmp_path / "bench.json").read_text()), full_memory=False)
    assert "USDT" not in run.stderr  # the profiler's start/stop chatter is silenced
    assert (tmp_path / "bench.md").read_text().startswith("# attnlab benchmarks")


@pytest.mark.slow
def test_cli_fast_writes_every_field(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.tools.bench",
            "--mode",
            "fast",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--sections",
            "kernels,train,callbacks",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    check_bench_json(data, full_memory=False)  # fast measures memory up to T = 4096
    assert data["memory_fit_T"]["scaled"] == [1024, 4096]
    assert data["memory_exponent"]["scaled"] > 1.6 and data["memory_exponent"]["sdpa"] < 1.3


MICRO = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.block_size=16", "data.batch_size=4"]


class Sleep(L.Callback):
    """A known cost: 30 ms in every training batch's end hook."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(0.03)


@pytest.mark.slow  # timed: on a shared machine the step-time difference is at the mercy of the load
def test_callback_overhead_measures_a_known_cost(monkeypatch):
    """A callback that sleeps 30 ms per step: the step times with and without differ by about that,
    the hook timer attributes it to that callback, and the plain loop is faster than both."""
    monkeypatch.setattr(
        throughput, "compose_config", lambda overrides, out=None: compose_config([*overrides, *MICRO], out)
    )
    monkeypatch.setattr(throughput, "build_callbacks", lambda blocks: [Sleep()] if blocks else [])
    cb = throughput.callback_overhead(steps=6, warmup=2, repeats=2, device=torch.device("cpu"), log=lambda line: None)
    extra_ms = cb["step_ms_with"] - cb["step_ms_without"]
    assert 25 < extra_ms < 60, cb
    assert 25 < cb["hook_ms_per_step"]["Sleep"] < 60, cb
    assert cb["ratio_to_plain"] > cb["none_ratio_to_plain"] and cb["ratio_to_plain"] > 1.5, cb


def test_recorder_counts_nested_time_once():
    now = [0.0]
    rec = phases.Recorder(clock=lambda: now[0])
    with rec.phase("outer"):
        now[0] += 1.0
        with rec.phase("inner"):
            now[0] += 2.0
            with rec.phase("innermost"):
                now[0] += 4.0
        with rec.phase("inner"):
            now[0] += 8.0
        now[0] += 16.0
    assert rec.seconds == {"outer": 17.0, "inner": 10.0, "innermost": 4.0}
    assert rec.inclusive == {"outer": 31.0, "inner": 14.0, "innermost": 4.0}
    assert rec.calls == {"outer": 1, "inner": 2, "innermost": 1}
    assert sum(rec.seconds.values()) == now[0] == rec.data()["span_s"]
    rec.begin("hook")
    rec.begin("left open by a hook that raised")
    now[0] += 1.0
    rec.end("hook")  # closes what it holds first
    rec.end("never begun")
    assert rec.calls["hook"] == rec.calls["left open by a hook that raised"] == 1 and not rec._stack


def test_phases_cost_nothing_unless_recording():
    assert phases.recorder() is None  # tests run with the recorder off
    assert phases.phase("anything") is phases.phase("else")  # one shared no-op
    assert phases.lightning_profiler() is None


def patched_by_name(cfg) -> dict:
    """The attributes a breakdown would have to replace to time a run from outside: each must stay the same object."""
    import wandb
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop

    from attnlab.data.text import ResumableDataModule, TextDataModule
    from attnlab.training import loggers, results
    from attnlab.training import train as train_mod
    from attnlab.training.interrupt import GracefulInterrupt
    from attnlab.training.lit_module import GPTModule

    named = {
        train_mod: ("train", "check_kernel_runs", "build_callbacks"),
        loggers: ("start_experiments",),
        results: ("source_commit",),
        results.RunRecord: ("__init__", "finish"),
        GPTModule: (
            "__init__",
            "training_step",
            "backward",
            "configure_gradient_clipping",
            "optimizer_step",
            "on_train_batch_start",
            "on_train_batch_end",
        ),
        L.Trainer: ("__init__", "fit", "save_checkpoint"),
        L.LightningModule: ("log",),
        ResumableDataModule: ("setup",),
        TextDataModule: ("setup",),
        WandbLogger: ("__init__", "log_hyperparams", "log_metrics", "log_image", "log_table", "finalize"),
        CSVLogger: ("log_metrics", "log_hyperparams"),
        _ExperimentWriter: ("save",),
        _EvaluationLoop: ("run",),
        torch.utils.data.dataloader._BaseDataLoaderIter: ("__next__",),
        torch.optim.lr_scheduler.LRScheduler: ("step",),
        wandb: ("init", "finish"),
    }
    callbacks = {type(c) for c in train_mod.build_callbacks(cfg.get("callbacks"))} | {GracefulInterrupt}
    named |= {cls: tuple(a for a in dir(cls) if a.startswith("on_")) for cls in callbacks}
    return {(owner, attr): getattr(owner, attr) for owner, attrs in named.items() for attr in attrs}


def test_a_recorded_run_has_the_phases_of_train_and_patches_nothing(make_cfg):
    """train() with the recorder on: every phase the bench expects of train() is there, the steps
    are Lightning's own actions (one per step), the phases add up to the time they cover, and
    nothing in attnlab, Lightning, torch or W&B was replaced."""
    from attnlab.training.train import train

    cfg = make_cfg("logger=csv", *MICRO)
    before = patched_by_name(cfg)
    rec = phases.enable()
    try:
        t0 = time.perf_counter()
        with phases.phase("the test's call"):
            metrics = train(cfg)
        wall = time.perf_counter() - t0
    finally:
        phases.disable()
    after = patched_by_name(cfg)
    assert [k for k in before if before[k] is not after[k]] == []
    data = rec.data()
    seconds, calls = phase_rows(data["seconds"], data["calls"])
    process_level = {
        phases.IMPORTS,
        "Hydra: parse, compose, run dir, log set-up",
        "train(): not covered by a phase",
        "W&B: finish",
    }  # the CLI's, around train(); W&B's with a W&B logger only
    assert sorted(set(EXPECTED) - process_level - set(seconds)) == []
    assert calls["step: backward"] == calls["step: forward (training_step, self.log)"] == metrics["step"] == 6
    assert sum(data["seconds"].values()) == pytest.approx(wall, rel=0.02, abs=0.02)
    assert all(sec >= 0 for sec in data["seconds"].values())
    ends = data["last_end"]
    order = ["loggers: build", "data: read and encode the corpus", "callbacks: build", "trainer: build"]
    order += ["kernel check forward", "loggers: log config"]
    assert [ends[name] for name in order] == sorted(ends[name] for name in order)


@pytest.mark.slow  # a whole default run in a fresh process, W&B offline included (~20 s on two cores)
def test_breakdown_adds_up_to_the_wall_time(tmp_path):
    overrides = ["debug=smoke", *MICRO, "trainer.enable_progress_bar=true", "checkpoint.every_n_steps=3"]
    result = breakdown(overrides, tmp_path, cprofile=False, log=lambda line: None)
    rows = {r["phase"]: r for r in result["rows"]}
    assert sorted(set(EXPECTED) - set(rows)) == []  # a phase renamed or no longer recorded
    assert sum(r["seconds"] for r in result["rows"]) == pytest.approx(result["wall_s"], rel=1e-6)
    # one clock tick (10 ms) of /proc's process start may fall before the bench's own clock reading
    assert all(r["seconds"] >= -0.02 for r in result["rows"]), result["rows"]
    assert rows["step: backward"]["calls"] == result["steps"] == 6
    assert rows["validation: forward"]["calls"] == 4  # 2 validations (steps 3 and 6) of 2 batches
    # W&B starts in a thread beside the set-up and the first steps: its seconds are kept apart from the rows
    assert result["background_s"]["W&B: import and init"] > 0
    assert rows["checkpoint writes"]["calls"] >= 2
    assert rows["callback HeadAnalysis (end of training)"]["calls"] == 1
    assert rows[phases.IMPORTS]["seconds"] > 0.2
    assert [r["phase"] for r in result["rows"] if r["group"] == "other"] == []


def test_the_nanogpt_yardstick_is_the_same_model_from_the_same_seed():
    """The e2e yardstick for attention=sdpa is nanoGPT's structure (one fused c_attn, causal SDPA):
    one seed gives it attnlab's initial weights (c_attn's rows are q, k, v) and so the same loss;
    configs it cannot express keep attnlab's GPT in the plain loop."""
    from attnlab.model import GPT, GPTConfig
    from attnlab.tools.bench.plain_train import NanoGPT, build_model

    spec = plain_spec(["attention=sdpa", "model.n_layer=2"])
    assert spec["structure"] == "nanogpt"
    assert (
        plain_spec([])["structure"]
        == plain_spec(["attention=sdpa", "model.attention.qk_norm=true"])["structure"]
        == "attnlab"
    )
    torch.manual_seed(0)
    nano = build_model(spec, 30)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**{**spec["model"], "vocab_size": 30}))
    assert isinstance(nano, NanoGPT) and sum(p.numel() for p in nano.parameters()) == sum(
        p.numel() for p in gpt.parameters()
    )
    attn = gpt.blocks[1].attn
    assert torch.equal(nano.blocks[1].c_attn.weight, attn.qkv_proj.weight)
    x, y = torch.randint(30, (2, 64)), torch.randint(30, (2, 64))
    torch.testing.assert_close(nano(x, y)[1], gpt(x, y)[1], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_plain_loop_does_the_same_work_as_make_train(tmp_path):
    """Same initial weights, batches, schedule and validation: the plain script's final val loss
    equals the one make train records, to float precision."""
    overrides = [
        "debug=smoke",
        "logger=none",
        "callbacks=none",
        *MICRO,
        "trainer.max_steps=8",
        "trainer.val_check_interval=4",
    ]
    plain = run_plain(plain_spec(overrides), tmp_path / "plain")
    made = run_attnlab(overrides, tmp_path / "attnlab")
    assert plain["steps"] == made["steps"] == 8
    assert plain["val_loss"] == pytest.approx(made["val_loss"], abs=1e-5)
    assert made["val_loss"] < math.log(100)  # trained: below a uniform guess over the vocabulary


@pytest.mark.slow
def test_cli_tiny_end_to_end_and_compile_sections(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.tools.bench",
            "--mode",
            "tiny",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--sections",
            "e2e,compile",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["arm"] for r in data["e2e"]["rows"]] == ["defaults", "sdpa"]
    for row in data["e2e"]["rows"]:
        a, p = row["samples"]["attnlab"][0], row["samples"]["plain"][0]
        assert row["wall_ratio"] == pytest.approx(a["wall_s"] / p["wall_s"])
        assert a["wall_s"] > a["median_step_s"] * row["steps"]  # the whole command outlasts its steps
        assert row["val_loss"]["attnlab"][0] == pytest.approx(row["val_loss"]["plain"][0], abs=1e-5)
    assert {r["backend"] for r in data["compile"]} == {"scaled", "sdpa"}
    for row in data["compile"]:
        assert row["error"] is None, row
        assert row["compile_s"] > 0 and row["max_loss_diff"] < 1e-3
    md = (tmp_path / "bench.md").read_text()
    assert "## End to end" in md and "## torch.compile" in md


@pytest.mark.slow
def test_compiled_training_matches_eager_and_probes_still_see_qk(make_cfg):
    """model.compile=true: the same losses as eager over a few steps (same weights, same batches), the
    statistics and head analysis still measured (probes run the eager module), and checkpoints hold
    the eager model's keys, so resume and sample read them as before."""
    from attnlab.training.train import train

    common = ["debug=smoke", *MICRO, "callbacks=default", "checkpoint.every_n_steps=3"]
    eager_cfg, compiled_cfg = make_cfg(*common), make_cfg(*common, "model.compile=true")
    eager, compiled = train(eager_cfg), train(compiled_cfg)
    for key in ("train/loss", "val/loss"):
        assert compiled[key] == pytest.approx(eager[key], abs=1e-4), key
    for key in ("attn/L0/entropy", "attn/L0/max_prob", "heads/repeat_acc"):
        assert math.isfinite(compiled[key]) and compiled[key] == pytest.approx(eager[key], abs=1e-3), key
    results = json.loads((Path(compiled_cfg.paths.output_dir) / "results.json").read_text())
    assert results["status"] == "ok" and results["attention"]["kernel"]
    state = torch.load(Path(compiled_cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)[
        "state_dict"
    ]
    assert not any("_orig_mod" in k or "_compiled" in k for k in state)
    assert set(state) == set(
        torch.load(Path(eager_cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    )


def test_lr_and_tokens_per_s_reach_the_csv_on_every_logged_step(make_cfg):
    """The module logs lr and tokens/s only on the steps the loggers write (one self.log per step
    instead of three): every written row still has them, with the lr of its own step."""
    import csv

    from attnlab.training.lit_module import warmup_cosine
    from attnlab.training.train import train

    cfg = make_cfg(*MICRO, "logger=csv", "callbacks=none", "trainer.max_steps=9", "trainer.log_every_n_steps=2")
    train(cfg)
    rows = list(csv.DictReader(open(next(Path(cfg.paths.output_dir).rglob("metrics.csv")))))
    logged = [r for r in rows if r.get("train/loss")]
    assert [int(r["step"]) for r in logged] == [1, 3, 5, 7]
    o = cfg.optim
    for r in logged:
        assert float(r["perf/tokens_per_s"]) > 0
        expected = o.lr * warmup_cosine(int(r["step"]), o.warmup_steps, cfg.trainer.max_steps, o.lr, o.min_lr)
        assert float(r["lr"]) == pytest.approx(expected, rel=1e-6)


def test_compile_that_cannot_run_falls_back_to_eager_with_one_line(monkeypatch, capsys):
    """Where inductor cannot build (no C++ compiler), model.compile=true says so once and trains eager."""
    from attnlab.training.lit_module import GPTModule

    def broken_compile(model):
        def call(*args, **kwargs):
            raise torch._dynamo.exc.BackendCompilerFailed("inductor", RuntimeError("no C++ compiler found"), None)

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    cfg = {"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "d_model": 16, "compile": True}
    module = GPTModule(
        cfg, {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1, "weight_decay": 0.1, "betas": [0.9, 0.99]}, 4
    )
    x = torch.randint(11, (2, 8))
    _, loss = module.step_forward(x, x)
    _, again = module.step_forward(x, x)
    assert torch.equal(loss, module.model(x, x)[1]) and torch.equal(again, loss)
    err = capsys.readouterr().err
    assert err.count("attnlab: model.compile=true: torch.compile cannot run here") == 1 and "training eager" in err
    assert not module.compiled


def test_model_compile_must_be_a_boolean():
    from attnlab.training.lit_module import GPTModule
    from attnlab.util.errors import ConfigError

    with pytest.raises(ConfigError, match="model.compile"):
        GPTModule(
            {"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "d_model": 16, "compile": "yes"}, {}, 4
        )


# ------------------------------------------------------------------ long context


def test_longctx_budget_is_the_same_at_every_T():
    """batch x T x steps and the number of validations do not change with T; 4096 only with a fused backend;
    at T = 1024 the runs are the long-context target's command."""
    plan = LongctxPlan((64, 256, 1024, 2048), (4096,), tokens_per_step=4096, steps=40)
    assert plan.lengths() == (64, 256, 1024, 2048, 4096)
    assert LongctxPlan((64, 256), (4096,), attention="scaled").lengths() == (64, 256)
    for t in (*plan.lengths(), 8192):  # 8192 > tokens_per_step: batch 1, fewer steps
        s = run_settings(plan, t)
        assert s["batch_size"] * t * s["steps"] == s["tokens"] == plan.budget, (t, s)
        assert s["steps"] // s["val_every"] == plan.validations and s["steps"] % s["val_every"] == 0, (t, s)
    assert run_settings(plan, 8192)["batch_size"] == 1
    assert {
        "model.block_size=1024",
        "data.batch_size=4",
        "trainer.max_steps=40",
        "trainer.val_check_interval=20",
        "attention=sdpa",
        "logger=csv",
    } <= set(run_overrides(plan, 1024))
    with pytest.raises(ValueError, match="does not divide"):
        run_settings(plan, 1000)
    with pytest.raises(ValueError, match="validations"):
        run_settings(LongctxPlan((64,), steps=5), 64)


def fake_sample(wall: float, end: float = 0.0, tail: float = 1.0) -> dict:
    return {
        "wall_s": wall,
        "end_s": end,
        "tail_s": tail,
        "callbacks_s": end,
        "median_step_s": 0.01,
        "val_loss": 2.0,
        "kernel": "sdpa:flash",
        "max_rss_bytes": 2**30,
        "cuda_peak_bytes": None,
    }


def test_the_stack_only_arm_is_the_sdpa_arm_without_callbacks():
    """e2e's sdpa_no_callbacks arm: the same yardstick as the sdpa arm, the run with no callback at all."""
    from attnlab.tools.bench.__main__ import E2E, E2E_ARMS

    arm = E2E_ARMS["sdpa_no_callbacks"]
    assert plain_spec(arm) == plain_spec(E2E_ARMS["sdpa"]) and plain_spec(arm)["structure"] == "nanogpt"
    assert not compose_config(arm).get("callbacks") and compose_config(E2E_ARMS["sdpa"]).callbacks
    assert "sdpa_no_callbacks" not in E2E["full"]["arms"]  # asked for by name only: full mode's time stays as stated


def test_a_target_is_met_missed_or_open_by_the_spread_of_its_pairs():
    assert (
        against_target(0.98, 1.09, 1.10) == "met" and against_target(1.02, 1.10, 1.10) == "met"
    )  # at the target is within
    assert against_target(1.11, 1.30, 1.10) == "missed"
    assert against_target(1.05, 1.20, 1.10) == "open" and against_target(1.10, 1.20, 1.10) == "open"


def test_longctx_rows_compute_ratio_share_and_verdicts(tmp_path):
    settings = {"batch_size": 4, "steps": 40, "val_every": 20, "tokens": 163840}
    slow = summarize(
        1024,
        settings,
        [],
        {
            "default": [fake_sample(12.0, 0.5), fake_sample(13.0, 0.5), fake_sample(11.5, 0.5)],
            "none": [fake_sample(10.0)] * 3,
        },
    )
    assert slow["wall_ratio"] == pytest.approx(1.2) and slow["wall_ratio_range"] == pytest.approx([1.15, 1.3])
    assert slow["end_share"] == pytest.approx(0.5 / 12.0) and slow["end_verdict"] == "met"
    assert slow["ratio_verdict"] == "missed" and slow["default_wall_s"] == 12.0
    fine = summarize(64, settings, [], {"default": [fake_sample(10.5, 0.8)] * 3, "none": [fake_sample(10.0)] * 3})
    assert fine["ratio_verdict"] == "met" and fine["end_verdict"] == "missed"  # 0.8 s of 10.5 s is over 5 %
    torn = summarize(
        256,
        settings,
        [],
        {
            "default": [fake_sample(10.5, 0.5), fake_sample(12.0, 0.5), fake_sample(11.5, 0.5)],
            "none": [fake_sample(10.0)] * 3,
        },
    )
    assert torn["ratio_verdict"] == "open"  # pairs at 1.05, 1.20 and 1.15: the median says nothing the spread does not
    section = {
        "targets": {"wall_ratio": longctx.TARGET_RATIO, "end_share": longctx.TARGET_END_SHARE},
        "rows": [fine, torn, slow],
        "complete": True,
    }
    assert longctx_outcome(section) == {
        "met": {"ratio_verdict": [64], "end_verdict": [256, 1024]},
        "open": {"ratio_verdict": [256], "end_verdict": []},
        "missed": {"ratio_verdict": [1024], "end_verdict": [64]},
    }
    text = longctx_verdict(section)
    # the sentence names the missed targets' T before the unresolved one, and no T that met both
    assert text.index("1024") < text.index("256") and "64" in text
    table = "\n".join(longctx_table(section))
    assert (
        "| 1024 | 4 x 40 |" in table
        and "**1.200**" in table
        and "**no**" in table
        and "yes" in table
        and "| open |" in table
    )
    both = summarize(256, settings, [], {"default": [fake_sample(10.2, 0.1)] * 3, "none": [fake_sample(10.0)] * 3})
    assert longctx_outcome(dict(section, rows=[both]))["met"] == {"ratio_verdict": [256], "end_verdict": [256]}
    assert longctx_verdict(dict(section, rows=[both])) != text
    lc = {**section, "plan": {"budget": 163840, "validations": 2, "repeats": 3}, "load": [[1.25, 1, 1], [1.5, 1, 1]]}
    md = write_markdown(synthetic_bench() | {"longctx": lc}, tmp_path).read_text().split("## Long context")[1]
    assert "Load average 1.25 at the start, 1.50 at the end" in md and "{" not in md and text in md


def test_longctx_alternates_saves_each_T_and_stops_growing_after_a_failure(monkeypatch):
    calls, saved = [], []

    def fake_run_arm(overrides, run_dir):
        t = int(next(o for o in overrides if o.startswith("model.block_size=")).split("=")[1])
        arm = "none" if "callbacks=none" in overrides else "default"
        calls.append((t, arm))
        if t == 256:
            raise RuntimeError(
                "python -m attnlab.tools.bench.longctx ... failed (exit 1): Traceback\nMemoryError: out of memory"
            )
        return fake_sample(11.0 if arm == "default" else 10.0, 0.1)

    monkeypatch.setattr(longctx, "run_arm", fake_run_arm)
    plan = LongctxPlan((64, 128, 256, 512), tokens_per_step=512, steps=4, repeats=3)
    section = longctx.long_context(
        plan, log=lambda line: None, on_progress=lambda s: saved.append([r["T"] for r in s["rows"]])
    )
    assert calls[:6] == [(64, "default"), (64, "none"), (64, "none"), (64, "default"), (64, "default"), (64, "none")]
    assert alternated(["a", "b"], 1) == ["b", "a"]
    assert saved == [[64], [64, 128], [64, 128, 256], [64, 128, 256, 512]]  # saved after every T
    rows = {r["T"]: r for r in section["rows"]}
    assert rows[64]["wall_ratio"] == pytest.approx(1.1) and rows[64]["ratio_verdict"] == "met"
    assert rows[256]["error"] == "MemoryError: out of memory" and rows[512]["error"].startswith("skipped")
    assert not any(t == 512 for t, _ in calls) and section["complete"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--longctx-seq-lens", "1000"], "does not divide"),
        (["--longctx-seq-lens", "64,x"], "--longctx-seq-lens"),
        (["--longctx-repeats", "0"], "--longctx-repeats"),
        (["--e2e-arms", "defaults,bogus"], "--e2e-arms bogus"),
    ],
)
def test_cli_rejects_bad_longctx_and_e2e_settings(tmp_path, capsys, args, needle):
    assert bench_main(["--mode", "tiny", "--out", str(tmp_path / "out"), "--sections", "longctx,e2e", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: ") and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.slow  # two whole training processes (~30 s on two cores)
def test_cli_tiny_longctx_section(tmp_path):
    """The section's rows come from real runs: the ratio is the pair's, the verdicts follow the targets, the
    end-of-run analysis falls after the last step, callbacks=none runs no end-of-training hooks."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.tools.bench",
            "--mode",
            "tiny",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--sections",
            "longctx",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    section = json.loads((tmp_path / "bench.json").read_text())["longctx"]
    assert section["complete"] and [r["T"] for r in section["rows"]] == section["plan"]["lengths"]
    targets = section["targets"]
    for row in section["rows"]:
        assert row["error"] is None, row
        d, n = row["samples"]["default"], row["samples"]["none"]
        assert len(d) == len(n) == section["plan"]["repeats"]
        assert row["batch_size"] * row["T"] * row["steps"] == section["plan"]["budget"]
        assert row["wall_ratio"] == pytest.approx(statistics.median(a["wall_s"] / b["wall_s"] for a, b in zip(d, n)))
        assert row["ratio_verdict"] == against_target(*row["wall_ratio_range"], targets["wall_ratio"])
        assert row["end_share"] == pytest.approx(statistics.median(s["end_s"] / s["wall_s"] for s in d))
        assert row["end_verdict"] == against_target(*row["end_share_range"], targets["end_share"])
        for s in d:
            assert 0 < s["end_s"] < s["tail_s"] < s["wall_s"], s  # the final analysis runs after the last step
            assert 100 * 2**20 < s["max_rss_bytes"] < 64 * 2**30
        assert all(s["end_s"] < 0.01 and 0 < s["tail_s"] < s["wall_s"] for s in n)  # only Lightning's no-op end hooks
        assert row["val_loss"]["default"] == pytest.approx(
            row["val_loss"]["none"], abs=1e-5
        )  # the callbacks only observe
    md = (tmp_path / "bench.md").read_text()
    assert "## Long context" in md and longctx_verdict(section) in md
    verdict_cells = [
        line.split("|")[6].strip() for line in md.splitlines() if line.startswith(f"| {section['rows'][0]['T']} |")
    ]
    assert verdict_cells == [VERDICT_CELLS[section["rows"][0]["ratio_verdict"]]]


def test_the_latent_training_check_reads_its_ratios_within_the_repeats(tmp_path):
    """Each latent arm's step against multi-head's within a repeat, read against the 1.3x target with the
    repeats' spread; an arm without its conf/variant file is named, not measured."""
    import shutil

    from attnlab.tools.bench.bench_report import latent_train_table
    from attnlab.tools.bench.latent_train import LATENT_TRAIN, TARGET_RATIO, VARIANTS, latent_train_section
    from attnlab.tools.bench.timing import against_target

    shutil.copy(VARIANTS / "mla_dc64.yaml", tmp_path)
    settings = {**LATENT_TRAIN["tiny"], "arms": ("mla_dc64", "mla_absent")}
    section = latent_train_section(**settings, variants=tmp_path, log=lambda _: None)
    assert section["missing"] == ["mla_absent"]
    rows = {r["arm"]: r for r in section["rows"]}
    assert set(rows) == {"mha", "mla_dc64"} and (rows["mla_dc64"]["d_c"], rows["mha"]["d_c"]) == (64, None)
    pairs = [a / m for a, m in zip(rows["mla_dc64"]["step_s"], rows["mha"]["step_s"])]
    assert len(pairs) == section["setup"]["repeats"]
    assert rows["mla_dc64"]["ratio_to_mha"] == pytest.approx(statistics.median(pairs), rel=1e-12)
    assert rows["mla_dc64"]["ratio_range"] == [min(pairs), max(pairs)]
    assert rows["mla_dc64"]["verdict"] == against_target(min(pairs), max(pairs), TARGET_RATIO)
    table = latent_train_table(section)
    assert sum(line.startswith("| mla_dc64 | 64 + 8 (81) |") for line in table) == 1


def test_bench_latent_train_section_lands_in_bench_json_and_md(tmp_path):
    assert (
        bench_main(
            [
                "--mode",
                "tiny",
                "--sections",
                "latent_train",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [r["arm"] for r in bench["latent_train"]["rows"]] == ["mha", "mla_dc64"]
    assert "## Latent attention's training step" in (tmp_path / "bench.md").read_text()
