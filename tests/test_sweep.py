"""The ablation study end to end: experiments, multirun, failure isolation, aggregation, W&B sweeps."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from scipy import stats as scipy_stats

from attnlab.config.compose import CONF_DIR, compose_config
from attnlab.config.study import study_names
from attnlab.studies.report import build_report
from attnlab.studies.report.aggregate import group_cells, load_runs, swept_axes
from attnlab.studies.report.analysis import cells_from_runs, pooled
from attnlab.studies.report.data import read_runs
from attnlab.studies.report.lr import arms as lr_arms
from attnlab.sweeps.sweep import SweepProgress, sweep_axes
from attnlab.tools.dashboard import main as dashboard_main
from attnlab.training.results import FINGERPRINT, FINISHED_ENV, finished_before, resumable, training_fingerprint
from attnlab.util import significance
from attnlab.util.profiling import UNKNOWN_BLOCK
from attnlab.writing.pages import mean_ci

ROOT = Path(__file__).resolve().parents[1]


def run_sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnlab.sweeps.sweep", "--logs", str(tmp_path / "logs"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,  # a guard only: on 2 cores shared with other work the sweep and its report took over 15 min
        env={
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "HOME": str(tmp_path),
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),  # the tree under test
        },
    )


def test_default_sweep_path_end_to_end(tmp_path):
    """`make sweep` as it runs by default (JOBS=2: the joblib launcher, two cells at once), with seeds and
    a failing cell: the invalid d_k fails, the rest finish, and the table aggregates the seeds.
    2 d_k x 2 scalings x 2 seeds of a tiny model, 6 steps each (about a minute on 2 busy cores)."""
    proc = run_sweep(
        tmp_path,
        "--study",
        "smoke",
        "--seeds",
        "2",
        "--jobs",
        "2",
        "model.d_k=16,-1",
        "model.init_std=0.02",
        "logger=csv",
        "model.n_layer=1",
        "model.d_model=32",
        "model.n_head=2",
        "data.batch_size=2",
        "trainer.enable_progress_bar=true",  # a progress line every step: they must stay in each run's log
        "callbacks.peak_memory.every_n_steps=2",  # peak memory windows that free the previous step's tensors
    )
    assert proc.returncode == 1, proc.stderr[-2000:]  # a failed cell makes the sweep exit non-zero
    (sweep,) = (tmp_path / "logs").iterdir()
    results = {r: json.loads(r.read_text()) for r in sweep.glob("*/results.json")}
    ok = [r for r, res in results.items() if res["status"] == "ok"]
    assert len(results) == 8 and len(ok) == 4
    # the console: one line per cell as it ends, counted of the 8, with its name and val loss; no step lines
    progress = [(line, re.match(r"attnlab: \[(\d+)/(\d+), (\d+) failed", line)) for line in proc.stdout.splitlines()]
    progress = [(line, [int(g) for g in m.groups()]) for line, m in progress if m]
    assert [counts[:2] for _, counts in progress] == [[k, 8] for k in range(1, 9)] and progress[-1][1][2] == 4
    for r, res in results.items():
        given = dict(o.split("=", 1) for o in res["overrides"])
        name = f"d_k={given['model.d_k']} scaling={given['model.attention.scaling']} seed={res['config']['seed']}"
        (line,) = [line for line, _ in progress if f" {name}: " in line]
        assert res["status"] == "failed" or f"{res['metrics']['val/loss']:.4f}" in line
        log = (r.parent / "console.log").read_text()
        assert res["status"] == "failed" or re.search(r"^step 6/6 ", log, re.M)
        assert UNKNOWN_BLOCK not in log
    console = proc.stdout + proc.stderr
    assert not re.search(r"^step \d", console, re.M) and UNKNOWN_BLOCK not in console
    assert all("model.d_k=-1" in res["overrides"] for res in results.values() if res["status"] == "failed")
    for r in results:
        launcher = yaml.safe_load((r.parent / ".hydra" / "hydra.yaml").read_text())["hydra"]["launcher"]
        assert launcher["_target_"].endswith("JoblibLauncher") and launcher["n_jobs"] == 2
    # a job writes .hydra/config.yaml when it starts and results.json when it ends: in parallel, two spans overlap
    spans = [((r.parent / ".hydra" / "config.yaml").stat().st_mtime, r.stat().st_mtime) for r in ok]
    assert any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans) for b0, b1 in spans[i + 1 :])

    (runs_csv,) = (tmp_path / "reports" / "smoke").glob("**/runs.csv")  # the sweep's overrides: its own budget
    report = runs_csv.parent
    runs = read_runs(runs_csv)
    failed = runs[runs["status"] == "failed"]
    assert len(runs) == 8 and set(failed["model.d_k"]) == {"-1"} and failed["error"].str.contains("model.d_k").all()
    ok = runs[runs["status"] == "ok"]
    assert len(ok) == 4 and (ok["val/loss"] < 10).all() and (ok["attn/L0/entropy_norm"] > 0).all()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["failed"] == 4 and summary["seeds_per_cell"] == "0-2"
    assert (report / "val_loss_vs_dk.png").exists() and (report / "max_logit_over_training.png").exists()
    (pair,) = summary["scaled_vs_unscaled"]
    assert "d_k=16" in pair["where"].split(", ") and pair["n"] == [2, 2] and 0 <= pair["p"] <= 1


def write_result(sweep: Path, job: int, overrides: list[str], status: str, loss: float | None = None, **fields):
    """One run's results.json as RunRecord writes it: a new file renamed over the old one."""
    run = sweep / str(job)
    run.mkdir(parents=True, exist_ok=True)
    seed = next((int(o.split("=")[1]) for o in overrides if o.startswith("seed=")), 1337)
    record = {
        "status": status,
        "error": fields.pop("error", None),
        "overrides": overrides,
        "config": {"seed": seed},
        "metrics": {} if loss is None else {"val/loss": loss},
        "wall_s": fields.pop("wall_s", 60.0),
    }
    tmp = run / ".results.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(run / "results.json")


