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

from attnlab.config.compose import parse_overrides
from attnlab.config.run import RunSpec, config_groups
from attnlab.config.schema import Schema, axis_keys
from attnlab.config.study import swept_keys

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
AXES = derive_axes([*axis_keys(), *(key for keys in swept_keys().values() for key in keys)])
GROUP_AXES = {name for name, key in AXES.items() if "." not in key and key in config_groups()}  # e.g. attention=sdpa
NAME_OF = {key: name for name, key in AXES.items()}


def axis_name(key: str) -> str:
    """The short name of a config key: its top-level field's, or derived beside the fields' names."""
    key = key.lstrip("+~")
    return NAME_OF.get(key) or {k: n for n, k in derive_axes([*AXES.values(), key]).items()}[key]


def axes(spec: RunSpec) -> dict:
    """The top-level W&B config fields of a run: every axis under its short name (a group's option for a
    group axis, else the key's value), its d_k and KV heads as the model resolves them, its data and study."""
    model = spec.schema.model
    values = {name: spec.job.choices.get(key) if name in GROUP_AXES else spec.select(key) for name, key in AXES.items()}
    values["d_k"], values["n_kv_head"] = model.d_k, model.n_kv_head
    data = spec.config.get("data") or {}
    values["data"] = data.get("source") or data.get("_target_", "").rsplit(".", 1)[-1]
    values["study"] = spec.schema.study
    return values


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


def run_group(schema: Schema) -> str:
    """The W&B group: ``run_group`` if set, else the study."""
    return str(schema.run_group or schema.study or "adhoc")


def run_tags(spec: RunSpec) -> list[str]:
    """Each axis the run sets as ``axis=value``, ``seed=N`` when swept, ``sweep=<dir>`` in a multirun,
    ``debug=<option>`` for a debug run, and the backend and scaling."""
    job, attention = spec.job, spec.schema.model.attention
    tags = [f"{name}={value}" for name, value in run_axes(job.overrides, job.swept)]
    if "seed" in parse_overrides(job.overrides):
        tags.append(f"seed={spec.schema.seed}")
    if job.stamp:
        tags.append(f"sweep={job.stamp}")
    if debug := job.choices.get("debug"):
        tags.append(f"debug={debug}")
    tags += [str(attention.backend), str(attention.scaling)]
    return list(dict.fromkeys(t[:TAG_MAX] for t in tags))


def wandb_identity(spec: RunSpec, earlier: dict | None = None) -> dict:
    """The group, name, tags and sweep stamp of a run, as build_loggers passes them to W&B.
    ``logger.wandb.group`` / ``.name`` win; ``earlier`` (what a resumed run recorded) keeps a
    continued W&B run's group and name."""
    earlier = earlier or {}
    wandb = spec.schema.logger.wandb if spec.schema.logger is not None else None
    return {
        "group": str((wandb and wandb.group) or earlier.get("group") or run_group(spec.schema)),
        "name": str(
            (wandb and wandb.name)
            or earlier.get("name")
            or run_name(spec.job.overrides, spec.schema.seed, spec.job.swept)
        ),
        "tags": run_tags(spec),
        "sweep": earlier.get("sweep") or spec.job.stamp,
    }
