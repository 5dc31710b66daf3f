"""Each fact in one place: presets and groups hold deltas; the optimizer defaults live in train.yaml."""

from __future__ import annotations

import yaml

from attnlab.config.compose import compose_config, find_conf_dir

CONF = find_conf_dir()
DELTA_GROUPS = {"experiment", "debug"}  # studies and presets that change the defaults on purpose


def files_setting(key: str) -> list[str]:
    """Config files outside experiment/ and debug/ whose top level sets ``key``."""
    found = []
    for path in sorted(CONF.rglob("*.yaml")):
        rel = path.relative_to(CONF)
        if rel.parts[0] not in DELTA_GROUPS and key in (yaml.safe_load(path.read_text()) or {}):
            found.append(str(rel))
    return found


def test_optimizer_defaults_live_in_one_place():
    assert files_setting("optim") == ["train.yaml"]


def test_every_model_preset_trains_with_those_defaults(tmp_path):
    defaults = yaml.safe_load((CONF / "train.yaml").read_text())["optim"]
    for preset in sorted(p.stem for p in (CONF / "model").glob("*.yaml")):
        cfg = compose_config([f"model={preset}"], tmp_path)
        assert {k: cfg.optim[k] for k in defaults} == defaults, preset
