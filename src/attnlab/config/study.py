"""A study: its experiment file composed once, with a typed question and its grid.

``load_study(name)`` composes ``experiment=<name>`` as a run does (the experiments it extends merged by
Hydra) and returns a ``Study``: the question its ``question:`` block declares, checked key by key, and
its grid (``hydra.sweeper.params``, values parsed as Hydra parses them). The sweep, the plan, the report
and the dashboard read a study through it; a key the block does not know is a one-line error naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache

from omegaconf import OmegaConf

from attnlab.config.compose import CONF_DIR, read_yaml
from attnlab.util.errors import ConfigError

DEFAULT_HEADLINE = ("val/loss", "attn/L{i}/entropy_norm")
DEFAULT_STUDY = "dk_scaling"  # what `make sweep` and `attnlab sweep` run without a study named


@dataclass(frozen=True, kw_only=True)
class Question:
    """An experiment's ``question:`` block: what the study asks and how its report and plan read it."""

    ask: str = ""
    summary: str = ""  # the study's line in docs/configuration.md's study table
    axis: str | None = None  # the swept key whose levels are compared with ``reference``
    reference: str | None = None
    across: str | None = None  # the axis across which the compared effect itself is tested
    metrics: tuple[str, ...] = ("val/loss",)  # the first decides; the rest are shown beside it
    difference: float | None = None  # what the study is meant to resolve, in the first metric's unit
    outcome: str = "continuous"  # what a run's result is, which decides its test (significance.OUTCOMES)
    learned: float | None = None  # the answer accuracy that counts as learned (learned and onset outcomes)
    seeds: int | str = 1  # seeds a cell, or "auto": the plan's
    hours: float | None = None  # the plan's time cap on this machine
    headline: tuple[str, ...] = DEFAULT_HEADLINE  # the dashboard's panels: final values against each axis

    @classmethod
    def from_block(cls, block: dict | None) -> Question:
        """The typed question of a ``question:`` block; a bad key or value raises ConfigError naming it."""
        # scipy.stats comes with it: not for the training processes, which read swept_keys
        from attnlab.util.significance import OUTCOMES

        block = dict(block or {})
        known = [f.name for f in dataclasses.fields(cls)]
        for key in block:
            if key not in known:
                raise ConfigError(f"question.{key}", block[key], "one of the keys " + ", ".join(known))
        if block.get("outcome", "continuous") not in OUTCOMES:
            raise ConfigError("question.outcome", block["outcome"], ", ".join(OUTCOMES))
        if block.get("outcome") in ("learned", "onset") and block.get("learned") is None:
            raise ConfigError(
                "question.learned", None, f"a threshold in (0, 1] for question.outcome={block['outcome']}"
            )
        seeds = block.get("seeds", 1)
        if seeds != "auto" and not (isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1):
            raise ConfigError("question.seeds", seeds, "a positive integer or auto")
        for key in ("metrics", "headline"):
            if key in block:
                block[key] = tuple(block[key])
        if block.get("reference") is not None:
            block["reference"] = str(block["reference"])
        return cls(**block)


@dataclass(frozen=True)
class Study:
    name: str
    question: Question
    grid: dict[str, list] = field(default_factory=dict)  # swept key -> its values
    n_layer: int = 1  # the model's depth: a panel per layer on the study's dashboard


def study_names(conf_dir=CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml"))


def file_sweeps(path) -> list[str]:
    """The keys one experiment file sweeps itself (its ``hydra.sweeper.params``), in file order."""
    params = read_yaml(path)
    for part in ("hydra", "sweeper", "params"):
        params = params.get(part) if isinstance(params, dict) else None
    return [str(k) for k in (params or {})]


@cache
def swept_keys(conf_dir=CONF_DIR) -> dict[str, list[str]]:
    """Each study -> the keys its own experiment file sweeps, read as plain YAML: every training process
    reads them at import (its W&B columns), where composing each study would cost seconds. A study's
    grid (``load_study``) adds what the experiments it extends sweep."""
    return {name: file_sweeps(conf_dir / "experiment" / f"{name}.yaml") for name in study_names(conf_dir)}


def load_study(name: str) -> Study:
    """``experiment=<name>`` composed once per config dir (raises ConfigError for a name that is no experiment)."""
    if name not in study_names():
        raise ConfigError("experiment", name, "one of " + ", ".join(study_names()))
    return composed(name, str(CONF_DIR))


@cache
def composed(name: str, conf_dir: str) -> Study:
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={name}"], return_hydra_config=True)
    parser = OverridesParser.create()
    grid = {}
    for key, value in (cfg.hydra.sweeper.params or {}).items():
        override = parser.parse_override(f"{key}={value}")
        grid[key] = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    block = OmegaConf.to_container(cfg.get("question") or {}, resolve=True)
    return Study(name, Question.from_block(block), grid, int(cfg.model.n_layer))
