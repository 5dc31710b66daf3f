"""Where a run continues from: a requeued attempt's own newest checkpoint, ``ckpt_path``, or
``resume=true``'s last.ckpt (the newest intact one beside it when that is damaged); and what the
run dir's results.json already holds that a continued run keeps (its interruptions, its W&B run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.config.schema import Schema
from attnlab.training.checkpointing import newest_intact, read_checkpoint
from attnlab.training.results import RESULTS, RunRecord, is_rank_zero
from attnlab.training.slurm import scheduler_restarts
from attnlab.util.errors import AttnlabError, CheckpointError, ConfigError


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


def continue_from(cfg: Schema, run_dir: Path, record: RunRecord) -> str | None:
    """The checkpoint the run continues from (None: it starts at step 0); results.json records it and
    keeps the interruptions an earlier attempt of this run dir recorded."""
    ckpt_path, record.data["resumed_from"] = resume_checkpoint(cfg, run_dir)
    record.data["interruptions"] = earlier_interruptions(run_dir) if ckpt_path or scheduler_restarts() else []
    return ckpt_path
