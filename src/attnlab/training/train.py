"""Entry point: ``python -m attnlab.training.train [hydra overrides]`` (also ``attnlab train``).

``train(cfg) -> metrics`` does the work and is what tests call; ``main`` wraps it in Hydra and
turns known failures into one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

from attnlab.training import phases
from attnlab.training.startup import defer_scipy_signal  # noqa: E402

defer_scipy_signal()  # before Lightning imports torchmetrics, which imports scipy.signal (attnlab/training/startup.py)

import hydra  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from lightning.pytorch.profilers import Profiler  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402
from omegaconf import DictConfig, OmegaConf, open_dict  # noqa: E402

from attnlab.config.compose import CONF_DIR  # noqa: E402
from attnlab.config.schema import Schema, apply_renamed_keys  # noqa: E402
from attnlab.interop.hf_load import HFCheckpoint, architecture_from, given_model_keys, vocabulary_from  # noqa: E402
from attnlab.training import wandb_runs  # noqa: E402
from attnlab.training.checkpointing import AtomicCheckpointIO, newest_intact, read_checkpoint  # noqa: E402
from attnlab.training.console import progress_line, quiet_lightning, run_output  # noqa: E402
from attnlab.training.devices import ddp_multirun_job, prepare_device  # noqa: E402
from attnlab.training.interrupt import GracefulInterrupt, Interrupted  # noqa: E402
from attnlab.training.lit_module import GPTModule  # noqa: E402
from attnlab.training.resources import check_fits, is_out_of_memory, out_of_memory  # noqa: E402
from attnlab.training.results import (  # noqa: E402
    FINGERPRINT,
    FINISHED_ENV,
    RESULTS,
    RunRecord,
    finished_before,
    hydra_overrides,
    is_rank_zero,
    resumable,
    training_fingerprint,
)
from attnlab.training.slurm import cluster_plugins, scheduler_restarts, slurm_job  # noqa: E402
from attnlab.util.errors import AttnlabError, CheckpointError, ConfigError, RunFault, WriteFailed  # noqa: E402
from attnlab.util.files import DISK_HINTS, atomic_write_text  # noqa: E402

phases.imports_done()
log = logging.getLogger("attnlab")

AXES = wandb_runs.AXES  # the top-level W&B config fields: every axis a committed study sweeps (wandb_runs.py)


def axes(cfg: DictConfig, overrides: list[str] = ()) -> dict:
    return wandb_runs.axes(cfg, overrides)


def run_group(cfg: DictConfig) -> str:
    """W&B group: ``run_group`` if set, else the study (a multirun's sweep dir is a tag, ``sweep=<dir name>``)."""
    return wandb_runs.run_group(cfg)


def wandb_run_id(run_dir: Path) -> str:
    """The run dir's W&B id, created once: a resumed run continues the same W&B run."""
    path = run_dir / "wandb_run_id"
    if path.exists():
        return path.read_text().strip()
    import secrets
    import string

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's id alphabet
    if is_rank_zero():
        path.write_text(run_id)
    return run_id


def build_loggers(cfg: DictConfig, run_dir: Path, identity: dict | None = None) -> list:
    """The configured loggers. Without the wandb package (a cluster node with a site torch, say)
    the W&B logger is left out with one line, and CSV is kept or added so the run still logs.
    ``identity``: the W&B group, name and tags (``wandb_runs.wandb_identity``)."""
    loggers = []
    chosen = dict(cfg.get("logger") or {})
    if "wandb" in chosen and chosen["wandb"].mode != "disabled" and importlib.util.find_spec("wandb") is None:
        del chosen["wandb"]
        if is_rank_zero():
            print(
                "attnlab: logger=wandb: the wandb package is not installed; logging to CSV only "
                "(pip install wandb, or logger=csv to silence this)",
                file=sys.stderr,
            )
        chosen.setdefault("csv", OmegaConf.load(CONF_DIR / "logger" / "csv.yaml")["csv"])
    for name, lg_cfg in chosen.items():
        if name == "wandb":
            if lg_cfg.mode == "disabled":
                continue  # truly off: no wandb.init, no files
            who = identity or wandb_runs.wandb_identity(cfg, [])
            loggers.append(
                instantiate(
                    lg_cfg,
                    _convert_="all",  # settings as a dict, as wandb.init takes it
                    save_dir=str(run_dir),
                    id=wandb_run_id(run_dir),
                    name=who["name"],
                    group=who["group"],
                    tags=list(dict.fromkeys([*lg_cfg.tags, *who["tags"]])),
                )
            )
        else:
            loggers.append(instantiate(lg_cfg, save_dir=str(run_dir)))
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


class NoProfiler(Profiler):
    """Profiles nothing, as Lightning's default (PassThroughProfiler) does, at less cost per action.

    Lightning brackets each hook of each callback, of the module and of the strategy with
    ``profiler.profile(name)``: about 85 actions a training step of the default run. The default's is
    a generator-based context manager (nine Python calls an action); this one hands back one shared
    no-op (three)."""

    _nothing = contextlib.nullcontext()

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return self._nothing


def build_callbacks(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None and "_target_" in c]


def kernels_used(module: GPTModule) -> tuple[str | None, bool]:
    """The kernel(s) of the training forwards, never a probe's: e.g. "eager" or "sdpa:flash", joined
    with + if layers differed and with -> where a layer's kernel changed during the run; and
    whether one changed."""
    layers = [layer.training_kernels for layer in module.model.attention_layers() if layer.training_kernels]
    names = sorted({" -> ".join(kernels) for kernels in layers})
    return "+".join(names) or None, any(len(kernels) > 1 for kernels in layers)


def check_kernel_runs(module: GPTModule, cfg: Schema, trainer: L.Trainer) -> None:
    """One tiny forward on the training device and precision, so an unavailable kernel fails now."""
    x = torch.zeros(1, min(8, cfg.model.block_size), dtype=torch.long, device=trainer.strategy.root_device)
    model = module.model.to(x.device)
    with torch.no_grad(), trainer.precision_plugin.forward_context():
        model(x)


def requeued_resume(run_dir: Path, restarts: int) -> tuple[str | None, dict | None]:
    """A requeued attempt continues the newest intact checkpoint of its own run dir, with no
    resume=true to type: it is the same job, sent back to the queue by a time limit or a preemption."""
    ckpt_dir = run_dir / "checkpoints"
    path, step, skipped = newest_intact(ckpt_dir) if ckpt_dir.is_dir() else (None, None, [])
    damaged = "".join(f"; {p.name} {problem}" for p, problem in skipped)
    if path is None:
        note = f"requeued attempt {restarts + 1}: no intact checkpoint in {ckpt_dir}{damaged}; starting at step 0"
        resumed = None
    else:
        note = f"requeued attempt {restarts + 1}: resuming from {path.name} (step {step}){damaged}"
        resumed = {
            "path": str(path),
            "step": step,
            "requeued_attempt": restarts + 1,
            "note": note,
            "skipped": [{"path": str(p), "problem": problem} for p, problem in skipped],
        }
    if is_rank_zero():
        print(f"attnlab: {note}", file=sys.stderr)
    return (str(path) if path else None), resumed


def earlier_interruptions(run_dir: Path) -> list[dict]:
    """The interruptions the run dir's results.json lists: a resumed run keeps its history."""
    try:
        return list(json.loads((run_dir / RESULTS).read_text()).get("interruptions") or [])
    except (OSError, ValueError, AttributeError):
        return []


def earlier_wandb(run_dir: Path) -> dict | None:
    """The W&B group, name and sweep the run dir's results.json recorded."""
    try:
        return json.loads((run_dir / RESULTS).read_text()).get("wandb")
    except (OSError, ValueError, AttributeError):
        return None


def resume_checkpoint(cfg: Schema, run_dir: Path) -> tuple[str | None, dict | None]:
    """The checkpoint to continue from, checked, and what results.json says about it.

    A requeued SLURM attempt: its run dir's newest intact checkpoint (``requeued_resume``), before
    anything else. ``ckpt_path``: that file, or one line saying what is wrong with it.
    ``resume=true``: the run dir's last.ckpt, or when it is damaged the newest intact checkpoint
    beside it (said in one line on stderr); one line when none is intact. Damaged files are left
    where they are.
    """
    restarts = scheduler_restarts()
    if restarts:
        path, resumed = requeued_resume(run_dir, restarts)
        if path is not None or not (cfg.ckpt_path or cfg.resume):
            return path, resumed
    if cfg.ckpt_path:
        if not Path(cfg.ckpt_path).is_file():
            raise ConfigError("ckpt_path", cfg.ckpt_path, "an existing checkpoint file")
        try:
            step = read_checkpoint(cfg.ckpt_path)["global_step"]
        except CheckpointError as err:
            raise CheckpointError(
                err.path, f"{err.problem}; expected an intact attnlab checkpoint for ckpt_path"
            ) from None
        return str(cfg.ckpt_path), {"path": str(cfg.ckpt_path), "step": step, "skipped": []}
    if not cfg.resume:
        return None, None
    ckpt_dir = run_dir / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    if not last.is_file() and not any(ckpt_dir.glob("*.ckpt")):
        raise ConfigError(
            "resume",
            True,
            f"a run dir holding checkpoints/last.ckpt (resume=true hydra.run.dir=<run dir>); {last} does not exist",
        )
    path, step, skipped = newest_intact(ckpt_dir)
    if not last.is_file():
        skipped.insert(0, (last, "is missing"))
    damaged = "; ".join(f"{p.name} {problem}" for p, problem in skipped)
    if path is None:
        raise AttnlabError(
            f"resume=true: no intact checkpoint in {ckpt_dir} ({damaged}); "
            "start a new run, or set ckpt_path= to an intact copy"
        )
    resumed = {
        "path": str(path),
        "step": step,
        "skipped": [{"path": str(p), "problem": problem} for p, problem in skipped],
    }
    if skipped:
        resumed["note"] = (
            f"resume=true: {damaged}; resuming from {path.name} (step {step}), the newest intact checkpoint"
        )
        if is_rank_zero():
            print(f"attnlab: {resumed['note']}", file=sys.stderr)
    return str(path), resumed


def reached(trainer: L.Trainer | None) -> dict | None:
    """The last logged values and the step: what an interrupted run got to."""
    if trainer is None:
        return None
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    return metrics | {"step": trainer.global_step}


def final_metrics(trainer: L.Trainer, module: GPTModule, callbacks: list) -> dict:
    """Last logged values, the median tokens/s over steps, and each callback's ``summary()``."""
    metrics = reached(trainer)
    for callback in callbacks:
        metrics.update(callback.summary() if hasattr(callback, "summary") else {})
    metrics["perf/tokens_per_s"] = module.median_tokens_per_s
    metrics["step"] = trainer.global_step
    return metrics


def skip_finished(run_dir: Path, config: dict, done: dict) -> dict:
    """A sweep's job that has run before: its own results.json stays as it is; one finished in the study's
    runs.csv leaves a results.json marked ``skipped`` (the report reads the row already there)."""
    print(f"attnlab: already finished ({done['where']}); skipped", file=sys.stderr)
    if done["in_run_dir"]:
        return json.loads((run_dir / RESULTS).read_text()).get("metrics") or {}
    if is_rank_zero():
        record = {"status": "skipped", "finished_in": done["where"], "overrides": hydra_overrides(), "config": config}
        atomic_write_text(run_dir / RESULTS, json.dumps(record, indent=2, default=str))
    return {}


def take_architecture(cfg: DictConfig, record: RunRecord):
    """``model.init_from``: the checkpoint's architecture written into ``cfg.model`` where the run did
    not set a field itself (its overrides, its experiment or variant file; called from Python, with
    no Hydra overrides, every field is taken), and the data's vocabulary unpadded unless the run set
    data.vocab_multiple (hf_load.vocabulary_from); results.json records the dir, its model_type and
    the fields taken. Returns the opened checkpoint (interop.hf_load.HFCheckpoint)."""

    ckpt = HFCheckpoint.open(cfg.model.init_from)
    overrides = record.data["overrides"]
    taken = architecture_from(
        ckpt, given_model_keys(overrides, CONF_DIR), OmegaConf.to_container(cfg.model, resolve=True)
    )
    data_taken = vocabulary_from(given_model_keys(overrides, CONF_DIR, "data"), cfg.data)
    with open_dict(cfg):
        for key, value in taken.items():
            OmegaConf.update(cfg, f"model.{key}", value, merge=False)
        for key, value in data_taken.items():
            OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    record.data["config"] = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    record.data["init_from"] = {
        "path": str(ckpt.path.resolve()),
        "model_type": ckpt.family,
        "taken": sorted(taken),
        "data_taken": sorted(data_taken),
    }
    return ckpt


def train(cfg: DictConfig) -> dict:
    """Train one model as configured; write results.json in ``paths.output_dir``; return its metrics."""
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    notes = [
        *apply_renamed_keys(cfg),
        prepare_device(cfg),
    ]  # old key names moved, trainer.precision=auto resolved, before they are recorded
    for note in notes if is_rank_zero() else ():
        if note:
            print(f"attnlab: {note}", file=sys.stderr)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    if (done := finished_before(run_dir, config, hydra_overrides())) is not None:
        return skip_finished(run_dir, config, done)
    if resumable(run_dir, config):  # a sweep started again: this job goes on from its last checkpoint
        cfg.resume = config["resume"] = True
    if is_rank_zero() and os.environ.get(FINISHED_ENV):
        atomic_write_text(run_dir / FINGERPRINT, training_fingerprint(config) + "\n")
    with phases.phase("results: run record (git sha)"):
        record = RunRecord(run_dir, cfg, config)
    record.data["slurm"] = slurm_job()
    loggers: list = []
    trainer = estimate = typed = None
    try:
        init_from = None
        if cfg.model.get("init_from"):  # a bad dir is refused before any logger or data is built on it
            init_from = take_architecture(cfg, record)
        # the gate, and the keys attnlab reads, typed; cfg still feeds instantiate and the record
        typed = Schema.from_cfg(cfg)
        if init_from is not None:
            init_from.check(OmegaConf.to_container(cfg.model, resolve=True))
        L.seed_everything(typed.seed, workers=True, verbose=False)
        max_steps = typed.trainer.max_steps
        ckpt_path, record.data["resumed_from"] = resume_checkpoint(typed, run_dir)
        record.data["interruptions"] = earlier_interruptions(run_dir) if ckpt_path or scheduler_restarts() else []
        continued = (run_dir / "wandb_run_id").exists()  # the same W&B run goes on: keep its group and name
        identity = wandb_runs.wandb_identity(
            cfg, record.data["overrides"], earlier_wandb(run_dir) if continued else None
        )
        if "wandb" in (cfg.get("logger") or {}):
            record.data["wandb"] = {
                k: identity[k] for k in ("group", "name", "sweep")
            }  # the summary run joins this group
        with phases.phase("loggers: build"):
            loggers = build_loggers(cfg, run_dir, identity)
        start_experiments(loggers)  # W&B starts in a thread; nothing below waits for it
        with phases.phase("data: read and encode the corpus"):
            dm = instantiate(cfg.data, block_size=typed.model.block_size, steps=max_steps, seed=typed.seed)
            dm.setup("fit")
            dm.tokenizer.save(run_dir / "vocab.json")
        with phases.phase("model: build"):
            model_cfg = dataclasses.replace(typed.model, vocab_size=dm.vocab_size)
            module = GPTModule(model_cfg, typed.optim, max_steps, vocab=dm.vocab())
            if init_from is not None:
                init_from.load_into(module.model)
        with phases.phase("callbacks: build"):
            callbacks = [
                *build_callbacks(cfg),
                *progress_line(cfg.trainer.enable_progress_bar),
                GracefulInterrupt(run_dir / "checkpoints" / "last.ckpt"),
            ]
        # the phases inside fit when recording (attnlab.training.phases), else no profiling at the least cost
        profiler = (phases.lightning_profiler() or NoProfiler()) if cfg.trainer.get("profiler") is None else None
        with phases.phase("trainer: build"):
            trainer = instantiate(
                cfg.trainer,
                logger=loggers or False,
                callbacks=callbacks,
                plugins=[AtomicCheckpointIO(), *cluster_plugins()],
                default_root_dir=str(run_dir),
                # Lightning counts val_check_interval in batches; the config, in optimizer steps
                val_check_interval=min(typed.trainer.val_check_interval, max_steps)
                * typed.trainer.accumulate_grad_batches,
                **({"profiler": profiler} if profiler is not None else {}),
            )
        if typed.memory_check:
            with phases.phase("memory check"):
                processes = trainer.num_devices if trainer.strategy.root_device.type == "cpu" else 1
                estimate = check_fits(
                    typed,
                    sum(p.numel() for p in module.parameters()),
                    dm.vocab_size,
                    trainer.strategy.root_device,
                    processes,
                )
        with phases.phase("kernel check forward"):
            check_kernel_runs(module, typed, trainer)
        with phases.phase("loggers: log config"):
            provenance = {k: record.data[k] for k in ("config", "overrides", "git_sha")}
            hparams = {**axes(cfg, record.data["overrides"]), "sweep": identity["sweep"], **provenance}
            for lg in loggers:
                lg.log_hyperparams(dict(hparams))
        with ddp_multirun_job(cfg), phases.phase("fit: Lightning loop"):
            trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        if module.last_val_step != trainer.global_step:
            with phases.phase("fit: closing validation"):
                trainer.validate(module, datamodule=dm, verbose=False)
        with phases.phase("end of run: metrics and summaries"):
            metrics = final_metrics(trainer, module, callbacks)
            record.data["attention"]["kernel"], record.data["attention"]["kernel_changed"] = kernels_used(module)
            record.data["compile"] = module.compile_record
            extra = {k: v for cb in callbacks if hasattr(cb, "results_fields") for k, v in cb.results_fields().items()}
        with phases.phase("results.json"):
            record.finish("ok", metrics, **extra)
        return metrics
    except (KeyboardInterrupt, Interrupted, SIGTERMException) as caught:
        err = caught
        if isinstance(caught, SIGTERMException):  # Lightning's, outside the training steps (the closing validation)
            step = trainer.global_step if trainer else 0
            err = Interrupted(
                f"SIGTERM at step {step}, outside the training steps: no checkpoint written after the last "
                f"periodic one; resume with resume=true hydra.run.dir={run_dir}",
                "SIGTERM",
                step,
            )
        if isinstance(err, Interrupted):
            if err.handoff:  # the scheduler requeues now; W&B closed first, while its process still lives
                finish_wandb(loggers, failed=True)
                err.hand_over()
            record.data.setdefault("interruptions", []).append(err.record())
        record_failure(record, "interrupted", err, str(err) or "interrupted", reached(trainer))
        if err is not caught:
            raise err from None
        raise
    except AttnlabError as err:
        record_failure(record, "failed", err, str(err))
        raise
    except Exception as err:
        known = as_known_fault(err, typed, trainer, estimate)
        if known is None:
            record_failure(record, "failed", err, f"{type(err).__name__}: {err}")
            raise
        record_failure(record, "failed", known, str(known))
        raise known from None
    finally:
        finish_wandb(loggers, failed=record.data["status"] != "ok")


def as_known_fault(err: Exception, cfg: Schema | None, trainer, estimate) -> AttnlabError | None:
    """Out of memory, or a disk that refused a file (a logger's, say): one line instead of a traceback.
    ``cfg``: None when the run failed before its config was typed."""
    if is_out_of_memory(err):
        return out_of_memory(err, cfg, trainer.global_step if trainer is not None else None, estimate)
    if isinstance(err, OSError) and err.filename and err.errno in DISK_HINTS:
        return RunFault(f"{err.strerror}: {err.filename}; {DISK_HINTS[err.errno]}")
    return None


def record_failure(record: RunRecord, status: str, err: BaseException, error: str, metrics: dict | None = None) -> None:
    """Write the failure (and what the run reached) into results.json; if even that write fails,
    the error line says so too."""
    if isinstance(err, WriteFailed) and err.path == record.path:
        return  # results.json itself could not be written: nothing more to try
    try:
        record.finish(status, metrics, error=error)
    except WriteFailed as write_err:
        err.args = (f"{err} (results.json not updated either: {write_err})",)


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


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def hydra_entry(cfg: DictConfig) -> float | None:
    """One job; under `attnlab sweep` its output goes to its run dir's console.log (console.run_output)."""
    with run_output(cfg.paths.output_dir):
        return run_job(cfg)


def run_job(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        with quiet_lightning(), phases.phase("train(): not covered by a phase"):
            metrics = train(cfg)
    except Interrupted as err:
        print(f"attnlab: interrupted: {err}", file=sys.stderr)
        if multirun and os.environ.get("SUBMITIT_EXECUTOR") and not err.requeued:
            return None  # a cluster job of its own (scancel, requeues used up): results.json says so; the others go on
        sys.exit(130)  # ends a local multirun (the user asked to stop); a requeued job leaves submitit no result
    except AttnlabError as err:
        print(f"attnlab: error: {err}", file=sys.stderr)
        if multirun:
            return None  # results.json says failed; the other jobs go on
        sys.exit(err.exit_code)
    except Exception as err:
        if not multirun:
            raise
        log.exception("job failed")
        print(f"attnlab: job {HydraConfig.get().job.num} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    if not metrics:  # skipped: finished in the study's runs.csv
        return None
    print(f"attnlab: val/loss {metrics.get('val/loss', float('nan')):.4f}; results in {cfg.paths.output_dir}")
    return metrics.get("val/loss")


def main() -> None:
    """Console entry: Hydra's own errors (unknown option, bad override) become one line, exit 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # let errors reach us instead of Hydra's report
    try:
        with phases.phase("Hydra: parse, compose, run dir, log set-up"):
            hydra_entry()
        # The process ends next: its exit would otherwise walk every object of torch, Lightning and
        # W&B in a last collection (about 2 s on a busy 2-core machine, reports/bench/breakdown.md).
        gc.freeze()
    except (HydraException, OmegaConfBaseException) as err:
        text = str(err).split("\nConfig search path")[0]
        print("attnlab: error: " + " ".join(text.split()), file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # e.g. the output dir cannot be created
        print(
            f"attnlab: error: cannot write {err.filename}: {err.strerror}; expected a writable "
            "hydra.run.dir (or paths.log_dir)",
            file=sys.stderr,
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
