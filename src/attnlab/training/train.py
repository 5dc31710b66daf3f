"""Entry point: ``python -m attnlab.training.train [hydra overrides]`` (also ``attnlab train``).

``train(cfg) -> metrics`` does the work and is what tests call; ``main`` wraps it in Hydra and
turns known failures into one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from attnlab.config.compose import CONF_DIR
from attnlab.config.run import Job, RunSpec
from attnlab.config.schema import Schema
from attnlab.interop.hf_load import HFCheckpoint
from attnlab.training import phases
from attnlab.training.checkpointing import AtomicCheckpointIO
from attnlab.training.console import progress_line, quiet_lightning, run_output
from attnlab.training.continuation import continue_from
from attnlab.training.devices import ddp_multirun_job, set_matmul_precision
from attnlab.training.init_from import take_architecture
from attnlab.training.interrupt import GracefulInterrupt, Interrupted
from attnlab.training.lit_module import GPTModule
from attnlab.training.loggers import finish_wandb, log_config, start_loggers
from attnlab.training.resources import StepMemory, check_fits, is_out_of_memory, out_of_memory
from attnlab.training.results import (
    FINGERPRINT,
    FINISHED_ENV,
    RESULTS,
    RunRecord,
    describe_device,
    finished_before,
    is_rank_zero,
    resumable,
    training_fingerprint,
)
from attnlab.training.settle import settle
from attnlab.training.slurm import cluster_plugins, slurm_job
from attnlab.util.errors import AttnlabError, RunFault, WriteFailed
from attnlab.util.files import DISK_HINTS, atomic_write_text

phases.imports_done()
log = logging.getLogger("attnlab")


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


def build_callbacks(blocks: DictConfig | None) -> list:
    """The composed ``callbacks`` section's blocks, each instantiated."""
    return [instantiate(c) for c in (blocks or {}).values() if c is not None and "_target_" in c]


def kernels_used(module: GPTModule) -> tuple[str | None, bool]:
    """The kernel(s) of the training forwards, never a probe's: e.g. "eager" or "sdpa:flash", joined
    with + if layers differed and with -> where a layer's kernel changed during the run; and
    whether one changed."""
    layers = [layer.training_kernels for layer in module.model.attention_layers() if layer.training_kernels]
    names = sorted({" -> ".join(kernels) for kernels in layers})
    return "+".join(names) or None, any(len(kernels) > 1 for kernels in layers)


def check_kernel_runs(module: GPTModule, typed: Schema, trainer: L.Trainer) -> None:
    """One tiny forward on the training device and precision, so an unavailable kernel fails now."""
    with phases.phase("kernel check forward"):
        x = torch.zeros(1, min(8, typed.model.block_size), dtype=torch.long, device=trainer.strategy.root_device)
        model = module.model.to(x.device)
        with torch.no_grad(), trainer.precision_plugin.forward_context():
            model(x)


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


def skip_finished(run_dir: Path, config: dict, job: Job, done: dict) -> dict:
    """A sweep's job that has run before: its own results.json stays as it is; one finished in the study's
    runs.csv leaves a results.json marked ``skipped`` (the report reads the row already there)."""
    print(f"attnlab: already finished ({done['where']}); skipped", file=sys.stderr)
    if done["in_run_dir"]:
        return json.loads((run_dir / RESULTS).read_text()).get("metrics") or {}
    if is_rank_zero():
        record = {"status": "skipped", "finished_in": done["where"], "overrides": list(job.overrides), "config": config}
        atomic_write_text(run_dir / RESULTS, json.dumps(record, indent=2, default=str))
    return {}


