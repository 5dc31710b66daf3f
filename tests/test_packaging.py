"""The built wheel is self-contained: it ships conf/ as attnlab/conf and its `attnlab` command
composes a config from any working directory, with the user's own configs joined on top."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build from a copy of the tree (the build leaves build/ and egg-info behind)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", tree / "src", ignore=skip)
    shutil.copytree(ROOT / "conf", tree / "conf", ignore=skip)
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, tree)
    return next(dist.glob("attnlab-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; the pinned dependencies come from the project's venv."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    site = Path(
        run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        wheel,
    )
    return venv


@pytest.mark.slow
def test_wheel_ships_every_config(wheel):
    shipped = {
        n.removeprefix("attnlab/conf/") for n in zipfile.ZipFile(wheel).namelist() if n.startswith("attnlab/conf/")
    }
    expected = {str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")}
    assert expected and shipped == expected


@pytest.mark.slow
def test_wheel_ships_every_page_template(wheel):
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".j2")}
    expected = {f"attnlab/{p.relative_to(ROOT / 'src' / 'attnlab')}" for p in (ROOT / "src").rglob("*.j2")}
    assert expected and shipped == expected


@pytest.mark.slow
def test_installed_command_runs_from_any_directory(venv, tmp_path):
    where = run(
        venv / "bin" / "python", "-c", "import attnlab.config.compose as c; print(c.find_conf_dir())", cwd=tmp_path
    ).stdout
    assert Path(where.strip()).is_relative_to(venv) and where.strip().endswith("attnlab/conf")
    job = run(venv / "bin" / "attnlab", "train", "attention=sdpa", "--cfg", "job", cwd=tmp_path).stdout
    assert "backend: sdpa" in job and "n_layer: 4" in job
    assert "train" in run(venv / "bin" / "attnlab", "--help", cwd=tmp_path).stdout


@pytest.mark.slow
def test_installed_command_takes_user_configs(venv, tmp_path):
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "wide_heads.yaml").write_text("# @package _global_\nmodel:\n  d_k: 96\n")
    job = run(
        venv / "bin" / "attnlab", "train", "--config-dir", "mine", "experiment=wide_heads", "--cfg", "job", cwd=tmp_path
    ).stdout
    assert "d_k: 96" in job


def test_a_training_process_defers_scipy_signal_until_it_is_used():
    """attnlab.training.startup: importing attnlab.training.train (Lightning, torchmetrics) leaves scipy.signal a
    stand-in; the first use imports the real module, torchmetrics' hamming patch included, and every
    way of reaching it (attribute, from-import, submodule import) gives the real functions."""
    import subprocess
    import sys

    code = """
import sys, types
import attnlab.training.train, torchmetrics
from attnlab.training.startup import DeferredModule
assert isinstance(sys.modules["scipy.signal"], DeferredModule), type(sys.modules["scipy.signal"])
import inspect; inspect.getmodule(inspect)  # walks sys.modules, reading __file__: no import
assert isinstance(sys.modules["scipy.signal"], DeferredModule)
import scipy.signal
window = scipy.signal.hamming(5)  # torchmetrics' patch, answered by the real window
assert type(sys.modules["scipy.signal"]) is types.ModuleType and scipy.signal is sys.modules["scipy.signal"]
from scipy.signal import butter
from scipy.signal.windows import hamming
assert (window == hamming(5)).all() and (scipy.signal.hamming(5) == window).all() and callable(butter)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
