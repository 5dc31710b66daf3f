"""A run's loggers: built from ``logger=``, the W&B run started in the background and closed at the end.

A run dir keeps its W&B id (``wandb_run_id``), so a resumed run continues the same W&B run under the
group and name it had (``continuation.earlier_wandb``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from attnlab.config.compose import CONF_DIR
from attnlab.config.run import RunSpec
from attnlab.training import phases, wandb_runs
from attnlab.training.continuation import earlier_wandb
from attnlab.training.results import RunRecord, is_rank_zero

RUN_ID = "wandb_run_id"  # the run dir's file holding its W&B id


def wandb_run_id(run_dir: Path) -> str:
    """The run dir's W&B id, created once: a resumed run continues the same W&B run."""
    path = run_dir / RUN_ID
    if path.exists():
        return path.read_text().strip()
    import secrets
    import string

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's id alphabet
    if is_rank_zero():
        path.write_text(run_id)
    return run_id


def build_loggers(blocks: DictConfig | None, run_dir: Path, identity: dict) -> list:
    """The configured loggers (``blocks``: the composed ``logger`` section, each a block Hydra
    instantiates). Without the wandb package (a cluster node with a site torch, say) the W&B logger
    is left out with one line, and CSV is kept or added so the run still logs. ``identity``: the W&B
    group, name and tags (``wandb_runs.wandb_identity``)."""
    loggers = []
    chosen = dict(blocks or {})
    if "wandb" in chosen and chosen["wandb"].mode != "disabled" and importlib.util.find_spec("wandb") is None:
        del chosen["wandb"]
        if is_rank_zero():
            print(
                "attnlab: logger=wandb: the wandb package is not installed; logging to CSV only "
                "(pip install wandb, or logger=csv to silence this)",
                file=sys.stderr,
            )
        chosen.setdefault("csv", OmegaConf.load(CONF_DIR / "logger" / "csv.yaml")["csv"])
    for name, block in chosen.items():
        if name == "wandb":
            if block.mode == "disabled":
                continue  # truly off: no wandb.init, no files
            loggers.append(
                instantiate(
                    block,
                    _convert_="all",  # settings as a dict, as wandb.init takes it
                    save_dir=str(run_dir),
                    id=wandb_run_id(run_dir),
                    name=identity["name"],
                    group=identity["group"],
                    tags=list(dict.fromkeys([*block.tags, *identity["tags"]])),
                )
            )
        else:
            loggers.append(instantiate(block, save_dir=str(run_dir)))
    return loggers


def wandb_loggers(loggers: list) -> list:
    """The W&B loggers among ``loggers`` (Lightning's WandbLogger or console.WandbLogger, matched by name:
    W&B need not be importable to ask)."""
    return [lg for lg in loggers if type(lg).__name__ == "WandbLogger"]


def start_experiments(loggers: list) -> None:
    """Start each W&B run in the background (``console.WandbLogger.start``): the set-up and the first
    steps go on while wandb is imported and its service starts, and what they log reaches W&B in order
    once it is up. A W&B logger without ``start`` (Lightning's own) starts at its first use, as usual."""
    for lg in wandb_loggers(loggers):
        if hasattr(lg, "start"):
            lg.start()


def start_loggers(blocks: DictConfig | None, spec: RunSpec, record: RunRecord) -> tuple[list, dict]:
    """The run's loggers, W&B started in a thread (nothing after this waits for it), and its W&B
    identity (group, name, tags, sweep), which results.json records for the summary run to join."""
    continued = (spec.run_dir / RUN_ID).exists()  # the same W&B run goes on: keep its group and name
    identity = wandb_runs.wandb_identity(spec, earlier_wandb(spec.run_dir) if continued else None)
    if spec.schema.logger is not None and spec.schema.logger.wandb is not None:
        record.data["wandb"] = {k: identity[k] for k in ("group", "name", "sweep")}
    with phases.phase("loggers: build"):
        loggers = build_loggers(blocks, spec.run_dir, identity)
    start_experiments(loggers)
    return loggers, identity


def log_config(loggers: list, spec: RunSpec, record: RunRecord, identity: dict) -> None:
    """Every axis under its short name (W&B's columns), the sweep stamp, and the run's provenance."""
    with phases.phase("loggers: log config"):
        provenance = {k: record.data[k] for k in ("config", "overrides", "provenance")}
        hparams = {**wandb_runs.axes(spec), "sweep": identity["sweep"], **provenance}
        for lg in loggers:
            lg.log_hyperparams(dict(hparams))


def finish_wandb(loggers: list, failed: bool) -> None:
    """Close the W&B run of this job, so a multirun makes one W&B run per job."""
    if wandb_loggers(loggers):
        import wandb

        try:
            with phases.phase("W&B: finish"):
                for lg in wandb_loggers(loggers):
                    if hasattr(lg, "settle"):
                        lg.settle()  # a start still under way is waited for; what waited for it is logged
                wandb.finish(exit_code=1 if failed else 0)
        except Exception as err:  # noqa: BLE001 - e.g. its service process killed with the job: say so, keep the run's own error
            print(
                f"attnlab: W&B run not closed cleanly ({type(err).__name__}: {err}); its offline files hold what was "
                "logged before",
                file=sys.stderr,
            )
