"""SIGINT / SIGTERM: finish the current step, save ``last.ckpt``, then stop with status interrupted.

The signal only sets a flag; the checkpoint is written between steps, so it is a consistent state
to resume from (``resume=true``). A second SIGINT interrupts at once. Under DDP the flag is
reduced over the ranks after every step (a signal may reach one process only), so all of them
save and stop at the same step and none waits in a collective for the others.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import lightning as L

from ..errors import AttnlabError


class Interrupted(AttnlabError):
    pass


class GracefulInterrupt(L.Callback):
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, checkpoint_path: Path):
        self.checkpoint_path = Path(checkpoint_path)
        self.received: int | None = None
        self._previous: dict = {}

    def _handler(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.received = signum

    def on_fit_start(self, trainer, pl_module):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        trainer.save_checkpoint(self.checkpoint_path)  # every rank: saving is collective under DDP
        name = signal.Signals(self.received).name if self.received is not None else "a signal to another rank"
        raise Interrupted(
            f"{name} at step {trainer.global_step}: checkpoint saved to {self.checkpoint_path}; "
            f"resume with resume=true hydra.run.dir={self.checkpoint_path.parent.parent}"
        )

    def teardown(self, trainer, pl_module, stage):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