GRID = {
    "model.d_k": [16, 32],
    "model.attention.scaling": ["none", "inv_sqrt_d"],
    "model.init_std": [0.02],
    "seed": [0, 1],
}


def test_sweep_progress_counts_names_failures_and_a_time_left_that_falls_at_a_steady_pace(tmp_path):
    """Cells ending every 10 s of an 8-cell grid: one line each, the count and failures as the files say, the time
    left 10 s per cell to go, a running run not counted, nothing printed twice."""
    now = [0.0]
    out = io.StringIO()
    progress = SweepProgress(tmp_path, GRID, stream=out, clock_s=lambda: now[0])
    assert progress.total == 8 and progress.poll() == []
    cells = [(d_k, scaling, seed) for d_k in (16, 32) for scaling in ("none", "inv_sqrt_d") for seed in (0, 1)]
    write_result(tmp_path, 7, ["model.d_k=32", "model.attention.scaling=inv_sqrt_d", "seed=1"], "running")
    etas, names = [], []
    for job, (d_k, scaling, seed) in enumerate(cells):
        now[0] += 10.0
        overrides = [f"model.d_k={d_k}", f"model.attention.scaling={scaling}", "model.init_std=0.02", f"seed={seed}"]
        if d_k == 32 and scaling == "none":
            write_result(tmp_path, job, overrides, "failed", error=f"seed {seed}: boom")
        else:
            write_result(tmp_path, job, overrides, "ok", loss=2.0 + job / 100)
        (line,) = progress.poll()
        assert progress.poll() == []  # a file not rewritten is not read again
        names.append(progress.cells[str(job)].name)
        assert names[-1] == f"d_k={d_k} scaling={scaling} seed={seed}" and names[-1] in line
        assert progress.finished == job + 1
        assert progress.failed == sum(1 for d, s, _ in cells[: job + 1] if (d, s) == (32, "none"))
        if progress.cells[str(job)].status == "ok":
            assert f"{2.0 + job / 100:.4f}" in line
        else:
            assert f"seed {seed}: boom" in line
        etas.append(progress.eta_s())
    assert etas == pytest.approx([10.0 * (8 - k) for k in range(1, 9)])
    assert all(a >= b for a, b in zip(etas, etas[1:])) and etas[-1] == 0
    assert len(set(names)) == 8 and progress.failed == 2
    assert len(out.getvalue().splitlines()) == 8


def test_a_requeued_cell_is_counted_once_with_its_latest_status(tmp_path):
    progress = SweepProgress(tmp_path, GRID, stream=io.StringIO())
    overrides = ["model.d_k=16", "model.attention.scaling=none", "seed=0"]
    write_result(tmp_path, 0, overrides, "interrupted", error="time limit")
    assert len(progress.poll()) == 1 and (progress.finished, progress.failed) == (1, 1)
    write_result(tmp_path, 0, overrides, "ok", loss=2.5)
    assert len(progress.poll()) == 1 and (progress.finished, progress.failed) == (1, 0)
    assert progress.cells["0"].val_loss == 2.5


