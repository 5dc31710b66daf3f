"""``model.init_from``: a run that starts from a Hugging Face checkpoint takes its architecture, in one
step before the schema gate, so a bad dir or a contradicted field is refused before anything is built.

Which fields the run gave itself comes from Hydra's record of the job: its overrides
(``model.<key>=``) and the files of deltas its defaults tree composed (the chosen experiment and
variant, with the files their own defaults lists name), each loaded by Hydra from the run's search
path. A ``model=`` preset is not among them: its sizes are what a checkpoint replaces (nor a
``data=`` choice: its padding is what the checkpoint's vocabulary replaces). Called from Python
outside a Hydra job, the run gave nothing: every field the checkpoint fixes is taken.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.interop.families import flat
from attnlab.interop.hf_load import HFCheckpoint, architecture_from, vocabulary_from
from attnlab.training.results import RunRecord

DELTA_GROUPS = ("experiment", "variant")  # config groups whose files set keys on purpose, not sizes to replace


def given_keys() -> set[str]:
    """The dotted keys (``model.n_layer``, ``data.vocab_multiple``, ...) the running Hydra job set itself:
    its override keys and what its experiment and variant files set; empty outside a Hydra job."""
    from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra._internal.defaults_list import create_defaults_list
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not (HydraConfig.initialized() and GlobalHydra.instance().is_initialized()):
        return set()
    job = HydraConfig.get()
    overrides = list(job.overrides.task)
    keys = {override.lstrip("+~").partition("=")[0] for override in overrides}
    search_path = ConfigSearchPathImpl()  # where this job's configs came from, a --config-dir included
    for source in job.runtime.config_sources:
        search_path.append(source.provider, f"{source.schema}://{source.path}")
    repository = CachingConfigRepository(ConfigRepository(search_path))
    tree = create_defaults_list(
        repo=repository,
        config_name=job.job.config_name,
        overrides_list=OverridesParser.create().parse_overrides(overrides),
        prepend_hydra=False,
        skip_missing=False,
    )
    for default in tree.defaults:
        if default.config_path and default.config_path.partition("/")[0] in DELTA_GROUPS:
            placed = OmegaConf.to_container(repository.load_config(default.config_path).config)
            prefix = f"{default.package}." if default.package else ""
            keys |= {prefix + key for key in flat(placed)}
    return keys


def below(keys: set[str], section: str) -> set[str]:
    """The keys under ``section``, relative to it (a key naming the section itself covers every field)."""
    return {key.removeprefix(f"{section}.") for key in keys if key.startswith(f"{section}.")}


def take_architecture(cfg: DictConfig, record: RunRecord, given: set[str] | None = None) -> HFCheckpoint | None:
    """The opened checkpoint of ``model.init_from`` (None without one), its architecture written into
    ``cfg.model`` where the run did not set a field itself (``given``: the dotted keys it set, by default
    ``given_keys()``), the data's vocabulary unpadded unless the run set data.vocab_multiple, and the
    result checked against the checkpoint (a given field it contradicts, or an attention variant that
    cannot start neutral, is one line). results.json records the dir, its model_type and the fields taken."""
    if not cfg.model.get("init_from"):
        return None
    ckpt = HFCheckpoint.open(cfg.model.init_from)
    given = given_keys() if given is None else given
    taken = architecture_from(ckpt, below(given, "model"), OmegaConf.to_container(cfg.model, resolve=True))
    data_taken = vocabulary_from(below(given, "data"), cfg.data)
    with open_dict(cfg):
        for key, value in taken.items():
            OmegaConf.update(cfg, f"model.{key}", value, merge=False)
        for key, value in data_taken.items():
            OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    ckpt.check(OmegaConf.to_container(cfg.model, resolve=True))
    record.data["config"] = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    record.data["init_from"] = {
        "path": str(ckpt.path.resolve()),
        "model_type": ckpt.family,
        "taken": sorted(taken),
        "data_taken": sorted(data_taken),
    }
    return ckpt
