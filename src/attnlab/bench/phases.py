"""Where the seconds of one training run go: an exclusive-time phase timer patched into the real code path.

``PhaseTimer`` keeps a stack: time spent in a phase nested inside another (a checkpoint written
from a callback, a W&B log call inside validation) counts for the inner phase only, so the
phases add up to the time they cover without double counting. ``instrument`` wraps the
functions and methods a default ``python -m attnlab.train`` goes through (data setup, logger
calls, W&B init and finish, validation, checkpoint writes, every callback hook, forward,
backward, clipping, optimizer step, data loading) and restores them on exit. What no wrapper
covers inside ``Trainer.fit`` is the Lightning loop itself.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator

import lightning as L


class PhaseTimer:
    """Exclusive seconds and call counts per phase name (a phase nested in another is subtracted from it)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        # phases run in another thread (the W&B start) overlap the main thread's: kept apart, so the
        # main thread's phases still add up to the run; what the main thread waited for them is its own phase
        self.background: dict[str, float] = {}
        self._thread = threading.get_ident()
        self.last_end: dict[str, float] = {}  # clock reading when each phase last ended (the longctx bench's last step)
        self._stack: list[list] = []  # [name, start, seconds of nested phases]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if threading.get_ident() != self._thread:
            start = self.clock()
            try:
                yield
            finally:
                self.background[name] = self.background.get(name, 0.0) + self.clock() - start
            return
        entry = [name, self.clock(), 0.0]
        self._stack.append(entry)
        try:
            yield
        finally:
            end = self.clock()
            elapsed = end - entry[1]
            self.last_end[name] = end
            self._stack.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed - entry[2]
            self.calls[name] = self.calls.get(name, 0) + 1
            if self._stack:
                self._stack[-1][2] += elapsed

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        timed.__wrapped_by_phase_timer__ = True
        return timed


