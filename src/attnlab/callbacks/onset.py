"""Stop a run at the evaluation where it has learned the task, and record that step: its onset.

An onset study asks *when* an arm learns, not only *whether*: the first validation at which the
monitored metric (``val/acc``) reaches ``threshold`` (the study's ``question.learned``) ends the run,
and ``onset/step`` is that step. A run that never reaches it is censored at its last step
(``onset/censored`` = 1): it was still unlearned then, which says nothing about later. The onset is
known to the validation interval (it happened in the ``val_check_interval`` steps before).
"""

from __future__ import annotations

import math

import lightning as L
import torch


class StopWhenLearned(L.Callback):
    def __init__(self, threshold: float, monitor: str = "val/acc"):
        if not 0 < float(threshold) <= 1:
            raise ValueError(f"StopWhenLearned threshold={threshold}: expected a fraction in (0, 1]")
        self.threshold = float(threshold)
        self.monitor = monitor
        self.onset_step: int | None = None
        self.last_step = 0

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        self.last_step = trainer.global_step
        if value is None or self.onset_step is not None:
            return
        value = float(value.item() if torch.is_tensor(value) else value)
        if math.isfinite(value) and value >= self.threshold:
            self.onset_step = trainer.global_step
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"onset_step": self.onset_step, "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.onset_step = state_dict.get("onset_step")
        self.last_step = state_dict.get("last_step", 0)

    def summary(self) -> dict[str, float]:
        """``onset/step``: the onset, or the step the run was censored at; ``onset/censored``: 1 if unlearned."""
        learned = self.onset_step is not None
        return {
            "onset/step": float(self.onset_step if learned else self.last_step),
            "onset/censored": 0.0 if learned else 1.0,
        }
