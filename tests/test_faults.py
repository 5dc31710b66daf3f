"""Faults a long study meets: damaged checkpoints, writes the disk refuses, a model that
cannot fit in memory. Each ends in one line, a non-zero exit, a results.json that says what
happened, and no intact checkpoint lost."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli
from test_cli import SMOKE, assert_one_line_error, run_main

from attnlab.config.compose import compose_config
from attnlab.config.schema import Schema
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.training.checkpointing import AtomicCheckpointIO, load_model, newest_intact, read_checkpoint
from attnlab.training.lit_module import GPTModule
from attnlab.training.resources import check_fits, estimate_step, out_of_memory
from attnlab.training.train import train
from attnlab.util.errors import CheckpointError, OutOfMemory, WriteFailed
from attnlab.util.profiling import peak_bytes

SMALL = ["model.n_layer=1", "model.d_model=32", "model.n_head=2"]


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A real attnlab checkpoint (what Lightning writes for GPTModule), made without training."""
    module = GPTModule(
        {"vocab_size": 11, "block_size": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
        {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 0, "weight_decay": 0.1, "betas": [0.9, 0.99]},
        10,
        vocab=list("abcdefghij\n"),
    )
    path = tmp_path / "good.ckpt"
    AtomicCheckpointIO().save_checkpoint(
        {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 7, "epoch": 0},
        path,
    )
    return path


def damage(good: Path, how: str) -> Path:
    """A copy of ``good`` damaged the way a real fault would."""
    data = good.read_bytes()
    bad = good.with_name(f"{how}.ckpt")
    if how == "truncated":
        bad.write_bytes(data[: len(data) // 2])  # a copy or a write cut short
    elif how == "random":
        bad.write_bytes(os.urandom(len(data)))
    elif how == "empty":
        bad.write_bytes(b"")
    elif how == "flipped":  # one byte of tensor data changed: torch.load alone would not notice
        i = data.index(b"data/0") + 200
        bad.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    elif how == "foreign":  # a valid torch file, but not a checkpoint attnlab wrote
        torch.save({"weights": torch.zeros(3)}, bad)
    elif how == "unreadable":
        bad.mkdir()
    return bad


PROBLEMS = {
    "truncated": "is truncated",
    "random": "not a zip archive",
    "empty": "is empty",
    "flipped": "fails its checksum",
    "foreign": "not an attnlab checkpoint (no state_dict, hyper_parameters, global_step)",
    "unreadable": "cannot be read",
}


@pytest.mark.parametrize("how", sorted(PROBLEMS))
def test_read_checkpoint_names_the_file_and_the_fault(how, checkpoint):
    assert read_checkpoint(checkpoint)["global_step"] == 7
    bad = damage(checkpoint, how)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(bad)
    assert str(bad) in str(info.value) and PROBLEMS[how] in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("how", ["truncated", "random", "foreign"])
def test_ckpt_path_to_a_damaged_file_is_one_line(how, checkpoint, tmp_path, monkeypatch, capsys):
    bad = damage(checkpoint, how)
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, f"ckpt_path={bad}", f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(code, err, "ckpt_path")
    assert str(bad) in err and PROBLEMS[how] in err
    record = results(tmp_path / "run")
    assert record["status"] == "failed" and PROBLEMS[how] in record["error"]


@pytest.mark.parametrize("how", ["truncated", "flipped", "foreign"])
def test_sample_and_analyze_refuse_a_damaged_checkpoint_in_one_line(how, checkpoint, capsys):
    from attnlab.inference import analyze, sample

    bad = damage(checkpoint, how)
    with pytest.raises(SystemExit) as info:
        sample.main([str(bad), "--tokens", "5"])
    assert str(bad) in str(info.value.code) and PROBLEMS[how] in str(info.value.code)
    with pytest.raises(SystemExit) as info:
        analyze.main([str(bad), "--no-plot"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert_one_line_error(2, err, str(bad))
    assert PROBLEMS[how] in err


def test_sample_reads_an_intact_checkpoint(checkpoint):
    from attnlab.inference.sample import sample

    module, ckpt = load_model(checkpoint)
    assert ckpt["global_step"] == 7 and module.model.cfg.block_size == 16
    text = sample(checkpoint, prompt="ab", tokens=5)
    assert text.startswith("ab") and len(text) == 7


def test_newest_intact_skips_damaged_files_and_touches_none(checkpoint, tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for i, name in enumerate(["step2.ckpt", "step4.ckpt", "last.ckpt"]):
        shutil.copy(checkpoint, ckpts / name)
        os.utime(ckpts / name, (1000 + i, 1000 + i))
    assert newest_intact(ckpts)[0].name == "last.ckpt"
    (ckpts / "last.ckpt").write_bytes(b"PK\x03\x04 cut")
    (ckpts / "step4.ckpt").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    path, step, skipped = newest_intact(ckpts)
    assert path.name == "step2.ckpt" and step == 7
    assert [p.name for p, _ in skipped] == ["last.ckpt", "step4.ckpt"]
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before  # nothing deleted or rewritten


# ---- resume=true over a damaged last.ckpt ---------------------------------------------------------

RESUMABLE = [
    "debug=smoke",
    "logger=none",
    "callbacks=default",
    *SMALL,
    "model.dropout=0.1",
    "checkpoint.every_n_steps=4",
    "callbacks.attention_stats.every_n_steps=3",
]


@pytest.mark.parametrize("max_steps, kept", [(8, ["step6.ckpt", "step8.ckpt"]), (7, ["step4.ckpt", "step6.ckpt"])])
def test_checkpoints_kept_beside_last(max_steps, kept, make_cfg):
    """checkpoint.keep=2: the two newest periodic checkpoints stay, older ones are rotated out.
    Validation runs at steps 3 and 6 (debug=smoke): a checkpoint at step 8 must not wait for one,
    and with max_steps=7 last.ckpt still holds step 7."""
    cfg = make_cfg(*RESUMABLE, "checkpoint.every_n_steps=2", f"trainer.max_steps={max_steps}", fast=False)
    train(cfg)
    ckpts = Path(cfg.paths.output_dir) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", *kept]
    assert read_checkpoint(ckpts / kept[0])["global_step"] == int(kept[0][4])
    assert read_checkpoint(ckpts / "last.ckpt")["global_step"] == max_steps


@pytest.mark.slow
def test_resume_over_a_damaged_last_ckpt_falls_back_and_matches_bitwise(make_cfg, capsys):
    whole = make_cfg(*RESUMABLE, fast=False)
    expected = train(whole)
    ckpts = Path(whole.paths.output_dir) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step4.ckpt"]
    step4 = (ckpts / "step4.ckpt").read_bytes()
    last = ckpts / "last.ckpt"
    last.write_bytes(last.read_bytes()[:5000])  # the disk failed under it
    capsys.readouterr()
    resumed = train(compose_config([*RESUMABLE, "resume=true"], Path(whole.paths.output_dir)))
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("attnlab:")]
    assert (
        len(notes) == 1 and "last.ckpt is truncated" in notes[0] and "resuming from step4.ckpt (step 4)" in notes[0]
    ), err
    record = results(Path(whole.paths.output_dir))
    assert record["status"] == "ok"
    assert record["resumed_from"]["path"] == str(ckpts / "step4.ckpt") and record["resumed_from"]["step"] == 4
    assert record["resumed_from"]["skipped"][0]["path"] == str(last)
    # the two steps after step 4 were replayed with the same data, RNG and optimizer state
    assert resumed["val/loss"] == expected["val/loss"] and resumed["train/loss"] == expected["train/loss"]
    assert (ckpts / "step4.ckpt").read_bytes() == step4  # the intact checkpoint it resumed from is untouched
    assert read_checkpoint(last)["global_step"] == 6  # the damaged last.ckpt was replaced by a good one


def test_resume_with_no_intact_checkpoint_is_one_line(checkpoint, tmp_path, monkeypatch, capsys):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "last.ckpt").write_bytes(checkpoint.read_bytes()[:3000])
    (ckpts / "step4.ckpt").write_bytes(os.urandom(300))
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, "resume=true", f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(code, err, "resume=true")
    assert "last.ckpt is truncated" in err and "step4.ckpt is not a PyTorch checkpoint" in err
    assert results(tmp_path / "run")["status"] == "failed"
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before


# ---- writes the disk refuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, reason", [(errno.ENOSPC, "No space left on device"), (errno.EACCES, "Permission denied")]
)
def test_failed_checkpoint_write_says_what_where_how_large_and_keeps_the_old_file(code, reason, tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(4.0)}, path)

    def refused(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 part of it")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", refused)
    with pytest.raises(WriteFailed) as info:
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    message = str(info.value)
    assert f"cannot write checkpoint {path}" in message and "3.9 KiB" in message and reason in message
    assert "the previous last.ckpt is intact" in message
    assert io.load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_torch_writer_error_without_errno_is_read_as_a_full_disk(tmp_path, monkeypatch):
    """torch's zip writer may report a failed write as a RuntimeError with no errno: the free space decides."""
    path = tmp_path / "last.ckpt"

    def writer_fails(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", writer_fails)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6 - 100, 100))
    with pytest.raises(WriteFailed) as info:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(1000)}, path)
    assert "No space left on device (100 B free)" in str(info.value) and "no earlier last.ckpt existed" in str(
        info.value
    )


def test_checkpoint_write_failure_during_a_run_ends_failed_in_one_line(tmp_path, monkeypatch, capsys):
    from attnlab.training import checkpointing

    atomic_file = checkpointing.atomic_file

    @contextmanager
    def disk_full_at_step4(path, mode="w"):
        with atomic_file(path, mode) as f:
            if Path(path).name == "step4.ckpt":
                f.write(b"PK\x03\x04 the start of it")
                raise OSError(errno.ENOSPC, "No space left on device")
            yield f

    monkeypatch.setattr(checkpointing, "atomic_file", disk_full_at_step4)
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "debug=smoke",
        "logger=none",
        "callbacks=default",
        *SMALL,
        "checkpoint.every_n_steps=2",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 1
    assert_one_line_error(code, err, "cannot write checkpoint")
    assert f"{tmp_path}/run/checkpoints/step4.ckpt" in err and "No space left on device" in err
    assert "last.ckpt there is intact" in err
    record = results(tmp_path / "run")
    assert record["status"] == "failed" and record["error"] in err
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step2.ckpt"]
    assert read_checkpoint(ckpts / "last.ckpt")["global_step"] == 2


def test_results_json_write_failure_is_one_line(tmp_path, monkeypatch, capsys):
    def refused(path, text):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr("attnlab.training.results.atomic_write_text", refused)
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, *SMALL, f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(code, err, "results.json")
    assert "Permission denied" in err and "no earlier results.json existed" in err
    assert not (tmp_path / "run" / "results.json").exists()


def _can_mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.slow
def test_a_really_full_disk(tmp_path):
    """A 25 MB tmpfs holds step2.ckpt and last.ckpt (9.3 MiB each, tiny preset) but not step4.ckpt. Needs root."""
    disk = tmp_path / "disk"
    if not _can_mount_tmpfs(disk, "25m"):
        pytest.skip("needs root and tmpfs")
    try:
        proc = run_cli(
            "debug=smoke", "logger=csv", "callbacks=default", "checkpoint.every_n_steps=2", f"hydra.run.dir={disk}/run"
        )
        assert proc.returncode == 1
        assert_one_line_error(proc.returncode, proc.stderr, "cannot write checkpoint")
        assert (
            "step4.ckpt" in proc.stderr
            and "No space left on device" in proc.stderr
            and "last.ckpt there is intact" in proc.stderr
        )
        record = results(disk / "run")
        assert record["status"] == "failed" and "No space left on device" in record["error"]
        ckpts = disk / "run" / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step2.ckpt"]  # no temp file left
        assert read_checkpoint(ckpts / "last.ckpt")["global_step"] == 2
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ---- memory -----------------------------------------------------------------------------------------


def test_impossible_size_is_refused_before_training(tmp_path, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, "model.block_size=100000", f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(code, err, "model.block_size=100000")
    assert "attention=sdpa" in err and "available" in err and "TiB" in err
    record = results(tmp_path / "run")
    assert record["status"] == "failed" and "does not fit" in record["error"]
    assert not (tmp_path / "run" / "checkpoints").exists()


def _overcommit_refuses_huge() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(
    not _overcommit_refuses_huge(), reason="needs Linux overcommit 0 or 2 (a TB allocation refused at once)"
)
def test_out_of_memory_during_the_run_is_one_line(tmp_path, monkeypatch, capsys):
    """The estimate turned off: the CPU allocator's own refusal, met in the first step, ends the same way."""
    # one sequence of 100000 tokens, one small layer: small activations, a 149 GiB attention matrix
    code, _, err = run_main(
        monkeypatch,
        capsys,
        *SMOKE,
        *SMALL,
        "memory_check=false",
        "model.block_size=100000",
        "data.batch_size=1",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 1
    assert_one_line_error(code, err, "out of memory at step 0")
    assert "an allocation of 74.5 GiB failed" in err and "attention=sdpa" in err
    assert results(tmp_path / "run")["status"] == "failed"


def test_cuda_out_of_memory_message(tmp_path):
    cfg = compose_config(["model.block_size=4096"], tmp_path)
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB")
    typed = Schema.from_cfg(cfg)
    step = estimate_step(typed.model, 10**6, 12)
    line = str(out_of_memory(err, typed, 12, step))
    assert line.startswith("out of memory at step 12 (an allocation of 2.00 GiB failed)") and "attention=sdpa" in line


@pytest.mark.parametrize("backend, t, batch", [("scaled", 256, 8), ("sdpa", 256, 8), ("scaled", 64, 12)])
def test_estimate_is_close_to_the_measured_peak(backend, t, batch):
    """The estimate errs low but not far: it refuses only what cannot fit, and still sees the T x T matrix."""
    cfg = {
        "vocab_size": 65,
        "block_size": t,
        "n_layer": 2,
        "n_head": 4,
        "d_model": 64,
        "dropout": 0.0,
        "attention": {"backend": backend, "scaling": "inv_sqrt_d"},
    }
    torch.manual_seed(0)
    model = GPT(GPTConfig(**cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(65, (batch, t)), torch.randint(65, (batch, t))

    def step():
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's moments exist from now on: measure a step as the run sees it
    n = sum(p.numel() for p in model.parameters())
    measured = peak_bytes(step) + 3 * 4 * n  # params and moments were there before the peak was measured
    assert 0.8 <= estimate_step(GPTConfig(**cfg), n, batch).total / measured <= 1.1


GPU_SCALE = {
    "gpt2_half",
    "gpt2",
    "gpt2_medium",
}  # sized for a GPU node (docs/data.md): their refusal is in test_tokens.py
CONFIGS = [[f"model={m.stem}"] for m in sorted((ROOT / "conf" / "model").glob("*.yaml")) if m.stem not in GPU_SCALE] + [
    [f"experiment={e.stem}"] for e in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: o[0])
def test_presets_and_studies_are_not_refused(overrides, monkeypatch, tmp_path):
    """Nothing shipped is refused on a small machine: each preset and study fits 4 GiB by the estimate."""
    typed = Schema.from_cfg(compose_config(overrides, tmp_path))
    module = GPTModule(dataclasses.replace(typed.model, vocab_size=128), typed.optim, 10)
    monkeypatch.setattr("attnlab.training.resources.available_bytes", lambda device: 4 * 2**30)
    step = check_fits(typed, sum(p.numel() for p in module.parameters()), 128, torch.device("cpu"))
    assert 0 < step.total < 4 * 2**30
    monkeypatch.setattr("attnlab.training.resources.available_bytes", lambda device: step.total - 1)
    with pytest.raises(OutOfMemory):  # and the same estimate refuses a machine one byte too small
        check_fits(typed, sum(p.numel() for p in module.parameters()), 128, torch.device("cpu"))


# ---- corner cases ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, needed", [("a", "at least 132 characters"), ("to be " * 20, "a model.block_size of at most 58")]
)
def test_text_too_short_says_what_would_do(text, needed, tmp_path, monkeypatch, capsys):
    """A one-character file once said "expected a block size below 0"."""
    corpus = tmp_path / "short.txt"
    corpus.write_text(text)
    code, _, err = run_main(
        monkeypatch, capsys, *SMOKE, "data=textfile", f"data.path={corpus}", f"hydra.run.dir={tmp_path}/run"
    )
    assert_one_line_error(code, err, "data.path")
    assert needed in err and "below 0" not in err and "model.block_size=64" in err


@pytest.mark.slow
def test_resume_without_last_ckpt_uses_the_newest_step_checkpoint(make_cfg, capsys):
    first = make_cfg(*RESUMABLE, fast=False)
    train(first)
    run_dir = Path(first.paths.output_dir)
    (run_dir / "checkpoints" / "last.ckpt").unlink()  # e.g. deleted by hand after it was found damaged
    train(compose_config([*RESUMABLE, "resume=true", "trainer.max_steps=8"], run_dir))
    assert "last.ckpt is missing; resuming from step4.ckpt (step 4)" in capsys.readouterr().err
    record = results(run_dir)
    assert record["status"] == "ok" and record["metrics"]["step"] == 8 and record["resumed_from"]["step"] == 4
