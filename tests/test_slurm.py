"""Studies on a live one-node SLURM cluster (tests/slurm_cluster.py): a sweep through sbatch, a time
limit that requeues a run which then resumes bit for bit, a requeue by SLURM itself, and scancel.

Marked ``slurm``; skipped, in one line, where Debian's slurm-wlm and munge are not installed or
not root; CI installs them (.ci/run). Runs are tiny; the cluster is shared by the pytest-xdist
workers of one session. The launcher's bad input is checked without a cluster: test_launchers.py.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT
from slurm_cluster import SlurmCluster, missing, shared_cluster

from attnlab.training.checkpointing import read_checkpoint

# CI sets ATTNLAB_REQUIRE_SLURM (.ci/run): there a missing cluster fails the tests instead of skipping them
REQUIRED = bool(os.environ.get("ATTNLAB_REQUIRE_SLURM"))
WHY_NOT = missing()
if WHY_NOT and not REQUIRED:
    pytest.skip(WHY_NOT, allow_module_level=True)  # one line for the whole module
pytestmark = pytest.mark.slurm

# a small model with dropout (the RNG state matters on resume), checkpoints kept, the measuring callbacks off
TINY = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.dropout=0.1",
    "data.val_batches=2",
    "optim.warmup_steps=5",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=10",
    "~callbacks.heads",
    "~callbacks.attention_maps",
    "~callbacks.attention_stats",
    "~callbacks.peak_memory",
    "~callbacks.qk_grad_norms",
]
ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> SlurmCluster:
    if WHY_NOT:
        pytest.fail(f"{WHY_NOT} (ATTNLAB_REQUIRE_SLURM is set)")
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = Path(tempfile.gettempdir()) / f"attnlab-slurm-{run_id}" if run_id else tmp_path_factory.mktemp("slurm")
    with shared_cluster(root) as shared:
        yield shared


def job_env(cluster: SlurmCluster) -> dict:
    return {**os.environ, **cluster.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def start(args: list[str], cluster: SlurmCluster, log: Path, cwd: Path = ROOT) -> subprocess.Popen:
    """A command in the background, its output in a file (an unread pipe would block it)."""
    with open(log, "w") as out:
        return subprocess.Popen(args, cwd=cwd, env=job_env(cluster), stdout=out, stderr=subprocess.STDOUT, text=True)


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnlab.training.train", *args]


def train_losses(csv_dir: Path) -> dict[int, float]:
    rows = csv.DictReader(open(csv_dir / "metrics.csv"))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.time() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        tail = log.read_text()[-3000:] if log and log.exists() else ""
        assert proc is None or proc.poll() is None, f"ended before {what}:\n{tail}"
        assert time.time() < deadline, f"no {what} after {timeout_s:.0f} s:\n{tail}"
        time.sleep(0.5)


def job_of(cluster: SlurmCluster, sweep_dir: Path) -> str:
    """The SLURM id of the sweep's only job (submitit submits one job, not an array of one), from the
    folder submitit names after it."""
    names = [p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir()]
    assert len(names) == 1, names
    return names[0]


def time_limit(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("squeue", "-h", "-j", job, "-o", "%l", check=False).stdout.strip()


def test_sweep_through_sbatch_ends_ok_with_its_table(cluster, tmp_path):
    """`attnlab sweep --launcher slurm`: two cells as one job array, both ok, the table built as for a
    local sweep, and the console says once (not every poll) that sacct has no accounting."""
    env = {**job_env(cluster), "HOME": str(tmp_path)}
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.sweeps.sweep",
            "--launcher",
            "slurm",
            "--study",
            "smoke",
            "--logs",
            str(tmp_path / "logs"),
            "model.d_k=16",
            "model.init_std=0.02",
            "logger=csv",
            "model.n_layer=1",
            "model.d_model=32",
            "model.n_head=2",
            "data.batch_size=2",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "logs").iterdir()
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert len({r["slurm"]["array_job_id"] for r in records}) == 1  # one array, not two jobs
    assert sorted(r["slurm"]["array_task_id"] for r in records) == ["0", "1"]
    assert all(r["metrics"]["step"] == 6 and math.isfinite(r["metrics"]["val/loss"]) for r in records)
    rows = list(csv.DictReader(open(tmp_path / "reports" / "smoke" / "ablation.csv")))
    assert sorted(r["model.attention.scaling"] for r in rows) == ["inv_sqrt_d", "none"]
    assert all(r["n_ok"] == "1" and math.isfinite(float(r["val/loss_mean"])) for r in rows)
    console = proc.stdout + proc.stderr
    assert "Bypassing" not in console and console.count("sacct") <= 1, console[-3000:]
    print(f"2-job sweep through sbatch: {wall:.0f} s")


def steps_for(seconds: float, cluster: SlurmCluster, tmp_path: Path) -> int:
    """How many steps of TINY take about ``seconds`` on this machine now (from a 100-step run's median
    tokens/s): the run has to outlast the scheduler's signal, which comes at its next 30 s tick."""
    proc = subprocess.run(
        train_cmd(*TINY, "logger=none", "trainer.max_steps=100", f"hydra.run.dir={tmp_path / 'calibrate'}"),
        cwd=ROOT,
        env=job_env(cluster),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    tokens_per_step = 12 * 64  # the tiny preset's batch x block
    step_s = tokens_per_step / results(tmp_path / "calibrate")["metrics"]["perf/tokens_per_s"]
    return max(1000, int(seconds / step_s) // 100 * 100)


def test_time_limit_signals_requeues_and_resumes_bitwise(cluster, tmp_path):
    """A job whose time limit is cut short gets submitit's SIGUSR2: the run saves at a step boundary,
    says `interrupted` (requeued) in results.json, submitit requeues it, and the next attempt resumes
    from its own run dir with nothing typed, continues the same W&B run, and ends with the same losses,
    bit for bit, as an uninterrupted run of the same seed."""
    steps = steps_for(70, cluster, tmp_path)
    run = [
        *TINY,
        f"trainer.max_steps={steps}",
        "trainer.val_check_interval=500",
        "checkpoint.every_n_steps=50",
        "seed=7",
    ]
    whole = start(train_cmd(*run, "logger=csv", f"hydra.run.dir={tmp_path / 'whole'}"), cluster, tmp_path / "whole.log")
    sweep = tmp_path / "sweep"
    log = tmp_path / "sweep.log"
    # the signal 300 s before the time limit, which is 10 min until the test cuts it
    proc = start(
        train_cmd(
            "-m",
            *ON_SLURM,
            "hydra.launcher.timeout_min=10",
            "hydra.launcher.signal_delay_s=300",
            "hydra.launcher.max_num_timeout=1",
            *run,
            "logger=default",
            f"hydra.sweep.dir={sweep}",
        ),
        cluster,
        log,
    )
    run_dir = sweep / "0"
    wait_for(lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), 300, "first checkpoint", proc, log)
    job = job_of(cluster, sweep)
    elapsed_min = int(cluster.run("squeue", "-h", "-j", job, "-o", "%M").stdout.strip().split(":")[-2] or 0)
    cluster.run("scontrol", "update", f"JobId={job}", f"TimeLimit={elapsed_min + 2}")  # now within signal_delay_s
    first = wait_for(
        lambda: (
            (run_dir / "results.json").exists() and results(run_dir)["status"] == "interrupted" and results(run_dir)
        ),
        120,
        "interruption",
        proc,
        log,
    )
    # the next attempt gets the long limit back (it waits cred_expire, 10 s, before it may start)
    wait_for(
        lambda: (
            cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10", check=False).returncode == 0
            and time_limit(cluster, job) == "10:00"
        ),
        30,
        "the time limit restored",
    )
    assert first["interruptions"] == [{"signal": "SIGUSR2", "step": first["metrics"]["step"], "requeued": True}], first
    assert "requeued by the scheduler" in first["error"] and first["metrics"]["step"] < steps
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert whole.wait(timeout=600) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    final, reference = results(run_dir), results(tmp_path / "whole")
    assert final["status"] == "ok" and final["metrics"]["step"] == steps
    assert final["slurm"]["restarts"] == 1 and final["resumed_from"]["requeued_attempt"] == 2
    assert final["resumed_from"]["step"] == first["metrics"]["step"] > 0
    assert final["interruptions"] == first["interruptions"]  # the history stays with the run
    assert final["metrics"]["val/loss"] == reference["metrics"]["val/loss"]
    # the two attempts' logged train losses, together, are the uninterrupted run's curve, bit for bit
    before, after = (train_losses(run_dir / "csv" / f"version_{v}") for v in (0, 1))
    assert max(before) < first["metrics"]["step"] <= min(after) and max(after) >= steps - 10
    assert {**before, **after} == train_losses(tmp_path / "whole" / "csv" / "version_0")
    run_id = (run_dir / "wandb_run_id").read_text()
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(run_id) for name in offline)  # one W&B run, two attempts


