"""One source of truth per grid: the W&B sweep files in sweeps/ follow conf/experiment/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.config.study import study_names
from attnlab.sweeps.sweep import wandb_sweep_yaml
from attnlab.tools.generated import NO_WANDB_SWEEP

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "sweeps").glob("*.yaml"))
TEST_ONLY = NO_WANDB_SWEEP


def test_every_study_has_a_wandb_sweep():
    assert sorted(set(study_names()) - TEST_ONLY) == sorted(p.stem for p in SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_a_sweep_file_is_generated_from_its_experiment(spec):
    assert spec.read_text() == wandb_sweep_yaml(spec.stem), (
        f"regenerate: attnlab sweep --study {spec.stem} --wandb-spec > {spec.relative_to(ROOT)}"
    )


def test_generated_sweep_follows_an_edited_grid(tmp_path, monkeypatch):
    """The check bites: a grid edited in conf/experiment/ changes the expected sweep file."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    exp = conf / "experiment" / "dk_scaling.yaml"
    exp.write_text(exp.read_text().replace("model.d_k: 16,32,64,128", "model.d_k: 16,256"))
    monkeypatch.setattr("attnlab.config.study.CONF_DIR", conf)
    assert "model.d_k: {values: [16, 256]}" in wandb_sweep_yaml("dk_scaling")
    assert wandb_sweep_yaml("dk_scaling") != (ROOT / "sweeps" / "dk_scaling.yaml").read_text()
