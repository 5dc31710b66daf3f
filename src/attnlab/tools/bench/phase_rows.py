"""The breakdown's rows from the phases a run records itself (``attnlab.training.phases``).

A run with the recorder on reports two kinds of phase: the ones ``attnlab.training.train`` marks around its
own steps ("data: read and encode the corpus", "fit: Lightning loop", ...) and, inside fit,
Lightning's profiler actions ("[Strategy]SingleDeviceStrategy.backward", "[Callback]HeadAnalysis.on_train_end",
"save_checkpoint", ...). ``row_of`` names the table row of each; several actions share a row (every
hook of one callback, say). Nothing here reaches into the code it times.

What the public seams do not separate is merged into the phase around it: the loggers' calls
(W&B, CSV) made by Lightning's loop count in "Lightning loop", those made by a callback in that
callback's row; the evaluation loop's own bookkeeping counts in "Lightning loop" too.
"""

from __future__ import annotations

from attnlab.training.phases import IMPORTS

END_HOOKS = ("on_train_end", "on_fit_end")
END_OF_TRAINING = "(end of training)"
LOOP = "Lightning loop (its bookkeeping and the loggers' calls)"

# (owner in Lightning's action name, hook) -> row; the owner's class name is left out (GPTModule, SingleDeviceStrategy ...)
LIGHTNING_ROWS = {
    ("Strategy", "training_step"): "step: forward (training_step, self.log)",
    ("Strategy", "backward"): "step: backward",
    ("LightningModule", "optimizer_step"): "step: AdamW update",
    ("LightningModule", "configure_gradient_clipping"): "step: gradient clipping",
    ("LightningModule", "lr_scheduler_step"): "step: lr schedule",
    ("LightningModule", "on_train_batch_start"): "step: tokens/s timer",
    ("LightningModule", "on_train_batch_end"): "step: tokens/s timer",
    ("_TrainingEpochLoop", "train_dataloader_next"): "step: next batch",
    ("Strategy", "batch_to_device"): "step: batch to device",
    ("LightningModule", "transfer_batch_to_device"): "step: batch to device",
    ("Strategy", "validation_step"): "validation: forward",
    ("_EvaluationLoop", "val_next"): "validation: next batch",
    ("LightningDataModule", "setup"): "data: read and encode the corpus",
}
PLAIN_ROWS = {
    "save_checkpoint": "checkpoint writes",
    "run_training_batch": LOOP,
    "run_training_epoch": LOOP,
    "fit: Lightning loop": LOOP,
}

# Rows every default run has; the breakdown test fails when one is missing (a phase renamed or no longer recorded).
EXPECTED = (
    IMPORTS,
    "Hydra: parse, compose, run dir, log set-up",
    "results: run record (git sha)",
    "loggers: build",
    "data: read and encode the corpus",
    "model: build",
    "callbacks: build",
    "trainer: build",
    "memory check",
    "kernel check forward",
    "loggers: log config",
    LOOP,
    "step: forward (training_step, self.log)",
    "step: backward",
    "step: AdamW update",
    "step: gradient clipping",
    "step: lr schedule",
    "step: next batch",
    "step: tokens/s timer",
    "validation: forward",
    "validation: next batch",
    "checkpoint writes",
    "end of run: metrics and summaries",
    "results.json",
    "W&B: finish",
    "train(): not covered by a phase",
)

GROUPS = (  # (group, row-name prefixes) in the table's order
    ("start-up", ("interpreter", "imports", "Hydra")),
    (
        "set-up",
        (
            "results: run record",
            "loggers:",
            "data:",
            "model:",
            "callbacks: build",
            "trainer:",
            "memory check",
            "kernel check",
            "Lightning: set-up",
        ),
    ),
    ("training steps", ("step:", "Lightning")),
    ("callbacks during training", ("callback",)),
    ("validation and checkpoints", ("validation", "checkpoint", "fit: closing validation")),
    ("end of run", ("end of run", "results.json", "W&B: finish", "train()", "outside every phase")),
)


def callback_row(state_key: str, hook: str) -> str:
    when = END_OF_TRAINING if hook in END_HOOKS else "(per step)"
    return f"callback {state_key.split('{', 1)[0]} {when}"  # ModelCheckpoint's key carries its settings in {...}


def row_of(phase: str) -> str:
    """The table row of one recorded phase."""
    if phase.startswith("[Callback]"):
        state_key, hook = phase[len("[Callback]") :].rsplit(".", 1)
        return callback_row(state_key, hook)
    if phase.startswith("[") and "]" in phase:
        owner, rest = phase[1:].split("]", 1)
        hook = rest.rsplit(".", 1)[-1]
        if (owner, hook) in LIGHTNING_ROWS:
            return LIGHTNING_ROWS[owner, hook]
        if "val" in hook:
            return "validation: module and strategy hooks"
        if hook in ("setup", "configure_optimizers", "configure_model", "on_fit_start", "prepare_data"):
            return "Lightning: set-up hooks"
        return "step: other module and strategy hooks (zero_grad ...)"
    return PLAIN_ROWS.get(phase, phase)


def is_end_of_training(row: str) -> bool:
    """A callback's end-of-training hooks: the final analyses, maps and checkpoint that run once the steps are done."""
    return row.startswith("callback ") and row.endswith(END_OF_TRAINING)


def group_of(row: str) -> str:
    if is_end_of_training(row):
        return "end of run"
    for group, prefixes in GROUPS:
        if any(row.startswith(p) for p in prefixes):
            return group
    return "other"


def rows(seconds: dict[str, float], calls: dict[str, int]) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and calls per row, summed over the phases of each row. A row's calls are its busiest
    phase's (a callback's hooks run in the same steps: their calls are not added)."""
    out_s: dict[str, float] = {}
    out_n: dict[str, int] = {}
    for phase, sec in seconds.items():
        row = row_of(phase)
        out_s[row] = out_s.get(row, 0.0) + sec
        out_n[row] = max(out_n.get(row, 0), calls.get(phase, 1))
    return out_s, out_n


def callback_seconds(seconds: dict[str, float]) -> dict[str, float]:
    """Seconds in each callback's hooks, per row ("callback X (per step)" / "(end of training)")."""
    per_row, _ = rows({p: s for p, s in seconds.items() if p.startswith("[Callback]")}, {})
    return per_row