def test_requeue_then_scancel_each_leave_a_record_and_a_checkpoint(cluster, tmp_path):
    """What a preemption with PreemptMode=REQUEUE does (``scontrol requeue``: SIGTERM, then SLURM runs
    the job again): the run saves, says requeued, and the next attempt resumes by itself while the
    sweep waits. Then scancel (SIGTERM, no requeue): it saves, says interrupted, not requeued, with the
    step it reached, and the sweep ends instead of waiting for a result."""
    sweep, log = tmp_path / "sweep", tmp_path / "sweep.log"
    proc = start(
        train_cmd(
            "-m",
            *ON_SLURM,
            *TINY,
            "trainer.max_steps=100000",
            "checkpoint.every_n_steps=20",
            "logger=csv",
            f"hydra.sweep.dir={sweep}",
        ),
        cluster,
        log,
    )
    run_dir, last = sweep / "0", sweep / "0" / "checkpoints" / "last.ckpt"
    wait_for(last.exists, 300, "first checkpoint", proc, log)
    job = job_of(cluster, sweep)
    cluster.run("scontrol", "requeue", job)
    first = wait_for(
        lambda: (run_dir / "results.json").exists() and results(run_dir), 120, "the requeued record", proc, log
    )
    assert first["status"] == "interrupted" and "requeued by SLURM" in first["error"], first["error"]
    reached = first["metrics"]["step"]
    assert first["interruptions"] == [{"signal": "SIGTERM", "step": reached, "requeued": True}]
    # the next attempt: resumed from that step, and on to a checkpoint of its own
    wait_for(lambda: read_checkpoint(last)["global_step"] > reached, 300, "the next attempt's checkpoint", proc, log)
    cluster.run("scancel", job)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    record = results(run_dir)
    assert record["status"] == "interrupted" and record["error"].startswith("SIGTERM at step"), record["error"]
    assert f"resume=true hydra.run.dir={run_dir}" in record["error"]
    assert record["resumed_from"]["step"] == reached and record["slurm"]["restarts"] == 1
    assert record["interruptions"][0] == first["interruptions"][0]
    stopped = record["interruptions"][1]
    assert stopped["requeued"] is False and stopped["step"] == record["metrics"]["step"] > reached
    assert read_checkpoint(last)["global_step"] == record["metrics"]["step"]