def test_cell_names_keep_the_full_key_where_two_axes_end_alike(tmp_path):
    axes = {"model.attention.scaling": ["none", "inv_sqrt_d"], "optim.scaling": [1, 2], "model.init_std": [0.02]}
    progress = SweepProgress(tmp_path, axes, stream=io.StringIO())
    record = {
        "overrides": ["model.attention.scaling=none", "+optim.scaling=2", "model.init_std=0.02"],
        "config": {"seed": 3},
    }
    assert progress.total == 4
    assert progress.cell_name(record) == "model.attention.scaling=none optim.scaling=2 seed=3"


def test_sweep_axes_follow_the_command_line_as_hydra_does():
    """The study's grid, a command-line value replacing its axis, a command-line sweep adding one, and the seeds."""
    axes = sweep_axes("smoke", 3, ["model.d_k=16,-1", "model.init_std=0.02", "logger=csv", "optim.lr=range(1,3)"])
    assert axes == {
        "model.d_k": [16, -1],
        "model.attention.scaling": ["none", "inv_sqrt_d"],
        "model.init_std": [0.02],
        "optim.lr": [1, 2],
        "seed": [0, 1, 2],
    }


def test_a_study_runs_the_seeds_its_question_declares():
    """Without SEEDS a study runs question.seeds, at least two so that each of its contrasts can be tested; a
    config that declares no question runs one seed. mqar and text_sinks declare the one seed their committed
    runs hold (mqar's plan reads it untested: the reference has not learned the lookup)."""
    from attnlab.sweeps.sweep import declared_seeds

    declared = {s: declared_seeds(s) for s in study_names()}
    assert declared["smoke"] == 1 and declared["induction_heads"] == 10
    assert all(n >= 2 for s, n in declared.items() if s not in ("smoke", "sinks_bb_sgd", "mqar", "text_sinks"))


def fake_run(
    root: Path,
    name: str,
    overrides: list[str],
    loss: float | None,
    n_layer: int = 2,
    vocab: int = 10,
    extra: dict | None = None,
):
    run = root / name
    run.mkdir(parents=True)
    metrics = (
        {"val/loss": loss, **{f"attn/L{i}/entropy_norm": 0.5 + i for i in range(n_layer)}} if loss is not None else {}
    )
    metrics.update(extra or {})
    results = {
        "status": "ok" if loss is not None else "failed",
        "error": None if loss is not None else "boom",
        "overrides": overrides,
        "config": {"study": "fake", "model": {"n_layer": n_layer}},
        "metrics": metrics,
    }
    (run / "results.json").write_text(json.dumps(results))
    (run / "vocab.json").write_text(json.dumps({"chars": [str(i) for i in range(vocab)]}))


def test_aggregation_means_and_std_over_seeds(tmp_path):
    losses = {("16", "none"): [2.0, 2.2, 2.6], ("16", "inv_sqrt_d"): [1.5, 1.7, 1.6], ("32", "none"): [2.4, 2.5, 2.9]}
    for (dk, sc), values in losses.items():
        for seed, loss in enumerate(values):
            fake_run(
                tmp_path / "sweep",
                f"{dk}-{sc}-{seed}",
                [f"model.d_k={dk}", f"model.attention.scaling={sc}", f"seed={seed}"],
                loss,
            )
    fake_run(tmp_path / "sweep", "32-inv-0", ["model.d_k=32", "model.attention.scaling=inv_sqrt_d", "seed=0"], None)
    runs = load_runs(tmp_path / "sweep")
    axes = swept_axes(runs)
    assert axes == ["model.d_k", "model.attention.scaling"]  # seed is not an axis
    cells = {tuple(c.axes.values()): c for c in group_cells(runs, axes)}
    for key, values in losses.items():
        assert cells[key].mean("val/loss") == pytest.approx(statistics.fmean(values))
        assert cells[key].std("val/loss") == pytest.approx(statistics.stdev(values))
    assert len(cells[("32", "inv_sqrt_d")].failed) == 1 and cells[("32", "inv_sqrt_d")].mean("val/loss") is None
    summary = build_report(tmp_path / "sweep", reports=tmp_path / "reports", draw=False)
    assert summary["cells"] == 4 and summary["failed"] == 1
    cell = next(c for c in summary["cells_ci95"] if c["axes"] == {"model.d_k": "16", "model.attention.scaling": "none"})
    mean, lo, hi = significance.t_interval(losses[("16", "none")])
    assert cell["n"] == 3 and cell["metrics"]["val/loss"]["mean"] == pytest.approx(mean)
    assert cell["metrics"]["val/loss"]["ci95"] == pytest.approx([lo, hi])
    assert summary["seeds_per_cell"] == "0-3"  # the failed cell has none


