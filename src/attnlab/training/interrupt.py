"""Signals: finish the current step, save ``last.ckpt``, then stop with status interrupted.

SIGINT / SIGTERM (Ctrl+C, ``kill``, ``scancel``) stop the run; a SIGTERM with which SLURM
requeues the job itself (a preemption) is recorded as requeued. SIGUSR1 / SIGUSR2 are what a
scheduler sends before a time limit or a preemption (submitit asks SLURM for SIGUSR2; Lightning's
SLURM environment uses SIGUSR1): the run saves the same way, then hands the job to the handler
that was installed before training when it is submitit's, which requeues it (or says why not);
otherwise it stops as on SIGTERM. Requeueing has that one owner: Lightning's own SLURM
auto-requeue is turned off (``slurm.cluster_plugins``) because it saves from inside the signal
handler, in the middle of a step. The requeued attempt resumes from the checkpoint
(``continuation.resume_checkpoint``).

The signal only sets a flag; the checkpoint is written between steps, so it is a consistent state
to resume from (``resume=true``). Lightning installs a SIGTERM handler of its own once fit has
started (after ``on_fit_start``); it would raise ``SIGTERMException``, a ``SystemExit`` that ends
the process with status 0 and no checkpoint, at the next batch or validation step. So the handler
here is installed again when training starts, and ``train`` records a ``SIGTERMException`` from
outside the training steps (the closing validation) as an interruption. A second SIGINT interrupts at once. Under DDP the flag is
reduced over the ranks after every step (a signal may reach one process only), so all of them
save and stop at the same step and none waits in a collective for the others.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import lightning as L

from attnlab.callbacks.cadence import optimizer_stepped
from attnlab.training.slurm import being_requeued
from attnlab.util.errors import AttnlabError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class Interrupted(AttnlabError):
    """A run stopped by a signal at ``step``; ``requeued`` when the scheduler will run it again.

    ``handoff``: the scheduler's handler, still to be run (``hand_over``) once the run has closed
    its loggers: requeueing makes SLURM send SIGTERM to every process of the job, W&B's included.
    """

    def __init__(
        self,
        message: str,
        signal_name: str | None = None,
        step: int | None = None,
        requeued: bool = False,
        handoff=None,
        resume_hint: str = "",
    ):
        super().__init__(message)
        self.signal_name, self.step, self.requeued = signal_name, step, requeued
        self.handoff, self.resume_hint = handoff, resume_hint

    def hand_over(self) -> None:
        """Run the scheduler's handler now; the message then says whether the job was requeued."""
        if self.handoff is None:
            return
        handler, signum = self.handoff
        self.handoff = None
        self.requeued, what = hand_to_scheduler(handler, signum)
        self.args = (f"{self.args[0]}; {what}" + ("" if self.requeued else f" {self.resume_hint}"),)

    def record(self) -> dict:
        """What results.json says about this interruption."""
        return {"signal": self.signal_name, "step": self.step, "requeued": self.requeued}


def is_submitit_handler(handler) -> bool:
    return type(getattr(handler, "__self__", None)).__module__.startswith("submitit")


def hand_to_scheduler(handler, signum: int) -> tuple[bool, str]:
    """Run submitit's handler for ``signum`` now, at a step boundary: (requeued, what happened).

    It requeues the job (``scontrol requeue``) and exits (SystemExit), or raises why it will not
    (too many timeouts); neither may escape here, so the run can record which one it was.
    """
    try:
        handler(signum, None)
    except SystemExit:
        return True, "requeued by the scheduler; the next attempt resumes from it"
    except Exception as err:  # noqa: BLE001 - submitit's UncompletedJobError: "Job not requeued because: ..."
        return False, f"{str(err).rstrip('.')}; resume with"
    return False, "not requeued by this process (not rank 0); resume with"


def write_step_logs(trainer) -> None:
    """Hand this step's logged values (``train/loss``, ``lr``, ...) to the loggers now. Lightning does it
    only after every ``on_train_batch_end`` hook has returned, so a stop raised from one would drop the
    interrupted step's row from the CSV and W&B whenever it was a logging step (1 step in
    ``log_every_n_steps``). The module's own batch-end hook, which runs after the callbacks', has not
    run: that step's ``perf/tokens_per_s`` is not written."""
    connector = trainer._logger_connector
    connector.on_batch_end()
    connector.update_train_step_metrics()


class GracefulInterrupt(L.Callback):
    SIGNALS = STOP_SIGNALS + REQUEUE_SIGNALS

    def __init__(self, checkpoint_path: Path):
        self.checkpoint_path = Path(checkpoint_path)
        self.received: int | None = None
        self._previous: dict = {}

    def _handler(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        if self.received is None or signum in REQUEUE_SIGNALS:  # a requeue signal wins over the SIGTERM after it
            self.received = signum

    def on_fit_start(self, trainer, pl_module):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}

    def on_train_start(self, trainer, pl_module):
        """Take SIGTERM back from Lightning's signal connector (installed after ``on_fit_start``);
        ``_previous`` keeps what was there before fit, which teardown restores."""
        if self._previous:
            signal.signal(signal.SIGTERM, self._handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not optimizer_stepped(trainer, batch_idx):
            return  # mid-accumulation: a checkpoint here would lose the group's gradients and break a bitwise resume
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        trainer.save_checkpoint(self.checkpoint_path)  # every rank: saving is collective under DDP
        write_step_logs(trainer)
        name = signal.Signals(self.received).name if self.received is not None else "a signal to another rank"
        run_dir = self.checkpoint_path.parent.parent
        hint = f"resume=true hydra.run.dir={run_dir}"
        message = f"{name} at step {trainer.global_step}: checkpoint saved to {self.checkpoint_path}"
        scheduler = self._previous.get(self.received)
        if self.received in REQUEUE_SIGNALS and is_submitit_handler(scheduler):
            raise Interrupted(message, name, trainer.global_step, handoff=(scheduler, self.received), resume_hint=hint)
        if self.received == signal.SIGTERM and being_requeued():  # SLURM requeues it (a preemption), not a cancel
            raise Interrupted(
                f"{message}; requeued by SLURM; the next attempt resumes from it",
                name,
                trainer.global_step,
                requeued=True,
            )
        raise Interrupted(
            f"{message}; resume with {hint}", name if self.received is not None else None, trainer.global_step
        )

    def teardown(self, trainer, pl_module, stage):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
