"""Bad input through the real entry point: one clear line naming the key, non-zero exit, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from attnlab.training.train import main

SMOKE = ["debug=smoke", "logger=none", "callbacks=none"]

BAD = {
    "unknown backend": (["attention=foo"], "attention"),
    "unknown backend key": (["model.attention.backend=foo"], "model.attention.backend"),
    "d_k zero": (["model.d_k=0"], "model.d_k"),
    "d_k negative": (["model.d_k=-8"], "model.d_k"),
    "d_k not an integer": (["model.d_k=2.5"], "model.d_k"),
    "unknown scaling": (["model.attention.scaling=huge"], "model.attention.scaling"),
    "missing data file": (["data=textfile", "data.path=/nonexistent/corpus.txt"], "data.path"),
    "gpu without cuda": (["trainer=gpu"], "trainer.accelerator"),
    "fp16 on cpu": (["trainer.precision=16-mixed"], "trainer.precision"),
    "bad wandb mode": (["logger=wandb", "logger.wandb.mode=sometimes"], "logger.wandb.mode"),
    "unknown model size": (["model=huge"], "model"),
    "unknown data option": (["data=imagenet"], "data"),
    "unknown logger": (["logger=mlflow"], "logger"),
    "zero heads": (["model.n_head=0"], "model.n_head"),
    "negative layers": (["model.n_layer=-2"], "model.n_layer"),
    "d_model not divisible by heads": (["model.d_model=130"], "model.d_model"),
    "zero batch": (["data.batch_size=0"], "data.batch_size"),
    "zero steps": (["trainer.max_steps=0"], "trainer.max_steps"),
    "sweep value of the wrong type": (["model.d_k=abc"], "model.d_k"),
    "negative learning rate": (["optim.lr=-0.001"], "optim.lr"),
    "dropout of one": (["model.dropout=1.0"], "model.dropout"),
    "bad init": (["model.init_std=xavier"], "model.init_std"),
    "bad mask fill": (["model.attention.mask_fill=zero"], "model.attention.mask_fill"),
    "bad precision": (["trainer.precision=8"], "trainer.precision"),
    "bad knockout": (["callbacks.heads.knockout=sometimes"], "callbacks.heads.knockout"),
    "bad probe cap": (["callbacks.heads.max_len=1"], "callbacks.heads.max_len"),
    "bad optimizer": (["optim.name=adam"], "optim.name"),
    "qk_norm not a bool": (["model.attention.qk_norm=maybe"], "model.attention.qk_norm"),
    "unknown key": (["model.heads=4"], "model.heads"),
    "resume without a checkpoint": (["resume=true"], "resume"),
    "missing ckpt_path": (["ckpt_path=/nonexistent/last.ckpt"], "ckpt_path"),
    "flash with 16-bit on cpu": (["attention=flash", "trainer.precision=16-mixed"], "trainer.precision"),
    # faults of a long study (more in test_faults.py)
    "ckpt_path not a checkpoint": ([f"ckpt_path={ROOT / 'pyproject.toml'}"], "ckpt_path"),
    "model that cannot fit in memory": (["model.block_size=100000"], "model.block_size"),
    "checkpoints kept below -1": (["checkpoint.keep=-2"], "checkpoint.keep"),
    "checkpoint cadence zero": (["checkpoint.every_n_steps=0"], "checkpoint.every_n_steps"),
    "memory_check not a bool": (["memory_check=sometimes"], "memory_check"),
}


def assert_one_line_error(returncode: int, stderr: str, key: str):
    assert returncode != 0
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, stderr
    assert key in errors[0], errors[0]


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The console entry point in-process (saves the interpreter start of a subprocess)."""
    monkeypatch.setattr("sys.argv", ["attnlab-train", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_one_line(case, tmp_path, monkeypatch, capsys):
    overrides, key = BAD[case]
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, *overrides, f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(code, err, key)
    results = Path(tmp_path) / "run" / "results.json"
    if results.exists():
        assert json.loads(results.read_text())["status"] == "failed"


def test_block_size_larger_than_the_data(tmp_path, monkeypatch, capsys):
    small = tmp_path / "small.txt"
    small.write_text("to be or not to be, " * 20)
    code, _, err = run_main(
        monkeypatch,
        capsys,
        *SMOKE,
        "data=textfile",
        f"data.path={small}",
        "model.block_size=512",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert_one_line_error(code, err, "model.block_size")


def test_binary_data_file(tmp_path, monkeypatch, capsys):
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    code, _, err = run_main(
        monkeypatch, capsys, *SMOKE, "data=textfile", f"data.path={binary}", f"hydra.run.dir={tmp_path}/run"
    )
    assert_one_line_error(code, err, "data.path")


def test_unwritable_output_dir(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should go")
    code, _, err = run_main(monkeypatch, capsys, *SMOKE, f"hydra.run.dir={blocker}/run")
    assert_one_line_error(code, err, "hydra.run.dir")


def test_bad_config_in_a_real_process(tmp_path):
    proc = run_cli(*SMOKE, "model.d_k=-1", f"hydra.run.dir={tmp_path}/run")
    assert_one_line_error(proc.returncode, proc.stderr, "model.d_k")
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "failed"


def test_empty_data_file(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    code, _, err = run_main(
        monkeypatch, capsys, *SMOKE, "data=textfile", f"data.path={empty}", f"hydra.run.dir={tmp_path}/run"
    )
    assert_one_line_error(code, err, "data.path")
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "failed"


def test_textfile_trains_on_any_utf8_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    proc = run_cli(*SMOKE, "data=textfile", f"data.path={corpus}", f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "ok" and f"data.path={corpus}" in results["overrides"]
    assert "results in" in proc.stdout


# --- `attnlab COMMAND`: one console script, one error prefix -------------------------------------

from attnlab import cli  # noqa: E402


def test_attnlab_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == list(cli.COMMANDS)
    assert listed[:9] == ["train", "sweep", "plan", "report", "repro", "bench", "sample", "analyze", "dashboard"]


def test_attnlab_unknown_command_is_one_error_line(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab: error: unknown command 'trian'") and "train" in err


@pytest.mark.parametrize(
    "argv, key",
    [
        (["sweep", "--study", "nope"], "--study"),
        (["sweep", "--seeds", "0"], "--seeds"),
        (["repro", "--mode", "nope"], "--mode"),
        (["bench", "--mode", "tiny", "--sections", "nope"], "--sections"),
        (["bench", "--threads", "two"], "--threads"),
        (["analyze"], "path"),
        (["sample", "--tokens", "many"], "--tokens"),
        (["report", "/nonexistent/sweep"], "/nonexistent/sweep"),
        (["dashboard", "--layers", "x"], "--layers"),
        (["gpu-check", "--steps", "x"], "--steps"),
    ],
)
def test_every_command_reports_bad_input_with_the_same_prefix(argv, key, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("attnlab: error: ") and key in errors[0], errors


def test_attnlab_train_takes_hydra_overrides_like_python_m(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["attnlab"])
    assert cli.main(["train", "attention=sdpa", "model.d_k=24", "--cfg", "job"]) == 0
    job = capsys.readouterr().out
    assert "backend: sdpa" in job and "d_k: 24" in job


def test_user_configs_join_through_config_dir(tmp_path, monkeypatch, capsys):
    """A researcher's own experiment file, outside the package, composed with the shipped groups."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "my_study.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /attention: naive\nmodel:\n  d_k: 48\nstudy: my_study\n"
    )
    monkeypatch.setattr("sys.argv", ["attnlab"])
    assert cli.main(["train", "--config-dir", str(tmp_path), "experiment=my_study", "--cfg", "job"]) == 0
    job = capsys.readouterr().out
    assert "d_k: 48" in job and "study: my_study" in job and "backend: naive" in job
    assert cli.main(["train", f"hydra.searchpath=[file://{tmp_path}]", "experiment=my_study", "--cfg", "job"]) == 0
    assert "d_k: 48" in capsys.readouterr().out