class Patches:
    """setattr that remembers the original, undone in reverse order by ``restore``."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, timer: PhaseTimer, name: str) -> None:
        own = attr in vars(owner)  # False: inherited, so restoring means deleting our override
        original = vars(owner)[attr] if own else getattr(owner, attr)
        if getattr(original, "__wrapped_by_phase_timer__", False) or isinstance(original, (staticmethod, classmethod)):
            return
        self.replace(owner, attr, timer.wrap(name, original), original if own else _MISSING)

    def replace(self, owner: object, attr: str, new: object, original: object) -> None:
        self._undo.append((owner, attr, original))
        setattr(owner, attr, new)

    def restore(self) -> None:
        while self._undo:
            owner, attr, original = self._undo.pop()
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


_MISSING = object()


def callback_hooks(callback_type: type) -> list[str]:
    """The ``on_*`` hooks a callback class overrides (the others are Lightning's no-ops)."""
    return [a for a in dir(callback_type) if a.startswith("on_") and getattr(callback_type, a) is not getattr(L.Callback, a, None)]


END_HOOKS = ("on_train_end", "on_fit_end")
END_OF_TRAINING = "(end of training)"


def hook_phase(callback_type: type, hook: str) -> str:
    when = END_OF_TRAINING if hook in END_HOOKS else "(per step)"
    return f"callback {callback_type.__name__} {when}"


def is_end_of_training(phase: str) -> bool:
    """A callback's end-of-training hooks: the final analyses, maps and checkpoint that run once the steps are done."""
    return phase.startswith("callback ") and phase.endswith(END_OF_TRAINING)


def wrap_callback_class(patches: Patches, timer: PhaseTimer, callback_type: type) -> None:
    for hook in callback_hooks(callback_type):
        owner = next(c for c in callback_type.__mro__ if hook in c.__dict__)
        if owner is L.Callback:
            continue
        patches.wrap(owner, hook, timer, hook_phase(callback_type, hook))


def wrap_callbacks_when_built(patches: Patches, timer: PhaseTimer) -> None:
    """Time ``train.build_callbacks`` and every hook of the callbacks it returns: the callbacks a
    config asks for are only known once the run builds them."""
    from .. import train as train_mod

    build_callbacks = train_mod.build_callbacks

    def timed_build_callbacks(cfg):
        with timer.phase("callbacks: build"):
            callbacks = build_callbacks(cfg)
        for callback in callbacks:
            wrap_callback_class(patches, timer, type(callback))
        return callbacks

    patches.replace(train_mod, "build_callbacks", timed_build_callbacks, build_callbacks)


@contextlib.contextmanager
def instrument(timer: PhaseTimer) -> Iterator[PhaseTimer]:
    """Wrap the default run's code path in phases for the duration of the block."""
    import torch
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop

    from .. import results, train as train_mod
    from ..callbacks.interrupt import GracefulInterrupt
    from ..data import tasks  # noqa: F401  (its data modules are subclasses to wrap too)
    from ..data.text import ResumableDataModule
    from ..module import GPTModule

    patches = Patches()
    try:
        for cls in {ResumableDataModule, *_subclasses(ResumableDataModule)}:
            if "setup" in cls.__dict__:
                patches.wrap(cls, "setup", timer, "data: read and encode the corpus")
        patches.wrap(results, "git_sha", timer, "git sha (two git subprocesses)")
        patches.wrap(results.RunRecord, "finish", timer, "results.json")
        patches.wrap(GPTModule, "__init__", timer, "model: build")
        patches.wrap(L.Trainer, "__init__", timer, "trainer: build")
        patches.wrap(train_mod, "check_kernel_runs", timer, "kernel check forward")
        patches.wrap(WandbLogger, "__init__", timer, "W&B: import and logger setup")
        patches.wrap(WandbLogger, "log_hyperparams", timer, "W&B: log config")
        patches.wrap(WandbLogger, "log_metrics", timer, "W&B: log metrics")
        patches.wrap(WandbLogger, "log_image", timer, "W&B: log images and tables")
        patches.wrap(WandbLogger, "log_table", timer, "W&B: log images and tables")
        patches.wrap(WandbLogger, "finalize", timer, "W&B: finish")
        patches.wrap(CSVLogger, "log_metrics", timer, "CSV: log metrics")
        patches.wrap(CSVLogger, "log_hyperparams", timer, "CSV: log config")
        patches.wrap(_ExperimentWriter, "save", timer, "CSV: write file")
        patches.wrap(_EvaluationLoop, "run", timer, "validation")
        patches.wrap(L.Trainer, "save_checkpoint", timer, "checkpoint writes")
        patches.wrap(GPTModule, "training_step", timer, "step: forward (+ self.log)")
        patches.wrap(L.LightningModule, "log", timer, "step: LightningModule.log")
        patches.wrap(GPTModule, "backward", timer, "step: backward")
        patches.wrap(GPTModule, "configure_gradient_clipping", timer, "step: gradient clipping")
        patches.wrap(GPTModule, "optimizer_step", timer, "step: AdamW update")
        patches.wrap(GPTModule, "on_train_batch_start", timer, "step: tokens/s timer")
        patches.wrap(GPTModule, "on_train_batch_end", timer, "step: tokens/s timer")
        patches.wrap(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", timer, "step: next batch")
        patches.wrap(torch.optim.lr_scheduler.LRScheduler, "step", timer, "step: lr schedule")
        wrap_callback_class(patches, timer, GracefulInterrupt)
        import wandb

        patches.wrap(wandb, "init", timer, "W&B: init")
        patches.wrap(wandb, "finish", timer, "W&B: finish")
        wrap_callbacks_when_built(patches, timer)
        patches.wrap(train_mod, "train", timer, "train(): not covered above")
        start_experiments = train_mod.start_experiments

        def timed_start_experiments(loggers):
            return timer.wrap("W&B: init, waited for (it runs in a thread)", start_experiments(loggers))

        patches.replace(train_mod, "start_experiments", timed_start_experiments, start_experiments)
        fit = L.Trainer.fit

        def timed_fit(trainer, *args, **kwargs):
            for callback in trainer.callbacks:  # those Lightning adds (progress bar) included
                wrap_callback_class(patches, timer, type(callback))
            with timer.phase("Lightning loop: not covered above"):
                return fit(trainer, *args, **kwargs)

        patches.replace(L.Trainer, "fit", timed_fit, fit)
        yield timer
    finally:
        patches.restore()


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found
