"""results.json: one per run, ok or not, written atomically so it is never half-written."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .errors import WriteFailed

RESULTS = "results.json"
# set by a sweep: the JSON file of runs its study has already finished (studies/resume.py writes it)
FINISHED_ENV = "ATTNLAB_FINISHED"
FINGERPRINT = "training.fingerprint"  # a run dir's fingerprint, written when it starts: what its checkpoints trained
# the config sections that decide what a run trains (logging, paths and callbacks only record it)
TRAINING = ("model", "data", "optim", "tf32")
TRAINER = ("max_steps", "precision", "gradient_clip_val", "accumulate_grad_batches")


def git_sha(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository the run started in, with ``-dirty`` if tracked files changed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=cwd, capture_output=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.returncode else "")
    except (OSError, subprocess.SubprocessError):
        return None


def is_rank_zero() -> bool:
    """True in the main process (also before Lightning has set up distributed training)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0


def hydra_overrides() -> list[str]:
    """The command-line overrides of this job ([] outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


@contextmanager
def atomic_file(path: Path, mode: str = "w"):
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``.

    Readers see the old file or the new one, never a half-written one; on any error (a kill
    between steps included) the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _os_error(err: BaseException) -> OSError | None:
    """The OSError behind ``err`` (torch's zip writer turns a failed write into a RuntimeError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


DISK_HINTS = {
    errno.ENOSPC: "free space there or point hydra.run.dir at another disk",
    errno.EDQUOT: "free space there or point hydra.run.dir at another disk",
    errno.EACCES: "make the dir writable or point hydra.run.dir elsewhere",
    errno.EPERM: "make the dir writable or point hydra.run.dir elsewhere",
    errno.EROFS: "point hydra.run.dir at a writable disk",
}


def write_failure(what: str, path: Path, nbytes: int, err: BaseException) -> WriteFailed:
    """One line for a write that failed: what, where, how large, why, and that the previous file is intact.

    ``atomic_file`` never touches ``path`` before the rename, so whatever was there is still there.
    """
    path = Path(path)
    cause = _os_error(err)
    if cause is not None:
        code, reason = cause.errno, cause.strerror or str(cause)
    else:
        try:  # no errno to read: a full disk is the common reason, and it can be checked
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        full = free is not None and free < nbytes
        code = errno.ENOSPC if full else None
        reason = f"No space left on device ({fmt_bytes(free)} free)" if full else " ".join(str(err).split())[:200]
    previous = (
        f"the previous {path.name} is intact"
        if path.is_file()
        else f"no earlier {path.name} existed, nothing was replaced"
    )
    if not path.is_file() and path.suffix == ".ckpt":  # a new step<N>.ckpt: name the checkpoint that is still there
        others = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
        previous += f"; {others[-1].name} there is intact" if others else ""
    hint = f"; {DISK_HINTS[code]}" if code in DISK_HINTS else ""
    return WriteFailed(f"cannot write {what} {path} (about {fmt_bytes(nbytes)}): {reason}; {previous}{hint}", path)


def json_safe(value, digits: int | None = None, non_finite_as_null: bool = False):
    """``value`` in what JSON holds: NaN and inf as the strings "nan", "inf", "-inf" (JSON has
    neither; a diverged run stays visible as one), or as null with ``non_finite_as_null``; numpy
    and torch scalars as Python numbers; tuples as lists; floats rounded to ``digits`` significant
    digits when given. The one encoder for results.json, repro.json and bench.json."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None if non_finite_as_null else str(value)
        return float(f"{value:.{digits}g}") if digits else value
    if isinstance(value, dict):
        return {str(k): json_safe(v, digits, non_finite_as_null) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, digits, non_finite_as_null) for v in value]
    return value


class RunRecord:
    """Collects what results.json reports about one run and writes it (once per status change)."""

    def __init__(self, run_dir: Path, cfg: DictConfig, config: dict | None = None):
        """``config``: ``cfg`` already resolved to a dict, where the caller has it."""
        self.path = Path(run_dir) / RESULTS
        self.started = time.perf_counter()
        self.data = {
            "status": "running",
            "error": None,
            "overrides": hydra_overrides(),
            "config": config
            if config is not None
            else OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False),
            "attention": {
                "backend": cfg.model.attention.backend,
                "scaling": cfg.model.attention.scaling,
                "kernel": None,
            },
            "metrics": {},
            "resumed_from": None,  # {"path", "step", "skipped"} when the run continued a checkpoint
            "wall_s": None,
            "git_sha": git_sha(),
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
    pairs = (o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    return {k: v for k, v in pairs if not k.startswith("hydra")}


def finished_before(run_dir: Path, config: dict, overrides: list[str]) -> dict | None:
    """Where a sweep's job already finished, or None: its own run dir's ok results.json with the same
    training fingerprint, or a row of the study's runs.csv with the same cell, seed and fingerprint
    (the file named by ``$ATTNLAB_FINISHED``). Only inside a sweep that set that variable."""
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
    for row in rows:
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