def settle_config(cfg: DictConfig) -> dict:
    """Old key names moved and trainer.precision=auto resolved (each said in a line on stderr), before
    they are recorded; the config as a dict."""
    notes = settle(cfg)
    for note in notes if is_rank_zero() else ():
        print(f"attnlab: {note}", file=sys.stderr)
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def open_record(cfg: DictConfig, config: dict, job: Job, run_dir: Path) -> RunRecord:
    """results.json's record of the run (status running); a sweep's job started again goes on from its
    last checkpoint, and a sweep that skips finished runs gets the fingerprint to know this one by."""
    if resumable(run_dir, config):
        cfg.resume = config["resume"] = True
    if is_rank_zero() and os.environ.get(FINISHED_ENV):
        atomic_write_text(run_dir / FINGERPRINT, training_fingerprint(config) + "\n")
    with phases.phase("results: run record (git sha)"):
        record = RunRecord(run_dir, config, job.overrides)
    record.data["slurm"] = slurm_job()
    return record


def build_data(block: DictConfig, spec: RunSpec):
    """The data module (``block``: the composed ``data`` section), its corpus read and encoded; the run
    dir keeps its vocabulary."""
    typed = spec.schema
    with phases.phase("data: read and encode the corpus"):
        dm = instantiate(block, block_size=typed.model.block_size, steps=typed.trainer.max_steps, seed=typed.seed)
        dm.setup("fit")
        dm.tokenizer.save(spec.run_dir / "vocab.json")
    return dm


def build_module(typed: Schema, dm, init_from: HFCheckpoint | None) -> GPTModule:
    """The LightningModule at the data's vocabulary, its weights the checkpoint's under model.init_from."""
    with phases.phase("model: build"):
        module = GPTModule(
            dataclasses.replace(typed.model, vocab_size=dm.vocab_size), typed.optim, typed.trainer.max_steps, dm.vocab()
        )
        if init_from is not None:
            init_from.load_into(module.model)
    return module


def run_callbacks(blocks: DictConfig | None, spec: RunSpec) -> list:
    """The configured callbacks (``blocks``: the composed ``callbacks`` section), the progress line
    and the graceful interrupt."""
    with phases.phase("callbacks: build"):
        return [
            *build_callbacks(blocks),
            *progress_line(spec.schema.trainer.enable_progress_bar),
            GracefulInterrupt(spec.run_dir / "checkpoints" / "last.ckpt"),
        ]


def build_trainer(block: DictConfig, spec: RunSpec, loggers: list, callbacks: list) -> L.Trainer:
    """Lightning's Trainer (``block``: the composed ``trainer`` section)."""
    typed = spec.schema
    # the phases inside fit when recording (attnlab.training.phases), else no profiling at the least cost
    profiler = (phases.lightning_profiler() or NoProfiler()) if typed.trainer.profiler is None else None
    with phases.phase("trainer: build"):
        return instantiate(
            block,
            logger=loggers or False,
            callbacks=callbacks,
            plugins=[AtomicCheckpointIO(), *cluster_plugins()],
            default_root_dir=str(spec.run_dir),
            # Lightning counts val_check_interval in batches; the config, in optimizer steps
            val_check_interval=min(typed.trainer.val_check_interval, typed.trainer.max_steps)
            * typed.trainer.accumulate_grad_batches,
            **({"profiler": profiler} if profiler is not None else {}),
        )


def check_memory(typed: Schema, module: GPTModule, dm, trainer: L.Trainer) -> StepMemory | None:
    """The step's memory estimate, refused before training where it exceeds the device (memory_check)."""
    if not typed.memory_check:
        return None
    with phases.phase("memory check"):
        processes = trainer.num_devices if trainer.strategy.root_device.type == "cpu" else 1
        n_params = sum(p.numel() for p in module.parameters())
        return check_fits(typed, n_params, dm.vocab_size, trainer.strategy.root_device, processes)


def fit(spec: RunSpec, trainer: L.Trainer, module: GPTModule, dm, ckpt_path: str | None) -> None:
    """Lightning's loop, then a validation at the last step if the loop's last one came earlier."""
    with ddp_multirun_job(spec.schema.trainer, spec.job), phases.phase("fit: Lightning loop"):
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    if module.last_val_step != trainer.global_step:
        with phases.phase("fit: closing validation"):
            trainer.validate(module, datamodule=dm, verbose=False)


