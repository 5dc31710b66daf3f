"""Compose the training config from Python (tests, repro, bench) exactly as the CLI does."""

from __future__ import annotations

from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict


def find_conf_dir() -> Path:
    """Hydra's config dir: ``attnlab/conf`` inside a built wheel (package data), else the
    checkout's top-level ``conf/`` (source tree, editable install)."""
    packaged = Path(__file__).parents[1] / "conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[3] / "conf"


CONF_DIR = find_conf_dir()


def compose_config(overrides: list[str] | tuple[str, ...] = (), output_dir: str | Path | None = None) -> DictConfig:
    """The config ``python -m attnlab.training.train *overrides`` would run, with its output dir set."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


def read_yaml(path: Path):
    """A config file as plain YAML, without Hydra's defaults (libyaml's parser where PyYAML has it). Every
    training process reads train.yaml's defaults and the experiment files' swept keys for a few key
    names; composing each would cost several times the parse."""
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def parse_overrides(overrides) -> dict[str, str]:
    """``key=value`` overrides as a dict (``+``/``~`` prefixes dropped; a bare flag has no value and is skipped)."""
    return dict(o.lstrip("+~").split("=", 1) for o in overrides or () if "=" in o)
