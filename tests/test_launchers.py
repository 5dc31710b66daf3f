"""`attnlab sweep --launcher/--partition`: bad input is refused in one line, with no cluster needed
(the live SLURM tests are in test_slurm.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def sweep_cli(tmp_path: Path, *args: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnlab.sweeps.sweep", "--logs", str(tmp_path / "logs"), *args],
        cwd=tmp_path,
        env={"PATH": path, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_partition_without_the_slurm_launcher_is_refused_in_one_line(tmp_path):
    proc = sweep_cli(tmp_path, "--study", "smoke", "--partition", "gpu")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--partition gpu needs --launcher slurm" in proc.stderr and not (tmp_path / "logs").exists()


def test_slurm_launcher_without_sbatch_is_refused_in_one_line(tmp_path):
    proc = sweep_cli(tmp_path, "--study", "smoke", "--launcher", "slurm", path=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "sbatch is not on PATH" in proc.stderr and not (tmp_path / "logs").exists()


def test_unknown_launcher_names_the_accepted_ones(tmp_path):
    proc = sweep_cli(tmp_path, "--study", "smoke", "--launcher", "pbs")
    assert (
        proc.returncode == 2
        and "attnlab: error: argument --launcher: invalid choice: 'pbs' (choose from 'local', 'slurm')" in proc.stderr
    )
