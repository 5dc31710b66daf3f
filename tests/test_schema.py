"""The config's schema (attnlab.config.schema) is the one declaration of each key: the config checks, the
W&B axes and docs/configuration.md's key table follow from it, its defaults agree with conf/, and
every committed experiment composes into its typed view."""

from __future__ import annotations

import copy
import re
from dataclasses import MISSING, field, fields, make_dataclass
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from attnlab.attention import DEFAULT_SCALING, AttentionConfig, LatentConfig
from attnlab.config.compose import compose_config, find_conf_dir
from attnlab.config.schema import Schema, axis_keys, rules, walk
from attnlab.model import GPTConfig
from attnlab.tools.generated import key_table
from attnlab.training import wandb_runs
from attnlab.util.errors import ConfigError
from attnlab.util.fields import checked, choice, positive_int

ROOT = Path(__file__).resolve().parents[1]
CONF = find_conf_dir()


@pytest.fixture(scope="module")
def default_cfg():
    return compose_config([], "/tmp/attnlab-schema-test")


def test_docs_key_table_is_the_schema(default_cfg):
    doc = (ROOT / "docs" / "configuration.md").read_text()
    block = re.search(r"<!-- key table: start -->\n(.*?)\n<!-- key table: end -->", doc, re.S)
    assert block is not None, "docs/configuration.md lost its key table markers"
    assert block.group(1) == key_table(default_cfg), "docs/configuration.md's key table differs: regenerate it"


def test_each_checked_field_is_a_rule_and_each_rule_a_field():
    declared = {key for key, f, _ in walk() if "check" in f.metadata or "choices" in f.metadata}
    assert {key for key, _ in rules()} == declared
    assert len(rules()) == len(declared)  # one declaration per key


def test_python_defaults_agree_with_conf(default_cfg):
    """Where a default is declared in Python too (the model's and attention's fields, optim.name and
    momentum, the top-level flags), it equals what conf/ composes, which is its source for a run."""
    for key, f, _ in walk():
        if f.default is MISSING or OmegaConf.select(default_cfg, key, default=MISSING) is MISSING:
            continue
        assert OmegaConf.select(default_cfg, key) == f.default, key
    for backend, scaling in DEFAULT_SCALING.items():
        assert yaml.safe_load((CONF / "attention" / f"{backend}.yaml").read_text())["scaling"] == scaling, backend


@pytest.mark.parametrize(
    "overrides", [[], *([f"experiment={p.stem}"] for p in sorted((CONF / "experiment").glob("*.yaml")))]
)
def test_every_experiment_composes_into_the_typed_view(overrides, tmp_path):
    cfg = compose_config(overrides, tmp_path)
    typed = Schema.from_cfg(cfg)
    assert isinstance(typed.model, GPTConfig) and isinstance(typed.model.attention, AttentionConfig)
    assert typed.model.block_size == cfg.model.block_size and typed.trainer.max_steps == cfg.trainer.max_steps
    assert typed.optim.lr == cfg.optim.lr and typed.seed == cfg.seed and typed.data.batch_size == cfg.data.batch_size
    assert typed.model.attention.backend == cfg.model.attention.backend


def test_a_key_absent_from_the_config_takes_its_fields_default(default_cfg):
    cfg = copy.deepcopy(default_cfg)
    OmegaConf.set_struct(cfg, False)
    del cfg["tf32"], cfg.trainer["accumulate_grad_batches"], cfg.optim["momentum"]
    typed = Schema.from_cfg(cfg)
    assert typed.tf32 is True and typed.trainer.accumulate_grad_batches == 1 and typed.optim.momentum == 0.9
    del cfg.optim["lr"]
    with pytest.raises(ConfigError, match="optim.lr=None is not accepted; expected a positive number"):
        Schema.from_cfg(cfg)


@pytest.mark.parametrize("key", ["model.dropout_p", "model.attention.heads", "model.attention.latent.d_q"])
def test_a_key_the_model_does_not_declare_is_refused_not_dropped(tmp_path, key):
    cfg = compose_config(["experiment=kv_frontier", "variant=mla_dc32", f"+{key}=1"], tmp_path)
    with pytest.raises(ConfigError) as err:
        Schema.from_cfg(cfg)
    section = {"model": GPTConfig, "model.attention": AttentionConfig}.get(key.rsplit(".", 1)[0], LatentConfig)
    assert err.value.key == key and all(f.name in err.value.accepted for f in fields(section))


def test_adding_a_key_is_one_field(default_cfg):
    """A new attention option and a new top-level key, each declared once: the config check, the W&B
    axes and the doc's key table pick them up."""
    Attention = make_dataclass(
        "Attention",
        [("temperature", str, choice("fixed", ("fixed", "learned"), "a made-up option", axis=True))],
        bases=(AttentionConfig,),
    )
    Model = make_dataclass("Model", [("attention", Attention, field(default_factory=Attention))], bases=(GPTConfig,))
    Extended = make_dataclass(
        "Extended",
        [
            ("model", Model, checked(MISSING, None, "the model")),
            ("patience", int, checked(3, positive_int, "a made-up top-level key", axis=True)),
        ],
        bases=(Schema,),
        kw_only=True,
    )

    assert ("model.attention.temperature", "one of fixed, learned") in [(k, c.accepted) for k, c in rules(Extended)]
    assert "patience" in dict(rules(Extended)) and "patience" not in dict(rules())
    axes = wandb_runs.derive_axes(axis_keys(Extended))
    assert axes["temperature"] == "model.attention.temperature" and axes["patience"] == "patience"
    rows = {
        cells[0].strip("` "): [c.strip() for c in cells[1:]]
        for line in key_table(default_cfg, Extended).splitlines()
        if line.startswith("| `") and (cells := line.strip("|").split("|"))
    }
    assert rows["model.attention.temperature"][:2] == ["-", "one of fixed, learned"]
    assert rows["patience"][:2] == ["-", "a positive integer"]
    cfg = copy.deepcopy(default_cfg)
    OmegaConf.set_struct(cfg, False)
    cfg.patience, cfg.model.attention.temperature = 0, "fixed"
    with pytest.raises(ConfigError, match=r"^patience=0 is not accepted; expected a positive integer$"):
        Extended.from_cfg(cfg)
    cfg.patience = 5
    Extended.from_cfg(cfg)
    with pytest.raises(ConfigError, match=r"^model.attention.temperature='fixed' is not accepted"):
        Schema.from_cfg(cfg)  # a key only the extended schema declares
    assert Extended.from_cfg(cfg).patience == 5 and Extended.from_cfg(cfg).model.attention.temperature == "fixed"


def test_the_axes_every_run_carries_come_from_the_schema():
    assert set(axis_keys()) <= set(wandb_runs.AXES.values())
    assert {key for key, _, _ in walk(AttentionConfig, "model.attention.")} <= set(axis_keys())
