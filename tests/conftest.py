"""Shared fixtures: composed configs that train in seconds, in a temp dir, with no network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)  # tests run two at a time (pytest -n 2) on two cores

ROOT = Path(__file__).resolve().parents[1]
FAST = ["debug=smoke", "logger=none"]


@pytest.fixture
def make_cfg(tmp_path):
    """compose_config(overrides) into a fresh output dir; smoke-sized unless overridden."""
    from attnlab.config.compose import compose_config

    counter = iter(range(1000))

    def make(*overrides: str, fast: bool = True):
        out = tmp_path / f"run{next(counter)}"
        return compose_config([*(FAST if fast else []), *overrides], out)

    return make


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``python -m attnlab.training.train`` in a subprocess, as a user would."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run(
        [sys.executable, "-m", "attnlab.training.train", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
