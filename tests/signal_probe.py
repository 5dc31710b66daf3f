"""Callbacks for the signal tests (``+callbacks.probe._target_=signal_probe.<Class>``): they look
at, or send, signals at chosen points of a run, so a race a loaded machine hits by chance is
reproduced every time."""

from __future__ import annotations

import os
import signal

import lightning as L


class RecordSigtermHandler(L.Callback):
    """Remembers which handler SIGTERM had during the training steps."""

    handlers: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        RecordSigtermHandler.handlers.append(signal.getsignal(signal.SIGTERM))


class SigtermInClosingValidation(L.Callback):
    """Sends SIGTERM to its own process during the validation that follows fit."""

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.state.fn == "validate":
            os.kill(os.getpid(), signal.SIGTERM)


class SignalAtStep(L.Callback):
    """Sends ``sig`` to its own process as step ``step`` starts (``+callbacks.probe.step=N``)."""

    def __init__(self, step: int, sig: str = "SIGUSR2"):
        self.step, self.signal = step, signal.Signals[sig]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)
