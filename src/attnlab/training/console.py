"""What a run prints: attnlab's own progress, not the libraries' chatter.

The one place that quiets Lightning (:func:`quiet_lightning`, levels and warning filters restored on
exit) and the progress line that replaces Lightning's tqdm bar (:class:`ProgressLine`): loss, val
loss and tokens/s, redrawn in place on a terminal, one plain line every ``every`` steps when
stdout is a file or a pipe. A job of ``attnlab sweep`` prints all of it into its run dir's
console.log instead (:func:`run_output`), so the sweep's console holds the study-level lines only.
And the W&B logger (:class:`WandbLogger`): Lightning's, without its start-up warning and started in
the background, so the run's set-up never waits for W&B.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
import warnings
from typing import TextIO

from lightning.pytorch import loggers as lightning_loggers
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

from attnlab.training import phases

# Lightning's info messages (device banners, "💡 Tip: ... litlogger / litmodels" advertisements,
# "`Trainer.fit` stopped") go through these loggers; its warnings stay visible.
LIGHTNING_LOGGERS = (
    "lightning",
    "lightning.pytorch",
    "lightning.fabric",
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)
# Warnings that say nothing a researcher can act on, each for a reason.
HARMLESS_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\).*",  # a torch deprecation inside Lightning
    r"Checkpoint directory .* exists and is not empty",  # resume=true: it should be
    r".*does not have many workers.*",  # in-memory data: workers would only add overhead
    r".*smaller than the logging interval.*",  # short runs (smoke tests) log every step anyway
    r"The `srun` command is available on your system",  # a SLURM client here, a run outside a job: intended
    r".*resuming from a checkpoint that ended before the epoch ended.*",  # the data modules restore their position
)


RUN_LOG = "console.log"
RUN_LOG_ENV = "ATTNLAB_RUN_LOG"  # set to 1 by `attnlab sweep` for its jobs


@contextlib.contextmanager
def run_output(run_dir: str | os.PathLike):
    """With ``ATTNLAB_RUN_LOG=1``: everything the block prints, Python's and the C++ libraries', goes to
    <run_dir>/console.log (appended: a resumed run adds to it). At the file descriptors, because parallel
    jobs share the sweep's terminal and torch, W&B and their child processes write to them directly."""
    if os.environ.get(RUN_LOG_ENV) != "1":
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(os.path.join(run_dir, RUN_LOG), "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def quiet_lightning(silence_output: bool = False):
    """Lightning at WARNING and the harmless warnings off, inside the block only.

    ``silence_output`` also swallows stdout, stderr and every warning: for runs measured or driven
    by another command (benchmarks, reproductions) whose own report is the output.
    """
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR if silence_output else logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            for pattern in HARMLESS_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            if silence_output:
                warnings.simplefilter("ignore")
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class PendingRun:
    """``WandbLogger.experiment`` while the W&B run starts: any attribute waits for the run, then is the run's."""

    def __init__(self, logger: WandbLogger):
        self._logger = logger

    def __getattr__(self, name: str):
        self._logger.settle()
        return getattr(self._logger.experiment, name)


class WandbLogger(lightning_loggers.WandbLogger):
    """Lightning's W&B logger, started in the background, minus the ``anonymous`` argument it always
    passes (wandb 0.31 answers it with a warning before the first step).

    ``start()`` runs ``wandb.init`` (the wandb import, its service process and handshake) in a thread
    and the run does not wait for it: what is logged meanwhile is kept in order and handed to W&B at
    the first logger call after the W&B run is up, or at ``settle()``.
    A failed start is raised there, in the run's own thread; the logger then drops what it is given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None  # set by the start's thread, raised by settle()
        self._start_failed = False
        self._waiting: list[tuple[str, tuple, dict]] = []  # (method, args, kwargs) not yet handed to W&B

    def start(self) -> None:
        if self._starting is not None or self._experiment is not None:
            return

        def init():
            try:
                with phases.phase("W&B: import and init"):
                    lightning_loggers.WandbLogger.experiment.fget(self)
            except BaseException as err:  # noqa: BLE001 - raised in the run's thread by settle()
                self._start_error = err

        self._starting = threading.Thread(target=init, name="attnlab-wandb-init", daemon=True)
        self._starting.start()

    @property
    def starting(self) -> bool:
        return self._starting is not None and self._starting.is_alive()

    def settle(self) -> None:
        """Wait for the start, raise its error, and hand W&B what was logged meanwhile, in order."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        waiting, self._waiting = self._waiting, []
        if self._start_error is not None:
            err, self._start_error, self._start_failed = self._start_error, None, True
            raise err
        for name, args, kwargs in waiting if not self._start_failed else ():
            getattr(lightning_loggers.WandbLogger, name)(self, *args, **kwargs)

    def _call(self, name: str, *args, **kwargs) -> None:
        """Every logger call goes through the list: kept while the run starts, handed over (in order) once it is up."""
        self._waiting.append((name, tuple(dict(a) if isinstance(a, dict) else a for a in args), kwargs))
        if not self.starting:
            self.settle()

    @property
    def experiment(self):
        """The W&B run; while it starts, a handle that waits for it at its first use. Lightning touches
        every logger's ``experiment`` before fit only to create it, which must not wait for the start."""
        if self.starting:
            return PendingRun(self)
        self.settle()
        return lightning_loggers.WandbLogger.experiment.fget(self)

    def log_hyperparams(self, *args, **kwargs) -> None:
        self._call("log_hyperparams", *args, **kwargs)

    def log_metrics(self, *args, **kwargs) -> None:
        self._call("log_metrics", *args, **kwargs)

    def log_table(self, *args, **kwargs) -> None:
        self._call("log_table", *args, **kwargs)

    def log_text(self, *args, **kwargs) -> None:
        self._call("log_text", *args, **kwargs)

    def log_image(self, *args, **kwargs) -> None:
        self._call("log_image", *args, **kwargs)

    def finalize(self, status: str) -> None:
        self._call("finalize", status)


class ProgressLine(ProgressBar):
    """``step 120/2000 [###-------]  loss 2.412 | val 2.530 | 11,240 tok/s | 0:41 elapsed, 10:12 left``.

    On a file or pipe one such line (no bar) every ``every`` steps, by default a twentieth of the
    run, and at the last step; tokens/s is wall-clock over the steps since the previous line.
    """

    def __init__(self, every: int | None = None, stream: TextIO | None = None, min_interval_s: float = 0.2):
        super().__init__()
        self.every, self.min_interval_s = every, min_interval_s
        self._stream = stream
        self._enabled = True
        self._tokens = 0
        self._window: tuple[float, int] = (0.0, 0)  # (time, tokens) at the last line
        self._start = self._last_draw = 0.0
        self._drawn = False

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def interactive(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.trainer.is_global_zero

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._window = (self._start, 0)
        self._tokens = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._tokens += batch[0].numel()
        if not self.is_enabled:
            return
        step, now = trainer.global_step, time.perf_counter()
        if self.interactive:
            if now - self._last_draw >= self.min_interval_s or step == trainer.max_steps:
                self._draw(self.line(trainer, now), end="")
        elif step % (self.every or max(1, trainer.max_steps // 20)) == 0 or step == trainer.max_steps:
            self._draw(self.line(trainer, now), end="\n")

    def on_train_end(self, trainer, pl_module) -> None:
        if self.is_enabled and self.interactive and self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, text: str, end: str) -> None:
        prefix = "\r\x1b[2K" if self.interactive else ""
        self.stream.write(prefix + text + end)
        self.stream.flush()
        self._last_draw, self._drawn = time.perf_counter(), True

    def line(self, trainer, now: float) -> str:
        step, total = trainer.global_step, trainer.max_steps
        since, tokens_then = self._window
        rate = (self._tokens - tokens_then) / max(now - since, 1e-9)
        if not self.interactive or now - since >= 2.0:  # a steady rate on a terminal redrawn 5 times a second
            self._window = (now, self._tokens)
        metrics = trainer.callback_metrics
        parts = [f"step {step}/{total}" if total and total > 0 else f"step {step}"]
        if self.interactive and total and total > 0:
            filled = int(20 * step / total)
            parts[0] += " [" + "#" * filled + "-" * (20 - filled) + "]"
        text = " ".join(parts)
        fields = [
            f"loss {float(metrics['train/loss']):.3f}" if "train/loss" in metrics else "loss -",
            f"val {float(metrics['val/loss']):.3f}" if "val/loss" in metrics else "val -",
            f"{rate:,.0f} tok/s",
        ]
        elapsed = now - self._start
        timing = f"{clock(elapsed)} elapsed"
        if total and total > 0 and step > 0:
            timing += f", {clock(elapsed / step * (total - step))} left"
        return f"{text}  " + " | ".join(fields + [timing])


def progress_line(enabled: bool) -> list[ProgressLine]:
    """The progress callback for a trainer built with ``enable_progress_bar=enabled``."""
    return [ProgressLine()] if enabled else []


def clock(seconds: float) -> str:
    """``12:05`` or ``1:02:05``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
