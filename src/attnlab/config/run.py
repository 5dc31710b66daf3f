"""One run as the code below the entry point reads it: ``RunSpec``, the typed config (``Schema``),
Hydra's record of the job (``Job``), the run dir, and the resolved config results.json records.

The entry (training/train.py) composes with Hydra, settles the config (renamed keys, precision,
``model.init_from``), passes it through the gate once and hands the spec down. Below it the
DictConfig is read only where Hydra instantiates a ``_target_`` block (data, callbacks, loggers,
the Trainer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.config.compose import CONF_DIR, parse_overrides, read_yaml
from attnlab.config.schema import Schema


@cache
def config_groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """The config groups (``attention``, ``data``, ``variant``, ...): conf/'s folders."""
    return frozenset(p.name for p in conf_dir.iterdir() if p.is_dir())


@cache
def default_choices(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """train.yaml's defaults list: group -> option (what a run without that override uses); read once,
    so callers merge it into a new dict rather than change it."""
    choices = {}
    for entry in read_yaml(conf_dir / "train.yaml").get("defaults") or []:
        if isinstance(entry, dict):
            for group, option in entry.items():
                if option is not None and not str(group).startswith("optional "):
                    choices[str(group)] = str(option)
    return choices


def group_choices(overrides) -> dict[str, str]:
    """The group options among ``overrides`` (``attention=sdpa``; ``+``/``~`` prefixes dropped)."""
    return {k: v for k, v in parse_overrides(overrides).items() if "." not in k and k in config_groups()}


@dataclass(frozen=True)
class Job:
    """Hydra's record of the running job, read once: its overrides, each group's option, the keys its
    sweep varies, the sweep dir's name and whether it is a multirun. Outside a Hydra job (``train(cfg)``
    from Python, a test) the record is what ``Job.of`` is given."""

    overrides: tuple[str, ...] = ()
    choices: dict[str, str] = field(default_factory=dict)
    swept: tuple[str, ...] = ()
    stamp: str | None = None  # the sweep dir's name, e.g. 2026-11-30_00-11-49_sinks; None outside a multirun
    multirun: bool = False

    @classmethod
    def of(cls, overrides=(), *, swept=(), stamp: str | None = None, choices: dict | None = None) -> Job:
        """A job of these overrides: train.yaml's group options, under ``choices``, under the overrides' own."""
        picked = default_choices() | (choices or {}) | group_choices(overrides)
        return cls(tuple(overrides), picked, tuple(swept), stamp, stamp is not None)

    @classmethod
    def current(cls) -> Job:
        """The running Hydra job's record; an empty one outside a Hydra job."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return cls.of()
        hc = HydraConfig.get()
        return cls.of(
            list(hc.overrides.task),
            swept=[str(k) for k in (OmegaConf.select(hc, "sweeper.params", default=None) or {})],
            stamp=Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None,
            choices={str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None},
        )


@dataclass(frozen=True)
class RunSpec:
    """The run below the entry point: ``schema`` is what it trains and how, ``job`` how it was asked for,
    ``config`` the composed config resolved to plain values (results.json's ``config``, and where W&B's
    axis columns read the keys a study adds beyond the schema)."""

    schema: Schema
    job: Job
    run_dir: Path
    config: dict

    @classmethod
    def of(cls, cfg: DictConfig, job: Job | None = None, run_dir: Path | None = None, config: dict | None = None):
        """The gate (``Schema.from_cfg``: a ConfigError for the first bad key), then the spec.
        ``config``: ``cfg`` already resolved, where the caller has it."""
        schema = Schema.from_cfg(cfg)
        if config is None:
            config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        return cls(schema, job or Job.of(), Path(run_dir or "."), config)

    def select(self, key: str):
        """A dotted key of the resolved config (``data.n_triggers``), None where it sets none."""
        node = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node