@pytest.mark.parametrize(
    "mean, half, text",
    [
        (9597.0, 357.879, "9600 [9240, 9950]"),  # a large half-width, a small one
        (3.670, 0.00701, "3.6700 [3.6630, 3.6770]"),
        (1.873, 0.0996, "1.87 [1.77, 1.97]"),  # the half-width rounds up to a new power of ten: still two digits
        (-0.0004, 0.5, "0.00 [-0.50, 0.50]"),  # no "-0.00"
        (1.8364, 0.0, "1.836"),  # no spread: the value alone
        (1.8364, None, "1.836"),  # one seed: the value alone
        (None, None, "-"),
    ],
)
def test_mean_ci_shows_the_half_width_to_two_significant_digits(mean, half, text):
    assert mean_ci(mean, None if half is None or mean is None else (mean - half, mean + half)) == text


def fake_study(root: Path, seeds: list[int], losses: dict) -> list[Path]:
    """One sweep dir per seed (as the dk_scaling study ran), d_k x scaling x init_std cells."""
    dirs = []
    for seed in seeds:
        sweep = root / f"seed{seed}"
        for (dk, sc, init), values in losses.items():
            fake_run(
                sweep,
                f"{dk}-{sc}-{init}",
                [
                    f"model.d_k={dk}",
                    f"model.attention.scaling={sc}",
                    f"model.init_std={init}",
                    "experiment=fake",
                    f"seed={seed}",
                ],
                values[seed],
            )
        dirs.append(sweep)
    return dirs


STUDY = {  # (d_k, scaling, init_std) -> val loss per seed: six a side, what the exact test needs after Holm over 4
    ("16", "none", "0.02"): [1.80, 1.81, 1.82, 1.805, 1.815, 1.812],
    ("16", "inv_sqrt_d", "0.02"): [1.90, 1.91, 1.92, 1.905, 1.915, 1.912],  # scaled worse, clearly
    ("32", "none", "0.02"): [1.80, 1.90, 2.00, 1.85, 1.95, 1.92],
    ("32", "inv_sqrt_d", "0.02"): [1.81, 1.95, 1.99, 1.86, 1.93, 1.90],  # within noise
    ("16", "none", "fan_in"): [2.00, 2.01, 2.03, 2.005, 2.02, 2.015],
    ("16", "inv_sqrt_d", "fan_in"): [1.70, 1.72, 1.71, 1.705, 1.715, 1.712],  # scaled better
    ("32", "none", "fan_in"): [2.10, 2.00, 2.20, 2.05, 2.15, 2.12],
    ("32", "inv_sqrt_d", "fan_in"): [2.00, 2.20, 2.10, 2.05, 2.15, 2.08],
}
SEEDS = list(range(6))


def test_report_merges_sweep_dirs_and_marks_differences_beyond_seed_noise(tmp_path):
    from attnlab.studies.report.__main__ import main as report_main

    dirs = fake_study(tmp_path, SEEDS, STUDY)
    assert report_main([*map(str, dirs), "--reports", str(tmp_path / "r")]) == 0
    runs = read_runs(tmp_path / "r" / "fake" / "runs.csv")
    assert list(runs.columns[:4]) == ["model.d_k", "model.attention.scaling", "model.init_std", "seed"]
    assert len(runs) == 48 and set(runs["seed"]) == set(SEEDS)
    summary = json.loads((tmp_path / "r" / "fake" / "summary.json").read_text())
    assert {p["where"]: p["verdict"] for p in summary["scaled_vs_unscaled"]} == {
        "d_k=16, init_std=0.02": "higher",
        "d_k=16, init_std=fan_in": "lower",
        "d_k=32, init_std=0.02": "none",
        "d_k=32, init_std=fan_in": "none",
    }
    for p in summary["scaled_vs_unscaled"]:  # the interval holds the difference, and 0 when within noise
        assert p["ci95"][0] < p["diff"] < p["ci95"][1]
        assert (p["ci95"][0] < 0 < p["ci95"][1]) == (p["p"] >= 0.05)
    expected = significance.welch(STUDY[("16", "none", "0.02")], STUDY[("16", "inv_sqrt_d", "0.02")])
    pair = next(p for p in summary["scaled_vs_unscaled"] if p["where"] == "d_k=16, init_std=0.02")
    assert pair["p"] == pytest.approx(expected.p) and pair["beyond_noise"] and len(summary["sweep_dirs"]) == 6
    raw = sorted(p["p"] for p in summary["scaled_vs_unscaled"])
    assert min(p["p_holm"] for p in summary["scaled_vs_unscaled"]) == pytest.approx(4 * raw[0])
    cell = next(
        c
        for c in summary["per_seed"]
        if c["axes"] == {"model.d_k": "16", "model.attention.scaling": "none", "model.init_std": "0.02"}
    )
    assert [(r["seed"], r["metrics"]["val/loss"]) for r in cell["runs"]][:3] == [(0, 1.80), (1, 1.81), (2, 1.82)]


