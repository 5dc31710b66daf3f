"""Faults and bad input: kill and resume, atomic checkpoints, signals, DDP, bf16, masked rows."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from attnlab.attention import BACKENDS, attend
from attnlab.training.checkpointing import AtomicCheckpointIO
from attnlab.training.interrupt import Interrupted
from attnlab.training.train import train

# small and quick, with dropout so that the RNG state matters on resume
RUN = [
    "logger=csv",
    "model.n_layer=2",
    "model.d_model=64",
    "model.dropout=0.1",
    "data.val_batches=2",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "callbacks.attention_stats.every_n_steps=25",
    "checkpoint.every_n_steps=20",
    "optim.warmup_steps=5",
]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnlab.training.train", *args]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def start_and_signal(run_dir: Path, sig: int, *args: str) -> subprocess.CompletedProcess:
    """Start a run, wait for its first last.ckpt, then send ``sig`` while it is still training.

    Output goes to files, not pipes: a child that fills an unread pipe blocks, and a loaded
    machine must not turn that into a timeout."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    out, err = run_dir.parent / f"{run_dir.name}.stdout", run_dir.parent / f"{run_dir.name}.stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            cli(*RUN, *args, f"hydra.run.dir={run_dir}"), cwd=ROOT, env=env(), stdout=stdout, stderr=stderr, text=True
        )
        ckpt = run_dir / "checkpoints" / "last.ckpt"
        deadline = time.time() + 240
        while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be interrupted: " + err.read_text()[-2000:]
        proc.send_signal(sig)
        proc.wait(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


def train_losses(run_dir: Path) -> dict[int, float]:
    rows = csv.DictReader(open(run_dir / "csv" / "version_0" / "metrics.csv"))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def test_sigkill_then_resume_matches_uninterrupted_run_bitwise(tmp_path):
    steps = "trainer.max_steps=200"
    whole = subprocess.run(
        cli(*RUN, steps, f"hydra.run.dir={tmp_path / 'whole'}"), cwd=ROOT, env=env(), capture_output=True, text=True
    )
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed_dir = tmp_path / "killed"
    proc = start_and_signal(killed_dir, signal.SIGKILL, steps)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed_dir / "results.json").exists() or results(killed_dir)["status"] != "ok"
    resumed = subprocess.run(
        cli(*RUN, steps, "resume=true", f"hydra.run.dir={killed_dir}"),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = results(tmp_path / "whole")["metrics"], results(killed_dir)["metrics"]
    assert b["step"] == 200
    # CPU kernels are deterministic for the same inputs: same data order, RNG and optimizer state
    # must give the same numbers bit for bit
    assert a["val/loss"] == b["val/loss"] and a["train/loss"] == b["train/loss"]


def test_resume_continues_the_same_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    args = [*RUN, "logger=wandb", "trainer.max_steps=60", "checkpoint.every_n_steps=20"]
    proc = start_and_signal(run_dir, signal.SIGTERM, *args[1:], "logger=wandb")
    assert proc.returncode == 130, proc.stderr[-2000:]
    first_id = (run_dir / "wandb_run_id").read_text()
    resumed = subprocess.run(
        cli(*args, "resume=true", f"hydra.run.dir={run_dir}"), cwd=ROOT, env=env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (run_dir / "wandb_run_id").read_text() == first_id
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(p.name.endswith(first_id) for p in offline_runs)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])  # SIGUSR2: a scheduler's warning, outside submitit
def test_sigterm_saves_checkpoint_and_marks_interrupted(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = start_and_signal(run_dir, sig, "trainer.max_steps=300")
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and f"{sig.name} at step" in proc.stderr
    record = results(run_dir)
    assert record["status"] == "interrupted" and sig.name in record["error"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert 20 <= ckpt["global_step"] < 300
    # what it reached, and the interruption, are in the record
    assert record["metrics"]["step"] == ckpt["global_step"] and "train/loss" in record["metrics"]
    assert record["interruptions"] == [{"signal": sig.name, "step": ckpt["global_step"], "requeued": False}]


def test_sigterm_during_training_is_ours_not_lightnings(make_cfg):
    """Lightning installs its own SIGTERM handler after on_fit_start; it raises SIGTERMException (a
    SystemExit: exit 0, no checkpoint, no record) at the next batch or validation step. During the
    training steps the handler must be attnlab's, and outside fit the original one again."""
    import signal_probe

    from attnlab.training.interrupt import GracefulInterrupt

    before = signal.getsignal(signal.SIGTERM)
    signal_probe.RecordSigtermHandler.handlers = []
    train(make_cfg("+callbacks.probe._target_=signal_probe.RecordSigtermHandler"))
    seen = signal_probe.RecordSigtermHandler.handlers
    assert seen and all(isinstance(getattr(h, "__self__", None), GracefulInterrupt) for h in seen), seen
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_in_the_closing_validation_is_recorded_as_an_interruption(make_cfg):
    cfg = make_cfg(
        "+callbacks.probe._target_=signal_probe.SigtermInClosingValidation", "trainer.val_check_interval=4"
    )  # 6 steps: the closing validation runs
    with pytest.raises(Interrupted, match="SIGTERM at step"):
        train(cfg)
    record = results(Path(cfg.paths.output_dir))
    assert record["status"] == "interrupted" and record["interruptions"][-1]["signal"] == "SIGTERM"
    assert record["metrics"]["step"] == cfg.trainer.max_steps


def test_a_stop_at_a_logging_step_keeps_that_steps_logged_row(make_cfg):
    """Lightning writes a step's logged values only after the batch-end hooks, where the stop is
    raised: the interrupted step's train/loss must still reach the CSV (a requeued attempt resumes
    after it, so nothing else would write it)."""
    cfg = make_cfg(
        "logger=csv",
        "trainer.log_every_n_steps=2",
        "+callbacks.probe._target_=signal_probe.SignalAtStep",
        "+callbacks.probe.step=3",
    )
    with pytest.raises(Interrupted, match="SIGUSR2 at step 4"):
        train(cfg)
    rows = list(csv.DictReader(open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv")))
    assert sorted(int(r["step"]) for r in rows if r.get("train/loss")) == [1, 3]
    assert results(Path(cfg.paths.output_dir))["interruptions"] == [{"signal": "SIGUSR2", "step": 4, "requeued": False}]


def test_a_requeued_attempt_resumes_its_run_dir_without_resume_true(make_cfg, monkeypatch):
    """SLURM_RESTART_COUNT says the job was requeued: the run continues its own newest intact
    checkpoint (last.ckpt damaged here, so step4.ckpt), replays the lost steps exactly, and keeps
    the earlier interruptions."""
    cfg = make_cfg("callbacks=default", "checkpoint.every_n_steps=2", "checkpoint.keep=-1")
    run_dir = Path(cfg.paths.output_dir)
    first = train(cfg)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")  # the attempt was killed mid-save
    (run_dir / "checkpoints" / "step6.ckpt").unlink()
    record = results(run_dir)
    record["interruptions"] = [{"signal": "SIGUSR2", "step": 4, "requeued": True}]
    (run_dir / "results.json").write_text(json.dumps(record))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = train(cfg)
    record = results(run_dir)
    assert record["resumed_from"]["step"] == 4 and record["resumed_from"]["requeued_attempt"] == 2
    assert (
        record["resumed_from"]["path"].endswith("step4.ckpt")
        and "last.ckpt" in record["resumed_from"]["skipped"][0]["path"]
    )
    assert record["interruptions"] == [{"signal": "SIGUSR2", "step": 4, "requeued": True}]
    assert again["val/loss"] == first["val/loss"] and again["step"] == 6


def test_sigint_is_graceful_too(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_and_signal(run_dir, signal.SIGINT, "trainer.max_steps=300")
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert results(run_dir)["status"] == "interrupted"


def test_interrupted_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(4.0)}, path)

    def dies_mid_write(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # e.g. the process is stopped during the save

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(4)}, path)
    monkeypatch.undo()
    loaded = io.load_checkpoint(path)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.arange(4.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temp file left behind


def test_checkpoints_load_with_weights_only(make_cfg):
    cfg = make_cfg("callbacks=default")
    train(cfg)
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6 and "rng" in ckpt and "state_dict" in ckpt


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_mixed_trains_with_every_backend(backend, make_cfg):
    m = train(make_cfg(f"attention={backend}", "trainer.precision=bf16-mixed", "callbacks=none"))
    assert torch.isfinite(torch.tensor(m["val/loss"])) and m["val/loss"] < 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_masked_rows_agree_across_backends(dtype):
    """Padding that hides every key from some queries: zeros, never NaN, the same in every backend."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16, dtype=dtype) for _ in range(3))
    kpm = torch.ones(2, 8, dtype=torch.bool)
    kpm[1, :4] = False  # left padding: queries 0..3 of batch 1 see nothing
    outs = {b: attend(b, q, k, v, 0.25, key_padding_mask=kpm)[0].float() for b in BACKENDS}
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for b, out in outs.items():
        assert torch.isfinite(out).all(), b
        assert torch.equal(out[1, :, :4], torch.zeros_like(out[1, :, :4])), b
        torch.testing.assert_close(out, outs["sdpa"], atol=tol, rtol=tol, msg=b)


def test_ddp_two_processes_match_one_process(tmp_path):
    """Two gloo processes with batch 6 each see the same 12 windows per step as one process with 12."""
    common = [
        *[a for a in RUN if not a.startswith("callbacks.")],
        "model.dropout=0.0",
        "trainer.max_steps=15",
        "callbacks=none",
        "trainer.val_check_interval=15",
    ]
    one = subprocess.run(
        cli(*common, "data.batch_size=12", f"hydra.run.dir={tmp_path / 'one'}"),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        cli(
            *common,
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "data.batch_size=6",
            f"hydra.run.dir={tmp_path / 'two'}",
        ),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert len(list((tmp_path / "two").glob("**/results.json"))) == 1
    assert results(tmp_path / "two")["status"] == "ok"
    a, b = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(a) == sorted(b) and len(a) == 15
    for step in a:  # same data and gradients; only the order of float additions differs
        assert b[step] == pytest.approx(a[step], abs=1e-4), step
