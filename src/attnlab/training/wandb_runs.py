"""Where a training run goes in W&B and what it is called.

- group: the run's study (``run_group`` if set), so a study re-run or extended in a later sweep dir
  joins the same group; the sweep dir's stamp is a tag (``sweep=<dir name>``) and a config field.
- name: the axes the run sets, e.g. ``bos=true escape=learned seed=2`` (``default seed=1337`` when
  it sets none); tags: each of them as ``axis=value``.
- top-level config fields (``AXES``): every axis a committed study sweeps (its experiment file's
  ``hydra.sweeper.params``), the attention schema's fields and the fields attnlab.config.schema flags as
  axes (the model's sizes, lr, ...), each under its short name, so the UI can group and filter by them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from attnlab.config.compose import CONF_DIR
from attnlab.config.schema import axis_keys
from attnlab.model.gpt import GPTConfig

# Last parts of a key that say nothing alone: such an axis is named by its last two parts (optim.name -> optim_name).
GENERIC_NAMES = {"name", "source", "type", "path", "mode", "_target_"}
# Overrides that set what a run records or where, not what it trains: part of a name only if an axis (trainer.precision).
BOOKKEEPING = (
    "experiment",
    "debug",
    "study",
    "run_group",
    "resume",
    "ckpt_path",
    "memory_check",
    "tf32",
    "hydra",
    "paths",
    "logger",
    "callbacks",
    "checkpoint",
    "trainer",
    "task_name",
)
NAMED_SECTIONS = ("model.", "optim.", "data.")  # any override under these changes the training: it names the run
TAG_MAX = 64  # W&B's longest tag


def read_yaml(path: Path):
    """A config file as plain YAML (libyaml's parser where PyYAML has it). Every training process
    reads the experiment files (``AXES``, at import) and train.yaml's defaults (``axes``) for a few
    key names; an OmegaConf config of each would cost several times the parse."""
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def sweeper_keys(path: Path) -> list[str]:
    """The keys an experiment file sweeps (its ``hydra.sweeper.params``), in file order."""
    params = read_yaml(path)
    for part in ("hydra", "sweeper", "params"):
        params = params.get(part) if isinstance(params, dict) else None
    return [str(k) for k in (params or {})]


@cache
def committed_sweeps(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Each committed experiment file -> the keys it sweeps."""
    return {p.stem: sweeper_keys(p) for p in sorted((conf_dir / "experiment").glob("*.yaml"))}


@cache
def config_groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    return frozenset(p.name for p in conf_dir.iterdir() if p.is_dir())


def derive_axes(keys: list[str]) -> dict[str, str]:
    """Top-level name -> config key: the key's last part, or its last two parts joined by ``_`` when
    the last part is generic or already names another key."""
    axes: dict[str, str] = {}
    for key in keys:
        if key in axes.values():
            continue
        parts = key.split(".")
        name = parts[-1]
        if len(parts) > 1 and (name in GENERIC_NAMES or name in axes):
            name = "_".join(parts[-2:])
        axes[name] = key
    return axes


# every run carries the schema's axes (each attention field and each field flagged axis=True),
# whether or not a study sweeps them, then whatever a committed study sweeps
AXES = derive_axes([*axis_keys(), *(key for keys in committed_sweeps().values() for key in keys)])
GROUP_AXES = {name for name, key in AXES.items() if "." not in key and key in config_groups()}  # e.g. attention=sdpa
NAME_OF = {key: name for name, key in AXES.items()}


def axis_name(key: str) -> str:
    """The short name of a config key: its top-level field's, or derived beside the fields' names."""
    key = key.lstrip("+~")
    return NAME_OF.get(key) or {k: n for n, k in derive_axes([*AXES.values(), key]).items()}[key]


def default_choices(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """train.yaml's defaults list: group -> option (what a run without that override uses)."""
    choices = {}
    for entry in read_yaml(conf_dir / "train.yaml").get("defaults") or []:
        if isinstance(entry, dict):
            for group, option in entry.items():
                if option is not None and not str(group).startswith("optional "):
                    choices[str(group)] = str(option)
    return choices


def hydra_choices() -> dict[str, str]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {str(k): str(v) for k, v in HydraConfig.get().runtime.choices.items() if v is not None}


def axes(cfg: DictConfig, overrides: list[str] = ()) -> dict:
    """The top-level W&B config fields of a run: every axis under its short name."""
    # the job's own overrides last: in a Hydra job they agree with its choices, and HydraConfig is
    # process-wide state that a caller outside a job (train() from Python, a test) may find stale
    choices = default_choices() | hydra_choices() | parse_overrides(overrides, groups_only=True)
    values = {}
    for name, key in AXES.items():
        values[name] = choices.get(key) if name in GROUP_AXES else OmegaConf.select(cfg, key, default=None)
    values["d_k"] = GPTConfig.head_dim(cfg.model.d_model, cfg.model.n_head, values["d_k"])
    values["n_kv_head"] = values["n_kv_head"] or values["n_head"]
    values["data"] = cfg.data.get("source") or cfg.data.get("_target_", "").rsplit(".", 1)[-1]
    values["study"] = cfg.get("study")
    return values


def parse_overrides(overrides, groups_only: bool = False) -> dict[str, str]:
    """``key=value`` overrides as a dict (``+``/``~`` prefixes dropped); only group choices if asked."""
    pairs = {}
    for override in overrides or ():
        if "=" not in override:
            continue
        key, value = override.split("=", 1)
        key = key.lstrip("+~")
        if groups_only and ("." in key or key not in GROUP_AXES):
            continue
        pairs[key] = value
    return pairs


def names_run(key: str, swept: list[str]) -> bool:
    """Whether an override's key is part of a run's name: an axis, a swept key, a training setting
    (under model., optim., data.) or a training group (attention=, data=, model=)."""
    if key == "seed":
        return False  # always last, from the config
    if key in NAME_OF or key in swept or key.startswith(NAMED_SECTIONS):
        return True
    return "." not in key and key in config_groups() and key not in BOOKKEEPING


def run_axes(overrides: list[str], swept: list[str] = ()) -> list[tuple[str, str]]:
    """(axis name, value) of each override that names the run: the study's swept keys first, in
    the experiment file's order, then the others in command-line order."""
    pairs = [(k, v) for k, v in parse_overrides(overrides).items() if names_run(k, list(swept))]
    order = {key: i for i, key in enumerate(swept)}
    pairs.sort(key=lambda kv: order.get(kv[0], len(order)))
    return [
        (axis_name(k), v.lower() if v in ("True", "False") else v) for k, v in pairs
    ]  # Hydra writes a swept bool True


def run_name(overrides: list[str], seed, swept: list[str] = ()) -> str:
    """``bos=true escape=learned seed=2``: what the run sets, then its seed (``default seed=N`` when it sets nothing)."""
    parts = [f"{name}={value}" for name, value in run_axes(overrides, swept)] or ["default"]
    return " ".join([*parts, f"seed={seed}"])


def run_group(cfg: DictConfig) -> str:
    """The W&B group: ``run_group`` if set, else the study."""
    return str(cfg.get("run_group") or cfg.get("study") or "adhoc")


def sweep_stamp() -> str | None:
    """The sweep dir's name in a Hydra multirun (e.g. ``2026-11-30_00-11-49_sinks``), else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return None


def job_sweeper_keys() -> list[str]:
    """The swept keys of the running job's config (``hydra.sweeper.params``), [] outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [str(k) for k in (OmegaConf.select(HydraConfig.get(), "sweeper.params", default=None) or {})]


def run_tags(cfg: DictConfig, overrides: list[str], swept: list[str] = (), stamp: str | None = None) -> list[str]:
    """Each axis the run sets as ``axis=value``, ``seed=N`` when swept, ``sweep=<dir>`` in a multirun,
    ``debug=<option>`` for a debug run, and the backend and scaling."""
    tags = [f"{name}={value}" for name, value in run_axes(overrides, swept)]
    if "seed" in parse_overrides(overrides):
        tags.append(f"seed={cfg.seed}")
    if stamp:
        tags.append(f"sweep={stamp}")
    if debug := hydra_choices().get("debug"):
        tags.append(f"debug={debug}")
    tags += [str(cfg.model.attention.backend), str(cfg.model.attention.scaling)]
    return list(dict.fromkeys(t[:TAG_MAX] for t in tags))


def wandb_identity(cfg: DictConfig, overrides: list[str], earlier: dict | None = None) -> dict:
    """The group, name, tags and sweep stamp of a run, as build_loggers passes them to W&B.
    ``logger.wandb.group`` / ``.name`` win; ``earlier`` (what a resumed run recorded) keeps a
    continued W&B run's group and name."""
    swept = job_sweeper_keys()
    stamp = sweep_stamp()
    earlier = earlier or {}
    group = OmegaConf.select(cfg, "logger.wandb.group", default=None) or earlier.get("group") or run_group(cfg)
    name = (
        OmegaConf.select(cfg, "logger.wandb.name", default=None)
        or earlier.get("name")
        or run_name(overrides, cfg.seed, swept)
    )
    return {
        "group": str(group),
        "name": str(name),
        "tags": run_tags(cfg, overrides, swept, stamp),
        "sweep": earlier.get("sweep") or stamp,
    }