def test_one_seed_claims_no_significance(tmp_path):
    dirs = fake_study(tmp_path, [0], STUDY)
    summary = build_report(dirs, reports=tmp_path / "r", draw=False)
    assert all(c["metrics"]["val/loss"]["ci95"] is None for c in summary["cells_ci95"])  # one seed: no interval
    assert [p["verdict"] for p in summary["scaled_vs_unscaled"]] == ["untested"] * 4
    assert not any(p["beyond_noise"] for p in summary["scaled_vs_unscaled"])


def test_merging_the_same_runs_twice_is_refused(tmp_path, capsys):
    from attnlab.studies.report.__main__ import main as report_main

    dirs = fake_study(tmp_path, [0, 1], STUDY)
    copy = tmp_path / "copy"
    shutil.copytree(dirs[1], copy)
    with pytest.raises(SystemExit) as err:
        build_report([*dirs, copy], reports=tmp_path / "r")
    assert str(err.value).startswith("attnlab: error: DIR holds the same cell and seed twice")
    assert not (tmp_path / "r").exists()  # nothing half-written
    assert report_main([str(dirs[0]), str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_head_columns_appear_only_when_the_runs_logged_them(tmp_path):
    heads = {
        "heads/repeat_acc": 0.9,
        "heads/induction_max": 0.12,
        "heads/induction_control_max": 0.1,
        "heads/L0/induction_knockout_all_heads": 0.78,
        "heads/L1/induction_knockout_all_heads": -0.001,
    }
    fake_run(tmp_path / "tasks", "a", ["model.n_layer=2"], 0.5, extra=heads)
    fake_run(tmp_path / "text", "a", ["model.n_layer=2"], 0.5)
    history = [
        {
            "step": s,
            "repeat_acc": s / 10,
            "L0/induction_max": 0.1,
            "L1/induction_max": 0.0,
            "L0/induction_knockout_all_heads": s / 20,
            "L1/induction_knockout_all_heads": 0.0,
        }
        for s in (0, 5, 10)
    ]
    (tmp_path / "tasks" / "a" / "heads.json").write_text(json.dumps({"heads": [], "history": history}))
    build_report(tmp_path / "tasks", reports=tmp_path / "r1")
    assert (tmp_path / "r1" / "fake" / "heads_over_training.png").stat().st_size > 0
    summary = build_report(tmp_path / "text", reports=tmp_path / "r2", draw=False)
    runs = read_runs(tmp_path / "r1" / "fake" / "runs.csv")
    assert runs["heads/L0/induction_knockout_all_heads"].tolist() == [0.78]
    assert runs["heads/L1/induction_knockout_all_heads"].tolist() == [-0.001]
    assert runs["phase/step"].tolist() == [5]  # copying reaches 0.5 at step 5
    assert not any(c.startswith(("heads/", "phase/")) for c in read_runs(tmp_path / "r2" / "fake" / "runs.csv"))
    assert summary["phase_change_steps"] == [] or summary["phase_change_steps"][0]["steps"] == []
    assert not (tmp_path / "r2" / "fake" / "heads_over_training.png").exists()


def test_recording_only_overrides_do_not_split_cells(tmp_path):
    fake_run(tmp_path / "a", "0", ["model.d_k=16", "seed=0", "logger=csv", "~callbacks.checkpoint=null"], 1.0)
    fake_run(tmp_path / "b", "1", ["model.d_k=16", "seed=1"], 1.2)
    fake_run(tmp_path / "b", "2", ["model.d_k=32", "seed=1"], 1.4)
    summary = build_report([tmp_path / "a", tmp_path / "b"], reports=tmp_path / "r", draw=False)
    cells = cells_from_runs(read_runs(tmp_path / "r" / "fake" / "runs.csv"))
    assert [c.axes for c in cells] == [{"model.d_k": "16"}, {"model.d_k": "32"}] and cells[0].n_ok == 2
    assert cells[0].mean("val/loss") == pytest.approx(1.1)
    assert summary["recording_differences"] == ["callbacks.checkpoint ((default), null)", "logger ((default), csv)"]
    fake_run(tmp_path / "c", "3", ["model.d_k=16", "seed=2", "model.n_head=8"], 1.0)  # a real difference stays an axis
    build_report([tmp_path / "b", tmp_path / "c"], reports=tmp_path / "r2", draw=False)
    assert list(read_runs(tmp_path / "r2" / "fake" / "runs.csv").columns[:3]) == ["model.d_k", "model.n_head", "seed"]


def test_head_types_per_layer_counted_per_seed(tmp_path):
    def heads(*types_l1):
        return [{"layer": 0, "head": h, "type": "previous_token", "scores": {}} for h in range(2)] + [
            {"layer": 1, "head": h, "type": t, "scores": {}} for h, t in enumerate(types_l1)
        ]

    per_seed = [heads("induction", "content"), heads("induction", "induction"), heads("content", "content")]
    for seed, analysed in enumerate(per_seed):
        fake_run(tmp_path / "sweep", f"s{seed}", ["model.n_layer=2", f"seed={seed}"], 1.0)
        path = tmp_path / "sweep" / f"s{seed}" / "results.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "heads": analysed}))
    fake_run(tmp_path / "sweep", "other", ["model.n_layer=1", "seed=0"], 1.0)  # no head analysis in this cell
    summary = build_report(tmp_path / "sweep", reports=tmp_path / "r", draw=False)
    types = {json.dumps(c["axes"]): c["layers"] for c in summary["head_types"]}
    assert types['{"model.n_layer": "2"}'] == [
        {"previous_token": [2, 2, 2]},
        {"content": [1, 0, 2], "induction": [1, 2, 0]},
    ]
    assert types['{"model.n_layer": "1"}'] == [{}, {}]


def test_lr_sensitivity_definition(tmp_path):
    """Wortsman et al.: mean over LRs of min(loss, initial loss) - best loss; a diverged LR counts as the initial loss."""
    grid = {"1e-3": 2.0, "1e-2": 3.0, "1e-1": None}
    for lr, loss in grid.items():
        fake_run(tmp_path / "s", f"lr{lr}", [f"optim.lr={lr}"], loss, vocab=100)
    build_report(tmp_path / "s", reports=tmp_path / "r", draw=False)
    frame = read_runs(tmp_path / "r" / "fake" / "runs.csv")
    expected = statistics.fmean([2.0, 3.0, math.log(100)]) - 2.0
    (arm,) = lr_arms(frame, ["optim.lr"])
    assert arm.per_seed() == [pytest.approx(expected)]
    assert arm.best_lr == 1e-3 and arm.failed == {1e-3: 0, 1e-2: 0, 1e-1: 1}
    assert arm.critical_lr(None) == 1e-1  # 4.6 is past halfway from 2.0 back to ln 100; 3.0 is not


@pytest.mark.parametrize("study", study_names())
def test_every_experiment_composes(study, tmp_path):
    cfg = compose_config([f"experiment={study}"], tmp_path)
    assert cfg.study == study


def config_has(cfg, key: str) -> bool:
    if (CONF_DIR / key).is_dir():  # a config group, e.g. attention=sdpa
        return True
    return OmegaConf.select(cfg, key, default="__missing__") != "__missing__"


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_wandb_sweeps_name_only_existing_keys(path, tmp_path):
    spec = yaml.safe_load(path.read_text())
    assert spec["method"] in ("grid", "bayes", "random") and spec["metric"]["name"] == "val/loss"
    assert "${args_no_hyphens}" in spec["command"]
    assert spec["name"] in study_names()
    cfg = compose_config([], tmp_path)
    for key in spec["parameters"]:
        assert config_has(cfg, key), f"{path.name}: {key} is not a config key"
    experiment = yaml.safe_load((CONF_DIR / "experiment" / f"{spec['name']}.yaml").read_text())
    swept = set(experiment["hydra"]["sweeper"]["params"])
    assert swept <= set(spec["parameters"]), f"{path.name} must mirror the Hydra experiment's axes"


def test_dashboard_without_login_prints_plan_and_exits_zero(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dashboard_main(["--layers", "2"]) == 0
    out = capsys.readouterr().out
    assert "attn/L1/max_logit" in out and "Not logged in" in out


def test_compare_plots_runs_side_by_side(tmp_path, monkeypatch):
    from attnlab.studies.report.__main__ import main as report_main

    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        lines = [
            {
                "step": s,
                **{f"attn/L{i}/{k}": 0.1 * s + i for i in range(2) for k in ("entropy_norm", "max_logit", "sink_mass")},
            }
            for s in (1, 101)
        ]
        (run / "attention_stats.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    monkeypatch.chdir(tmp_path)
    assert report_main(["--compare", f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"]) == 0
    assert (tmp_path / "reports" / "compare" / "stats_over_training.png").stat().st_size > 0
    assert report_main(["--compare", "no-label"]) == 2


def test_a_pair_with_one_seed_on_one_side_is_left_untested(tmp_path):
    dirs = fake_study(tmp_path, SEEDS, STUDY)
    for d in dirs[1:]:
        shutil.rmtree(d / "16-none-0.02")  # that cell still runs: only seed 0 has finished
    summary = build_report(dirs, reports=tmp_path / "r", draw=False)
    pairs = {p["where"]: p for p in summary["scaled_vs_unscaled"]}
    assert pairs["d_k=16, init_std=0.02"]["verdict"] == "untested" and pairs["d_k=16, init_std=0.02"]["n"] == [1, 6]
    assert sum(p["beyond_noise"] for p in pairs.values()) == 1 and summary["seeds_per_cell"] == "1-6"


CROSSED = {  # (bos, sink) -> val loss per seed: BOS helps by 0.1 in every stratum, the sink axis does nothing
    ("False", "none"): [2.00, 2.02, 2.04],
    ("True", "none"): [1.90, 1.92, 1.94],
    ("False", "learned"): [2.01, 2.03, 2.02],
    ("True", "learned"): [1.91, 1.93, 1.92],
}


def _crossed_study(root: Path, losses: dict) -> Path:
    for (bos, sink), values in losses.items():
        for seed, loss in enumerate(values):
            fake_run(
                root,
                f"{bos}-{sink}-{seed}",
                [f"data.bos={bos}", f"model.attention.escape={sink}", f"seed={seed}"],
                loss,
            )
    return root


def test_a_crossed_study_reports_each_axis_pooled_over_the_other(tmp_path):
    summary = build_report(_crossed_study(tmp_path / "s", CROSSED), reports=tmp_path / "r", draw=False)
    bos, sink = summary["pooled_effects"]
    assert bos["ci95"][0] < -0.1 < bos["ci95"][1] < 0 and sink["ci95"][0] < 0 < sink["ci95"][1]
    assert bos["axis"] == "data.bos" and bos["diff"] == pytest.approx(-0.1) and bos["beyond_noise"]
    assert sink["level"] == "learned" and sink["reference"] == "none" and not sink["beyond_noise"]
    flat = {k: [v - 0.1 * (k[0] == "False") for v in vals] for k, vals in CROSSED.items()}  # BOS does nothing either
    bos2 = build_report(_crossed_study(tmp_path / "flat", flat), reports=tmp_path / "r2", draw=False)["pooled_effects"][
        0
    ]
    assert not bos2["beyond_noise"] and abs(bos2["diff"]) < 0.01


def test_pooled_effect_matches_a_stratified_welch_by_hand(tmp_path):
    build_report(_crossed_study(tmp_path / "s", CROSSED), reports=tmp_path / "r", draw=False)
    cells = cells_from_runs(read_runs(tmp_path / "r" / "fake" / "runs.csv"))
    effect = pooled(cells, ["data.bos", "model.attention.escape"], "val/loss")[0]
    v = [statistics.variance(x) / 3 for x in CROSSED.values()]
    se = math.sqrt(sum(v)) / 2
    assert effect["diff"] == pytest.approx(-0.1) and effect["test"].p == pytest.approx(
        2 * scipy_stats.t.sf(0.1 / se, sum(v) ** 2 / sum(x**2 / 2 for x in v))
    )
    assert effect["test"].df == pytest.approx(sum(v) ** 2 / sum(x**2 / 2 for x in v))


def test_text_val_windows_do_not_depend_on_the_training_seed():
    from attnlab.data import TextDataModule

    windows = []
    for seed in (0, 7):
        dm = TextDataModule(block_size=16, batch_size=2, steps=4, val_batches=2, seed=seed)
        dm.setup("fit")
        dm.train_dataloader()
        windows.append((dm.val_set.offsets.clone(), dm.train_set.offsets.clone()))
    assert torch.equal(windows[0][0], windows[1][0])  # the same validation windows for both seeds
    assert not torch.equal(windows[0][1], windows[1][1])  # while the training windows differ


def test_task_val_stream_does_not_depend_on_the_training_seed():
    from attnlab.data.tasks import InductionDataModule

    sets = []
    for seed in (0, 7):
        dm = InductionDataModule(vocab_size=64, block_size=32, batch_size=4, steps=2, val_batches=2, seed=seed)
        dm.setup("fit")
        sets.append((dm.val_set.sequences(0)[0], dm.train_set.sequences(0)[0]))
    assert (sets[0][0] == sets[1][0]).all() and not (sets[0][1] == sets[1][1]).all()


def test_a_sweep_killed_and_started_again_finishes_each_run_once(tmp_path):
    """A sweep killed (SIGKILL, the whole process group) after its first run, started again with the same
    command: it goes on in the same dir, trains only the runs left, and each cell and seed ends once; a
    third start finds every run in the study's runs.csv and trains nothing."""
    args = [
        *("--study", "smoke", "--seeds", "2", "--jobs", "1"),
        *("model.d_k=16", "model.init_std=0.02", "model.attention.scaling=none,inv_sqrt_d", "logger=csv"),
        *("model.n_layer=1",),
        *("model.d_model=32", "model.n_head=2", "data.batch_size=2", "callbacks=none"),
    ]
    cmd = [sys.executable, "-m", "attnlab.sweeps.sweep", "--logs", str(tmp_path / "logs"), *args]
    env = {
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "HOME": str(tmp_path),
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    done: list[Path] = []
    while not done and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.02)  # an in-process smoke run can end within half a second: kill before the next one does
        done = [p for p in (tmp_path / "logs").glob("*/*/results.json") if json.loads(p.read_text())["status"] == "ok"]
    os.killpg(first.pid, 9)
    first.wait()
    assert len(done) == 1, "the first run did not finish before the deadline"
    kept = done[0].stat()

    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    (sweep,) = (tmp_path / "logs").iterdir()  # the same dir, not a new one
    results = [json.loads(p.read_text()) for p in sweep.glob("*/results.json")]
    cells = [(r["config"]["model"]["attention"]["scaling"], r["config"]["seed"]) for r in results]
    assert sorted(cells) == sorted({(s, seed) for s in ("none", "inv_sqrt_d") for seed in (0, 1)})
    assert all(r["status"] == "ok" for r in results)
    assert (done[0].stat().st_ino, done[0].stat().st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    assert re.search(r"(\d+) trained ok, 0 failed, 1 skipped as finished before \(1 in this sweep dir", again.stdout)
    assert int(re.search(r"(\d+) trained ok", again.stdout).group(1)) == 3
    assert len(read_runs(tmp_path / "reports" / "smoke" / "runs.csv")) == 4

    third = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert third.returncode == 0, third.stderr[-2000:]
    counts = re.search(
        r"(\d+) trained ok, (\d+) failed, (\d+) skipped as finished before \((\d+) in this sweep dir, (\d+) in",
        third.stdout,
    )
    assert tuple(map(int, counts.groups())) == (0, 0, 4, 0, 4)  # every run read from runs.csv, none trained
    assert len(read_runs(tmp_path / "reports" / "smoke" / "runs.csv")) == 4


def test_a_job_skips_only_a_run_of_the_same_cell_seed_and_settings(tmp_path, monkeypatch):
    """finished_before: its own ok results.json of the same fingerprint and seed, or a runs.csv row of the
    same cell, seed and fingerprint; a changed setting, seed or cell trains again; outside a sweep, never."""
    config = {"seed": 1, "model": {"d_k": 16}, "data": {"batch_size": 2}, "optim": {"lr": 1e-3}, "trainer": {}}
    other = {**config, "optim": {"lr": 3e-3}}
    run = tmp_path / "3"
    run.mkdir()
    listing = tmp_path / "finished.json"
    row = {"axes": {"model.d_k": "16", "variant": "-"}, "seed": "1", "config": training_fingerprint(config)}
    listing.write_text(json.dumps({"runs": [row | {"where": "reports/s/runs.csv"}]}))
    assert finished_before(run, config, ["model.d_k=16", "seed=1"]) is None  # not inside a sweep
    monkeypatch.setenv(FINISHED_ENV, str(listing))
    assert finished_before(run, config, ["model.d_k=16", "seed=1"])["where"] == "reports/s/runs.csv"
    assert finished_before(run, other, ["model.d_k=16", "seed=1"]) is None
    assert finished_before(run, {**config, "seed": 2}, ["model.d_k=16", "seed=2"]) is None
    assert finished_before(run, config, ["model.d_k=32", "seed=1"]) is None
    assert finished_before(run, config, ["model.d_k=16", "seed=1", "variant=mqa"]) is None
    # a row without a fingerprint is trained again: the report replaces it with the new run
    older = {"axes": {"model.d_k": "32", "variant": "-"}, "seed": "1", "config": "", "where": "reports/s/runs.csv"}
    listing.write_text(json.dumps({"runs": [row | {"where": "reports/s/runs.csv"}, older]}))
    assert finished_before(run, other, ["model.d_k=32", "seed=1"]) is None
    (run / "results.json").write_text(json.dumps({"status": "ok", "config": other}))
    assert finished_before(run, other, [])["in_run_dir"] and finished_before(run, {**other, "seed": 2}, []) is None
    (run / "results.json").write_text(json.dumps({"status": "failed", "config": other}))
    assert finished_before(run, other, []) is None
    # a job cut short goes on from its checkpoint only when it trained the same settings
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / FINGERPRINT).write_text(training_fingerprint(config) + "\n")
    assert resumable(run, config) and not resumable(run, other)
    monkeypatch.delenv(FINISHED_ENV)
    assert not resumable(run, config)
