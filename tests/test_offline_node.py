"""The offline route of docs/gpu.md, simulated on CPU (``make offline-check``; slow, needs the wheelhouse).

A "node": a fresh venv whose torch was installed before attnlab (the site's torch), no package
index, nothing but ``wheelhouse/``. attnlab and its dependencies install from the wheelhouse alone,
the node's torch is kept, and ``attnlab gpu-check --device cpu`` and ``attnlab train`` run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
WHEELHOUSE = Path(os.environ.get("ATTNLAB_WHEELHOUSE", ROOT / "wheelhouse"))


def run(cmd: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_a_node_with_its_own_torch_installs_from_the_wheelhouse_alone_and_runs(tmp_path):
    torch_wheels = sorted((WHEELHOUSE / "torch").glob("torch-*.whl"))
    assert torch_wheels, (
        f"no {WHEELHOUSE}/torch/torch-*.whl: run `make wheelhouse ARGS=--with-torch` first (make offline-check does)"
    )
    # no index, no pip config (its find-links and extra index), no network proxy: only the folders named
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        OMP_NUM_THREADS="1",
        http_proxy="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        WANDB_MODE="offline",
    )
    node = tmp_path / "node"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", node], tmp_path, env)
    py = node / "bin" / "python"
    run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            WHEELHOUSE / "torch",
            "--find-links",
            WHEELHOUSE,
            torch_wheels[-1],
        ],
        tmp_path,
        env,
    )  # the site's torch, there before attnlab
    site_torch = run([py, "-c", "import torch; print(torch.__version__, torch.__file__)"], tmp_path, env).stdout.strip()
    from attnlab.tools.wheelhouse import NODE_INSTALL

    for step in NODE_INSTALL.format(out=WHEELHOUSE).split(" && "):  # the commands docs/gpu.md gives
        run([py, *step.split()[1:]], tmp_path, env)
    assert (
        run([py, "-c", "import torch; print(torch.__version__, torch.__file__)"], tmp_path, env).stdout.strip()
        == site_torch
    )
    work = tmp_path / "work"  # not the source tree: the installed package and its packaged configs
    work.mkdir()
    attnlab = node / "bin" / "attnlab"
    run(
        [
            attnlab,
            "gpu-check",
            "--device",
            "cpu",
            "--only",
            "cells",
            "--backends",
            "sdpa",
            "--precisions",
            "32",
            "--steps",
            "2",
            "--out",
            "gpu",
            "--runs",
            "runs",
        ],
        work,
        env,
    )
    report = json.loads((work / "gpu" / "gpu_check.json").read_text())
    assert [c["status"] for c in report["cells"]] == ["pass", "pass"]
    assert report["environment"]["packages"]["hydra"] != "missing"
    run([attnlab, "train", "debug=smoke", "logger=csv", "hydra.run.dir=run"], work, env)
    assert json.loads((work / "run" / "results.json").read_text())["status"] == "ok"
