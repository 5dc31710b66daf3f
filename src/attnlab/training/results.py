"""results.json: one per run, ok or not, written atomically so it is never half-written."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

import attnlab
from attnlab.config.compose import parse_overrides
from attnlab.util.files import atomic_write_text, json_safe, source_commit, write_failure

RESULTS = "results.json"
# set by a sweep: the JSON file of runs its study has already finished (studies/resume.py writes it)
FINISHED_ENV = "ATTNLAB_FINISHED"
FINGERPRINT = "training.fingerprint"  # a run dir's fingerprint, written when it starts: what its checkpoints trained
# the config sections that decide what a run trains (logging, paths and callbacks only record it)
TRAINING = ("model", "data", "optim", "tf32")
TRAINER = ("max_steps", "precision", "gradient_clip_val", "accumulate_grad_batches")


def is_rank_zero() -> bool:
    """True in the main process (also before Lightning has set up distributed training)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0


class RunRecord:
    """Collects what results.json reports about one run and writes it (once per status change)."""

    def __init__(self, run_dir: Path, config: dict, overrides=()):
        """``config``: the composed config resolved to plain values; ``overrides``: the job's."""
        attention = (config.get("model") or {}).get("attention") or {}
        self.path = Path(run_dir) / RESULTS
        self.started = time.perf_counter()
        self.data = {
            "status": "running",
            "error": None,
            "overrides": list(overrides),
            "config": config,
            "attention": {"backend": attention.get("backend"), "scaling": attention.get("scaling"), "kernel": None},
            "metrics": {},
            "resumed_from": None,  # {"path", "step", "skipped"} when the run continued a checkpoint
            "wall_s": None,
            "provenance": provenance(config),
        }

    def finish(self, status: str, metrics: dict | None = None, error: str | None = None, **extra) -> None:
        self.data.update(status=status, error=error, wall_s=round(time.perf_counter() - self.started, 3), **extra)
        if metrics:
            self.data["metrics"].update(metrics)
        if is_rank_zero():  # one results.json per run, also under DDP
            text = json.dumps(json_safe(self.data), indent=2)
            try:
                atomic_write_text(self.path, text)
            except (OSError, RuntimeError) as err:
                raise write_failure("the run record", self.path, len(text.encode()), err) from None


# what made a run, beside its metrics in results.json and runs.csv: two rows are one experiment only where
# the fingerprint agrees, and a CPU row comes back bit for bit only at the same torch, device and threads
PROVENANCE = ("config", "version", "commit", "dirty", "torch", "device", "threads")


def provenance(config: dict, device: torch.device | None = None) -> dict:
    """What made the run: its training fingerprint, attnlab's version and source commit (``dirty`` where
    src/ or conf/ differ from it), torch's version, the device it trained on and torch's thread count."""
    commit, dirty = source_commit()
    return {
        "config": training_fingerprint(config),
        "version": attnlab.__version__,
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "device": describe_device(device) if device is not None else None,
        "threads": torch.get_num_threads(),
    }


def describe_device(device: torch.device) -> str:
    """``cpu: <model>`` or ``cuda: <name>``: the kernels a run's reductions ran on."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    model = ""
    try:
        model = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), ""
        )
    except OSError:
        pass
    return f"{device.type}: {model}" if model else device.type


def training_fingerprint(config: dict) -> str:
    """12 hex digits of the run's training settings (model, data, optimiser, step budget), the seed left out:
    equal for the seeds of one cell, different once the study's experiment file changes what it trains."""
    trainer = config.get("trainer") or {}
    settings = {k: config.get(k) for k in TRAINING} | {f"trainer.{k}": trainer.get(k) for k in TRAINER}
    if isinstance(settings.get("data"), dict):
        settings["data"] = {k: v for k, v in settings["data"].items() if k != "num_workers"}
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    """A job's ``key=value`` overrides as a dict (``+``/``~`` prefixes and Hydra's own keys dropped)."""
    return {k: v for k, v in parse_overrides(overrides).items() if not k.startswith("hydra")}


def finished_before(run_dir: Path, config: dict, overrides: list[str]) -> dict | None:
    """Where a sweep's job already finished, or None: its own run dir's ok results.json with the same
    training fingerprint, or a row of the study's runs.csv with the same cell, seed and fingerprint (the
    file named by ``$ATTNLAB_FINISHED``). Only inside a sweep that set that variable."""
    listing = os.environ.get(FINISHED_ENV)
    if not listing:
        return None
    fingerprint, seed = training_fingerprint(config), str(config.get("seed"))
    own = Path(run_dir) / RESULTS
    try:
        earlier = json.loads(own.read_text()) if own.is_file() else {}
    except (OSError, ValueError):
        earlier = {}
    if earlier.get("status") == "ok" and training_fingerprint(earlier.get("config") or {}) == fingerprint:
        if str((earlier.get("config") or {}).get("seed")) == seed:
            return {"where": str(own), "in_run_dir": True}
    given = overrides_dict(overrides)
    try:
        rows = json.loads(Path(listing).read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return None
    for row in rows:  # a row without a fingerprint is trained again: the report replaces it with the new run
        if row["config"] == fingerprint and str(row["seed"]) == seed:
            if all(given.get(axis, "-") == value for axis, value in row["axes"].items()):
                return {"where": row["where"], "in_run_dir": False}
    return None


def resumable(run_dir: Path, config: dict) -> bool:
    """A sweep's job cut short before: its run dir holds a last checkpoint of the same training settings."""
    mark = Path(run_dir) / FINGERPRINT
    return (
        bool(os.environ.get(FINISHED_ENV))
        and (Path(run_dir) / "checkpoints" / "last.ckpt").is_file()
        and mark.is_file()
        and mark.read_text().strip() == training_fingerprint(config)
    )