def finish(record: RunRecord, trainer: L.Trainer, module: GPTModule, callbacks: list) -> dict:
    """The run's metrics, its kernels and compile record, and each callback's fields, in results.json."""
    with phases.phase("end of run: metrics and summaries"):
        metrics = final_metrics(trainer, module, callbacks)
        record.data["attention"]["kernel"], record.data["attention"]["kernel_changed"] = kernels_used(module)
        record.data["compile"] = module.compile_record
        extra = {k: v for cb in callbacks if hasattr(cb, "results_fields") for k, v in cb.results_fields().items()}
    with phases.phase("results.json"):
        record.finish("ok", metrics, **extra)
    return metrics


@dataclass
class Built:
    """What the run has built so far: what a failure reports and closes."""

    loggers: list = field(default_factory=list)
    typed: Schema | None = None
    trainer: L.Trainer | None = None
    estimate: StepMemory | None = None


def train(cfg: DictConfig) -> dict:
    """Train one model as configured; write results.json in ``paths.output_dir``; return its metrics.
    The composed ``cfg`` is settled and gated into a ``RunSpec`` here; below, it is read only where
    Hydra instantiates a block (data, callbacks, loggers, the Trainer)."""
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = Job.current()
    config = settle_config(cfg)
    if (done := finished_before(run_dir, config, job.overrides)) is not None:
        return skip_finished(run_dir, config, job, done)
    record = open_record(cfg, config, job, run_dir)
    built = Built()
    try:
        init_from = take_architecture(cfg, record)  # a bad dir is refused before anything is built on it
        spec = RunSpec.of(cfg, job, run_dir, record.data["config"])  # the gate
        built.typed = typed = spec.schema
        set_matmul_precision(typed.trainer, typed.tf32)
        L.seed_everything(typed.seed, workers=True, verbose=False)
        ckpt_path = continue_from(typed, run_dir, record)
        built.loggers, identity = start_loggers(cfg.get("logger"), spec, record)
        dm = build_data(cfg.data, spec)
        module = build_module(typed, dm, init_from)
        callbacks = run_callbacks(cfg.get("callbacks"), spec)
        built.trainer = trainer = build_trainer(cfg.trainer, spec, built.loggers, callbacks)
        record.data["provenance"]["device"] = describe_device(trainer.strategy.root_device)
        built.estimate = check_memory(typed, module, dm, trainer)
        check_kernel_runs(module, typed, trainer)
        log_config(built.loggers, spec, record, identity)
        fit(spec, trainer, module, dm, ckpt_path)
        return finish(record, trainer, module, callbacks)
    except (KeyboardInterrupt, Interrupted, SIGTERMException) as caught:
        err = record_interruption(caught, built, record, run_dir)
        if err is not caught:
            raise err from None
        raise
    except AttnlabError as err:
        record_failure(record, "failed", err, str(err))
        raise
    except Exception as err:
        known = as_known_fault(err, built)
        if known is None:
            record_failure(record, "failed", err, f"{type(err).__name__}: {err}")
            raise
        record_failure(record, "failed", known, str(known))
        raise known from None
    finally:
        finish_wandb(built.loggers, failed=record.data["status"] != "ok")


def record_interruption(caught: BaseException, built: Built, record: RunRecord, run_dir: Path) -> BaseException:
    """The interruption recorded in results.json (a requeue handed over first); returns the error to raise:
    Lightning's SIGTERM outside the training steps becomes an Interrupted that says how to resume."""
    err = caught
    trainer = built.trainer
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
            finish_wandb(built.loggers, failed=True)
            err.hand_over()
        record.data.setdefault("interruptions", []).append(err.record())
    record_failure(record, "interrupted", err, str(err) or "interrupted", reached(trainer))
    return err


def as_known_fault(err: Exception, built: Built) -> AttnlabError | None:
    """Out of memory, or a disk that refused a file (a logger's, say): one line instead of a traceback.
    ``built.typed``: None when the run failed before its config was typed."""
    if is_out_of_memory(err):
        step = built.trainer.global_step if built.trainer is not None else None
        return out_of_memory(err, built.typed, step, built.estimate)
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
