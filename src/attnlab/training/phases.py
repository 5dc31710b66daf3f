"""Where a training process's seconds go: named phases the core marks itself, off unless asked for.

``phase(name)`` brackets one step of ``attnlab.training.train`` (imports, Hydra, data, model, fit, results ...).
It writes to one process-wide ``Recorder`` when one is enabled and costs one global read otherwise.
The recorder is enabled by ``enable()`` or by the environment variable ``ATTNLAB_PHASES=<file.json>``
(the bench sets it on the process it times); the file is written when the process exits.

Time is exclusive: a phase nested in another counts for the inner one only, so the phases of the
main thread add up to the span they cover. A phase entered in another thread (the W&B start)
overlaps the main thread's and is kept apart, in ``background``.

Inside ``Trainer.fit`` the phases are Lightning's own profiler actions ("[Callback]X.on_train_batch_end",
"[Strategy]S.backward", "save_checkpoint", ...): ``lightning_profiler()`` is a ``Trainer(profiler=...)``
that records each action as a phase, through Lightning's public profiler interface.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV = "ATTNLAB_PHASES"
IMPORTS = "imports (interpreter, torch, lightning, hydra, attnlab)"


class Recorder:
    """Exclusive and inclusive seconds, call counts and the last end (epoch seconds) of each phase name."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.inclusive: dict[str, float] = {}  # nested phases counted too (a final checkpoint inside a callback's hook)
        self.calls: dict[str, int] = {}
        self.background: dict[str, float] = {}
        self.last_end: dict[str, float] = {}  # epoch seconds, comparable with another process's clock
        self.started = clock()
        self._epoch = time.time() - self.started  # clock reading -> epoch seconds
        self._thread = threading.get_ident()
        self._stack: list[list] = []  # [name, start, seconds of nested phases]

    def begin(self, name: str, at: float | None = None) -> None:
        """Open ``name`` on the main thread's stack (``at``: an earlier clock reading it started at)."""
        start = self.clock() if at is None else at
        self._stack.append([name, start, 0.0])
        self.started = min(self.started, start)

    def end(self, name: str) -> None:
        """Close ``name``; phases opened inside it and still open are closed first (a hook that raised)."""
        if not any(entry[0] == name for entry in self._stack):
            return
        while self._stack:
            entry = self._stack.pop()
            now = self.clock()
            elapsed = now - entry[1]
            self.seconds[entry[0]] = self.seconds.get(entry[0], 0.0) + elapsed - entry[2]
            self.inclusive[entry[0]] = self.inclusive.get(entry[0], 0.0) + elapsed
            self.calls[entry[0]] = self.calls.get(entry[0], 0) + 1
            self.last_end[entry[0]] = self._epoch + now
            if self._stack:
                self._stack[-1][2] += elapsed
            if entry[0] == name:
                return

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if threading.get_ident() != self._thread:
            start = self.clock()
            try:
                yield
            finally:
                self.background[name] = self.background.get(name, 0.0) + self.clock() - start
            return
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def data(self) -> dict:
        """What the bench reads: the phases, and the span they cover (first start to now), both ways of dating."""
        now = self.clock()
        return {
            "seconds": dict(self.seconds),
            "inclusive_s": dict(self.inclusive),
            "calls": dict(self.calls),
            "background_s": dict(self.background),
            "last_end": dict(self.last_end),
            "span_s": now - self.started,
            "started_at": self._epoch + self.started,
            "written_at": self._epoch + now,
        }


_recorder: Recorder | None = None
_imports_over = False  # train.py's imports have run: a recorder enabled now has no start-up to time
_OFF = contextlib.nullcontext()


def recorder() -> Recorder | None:
    return _recorder


def phase(name: str) -> contextlib.AbstractContextManager:
    """Time the block as ``name`` when a recorder is enabled; otherwise do nothing."""
    return _OFF if _recorder is None else _recorder.phase(name)


def enable(out: Path | str | None = None) -> Recorder:
    """Start recording in this process (the imports counted from the process's start, when they are
    still to come); with ``out``, the phases are written there as JSON when the process exits (rank 0 only)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
        if not _imports_over:  # enabled in a process that has yet to import the run's code
            age = process_age()
            _recorder.begin(IMPORTS, at=_recorder.clock() - age if age is not None else None)
        if out is not None and os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0":
            atexit.register(write, Path(out))
    return _recorder


def disable() -> None:
    global _recorder
    _recorder = None


def imports_done() -> None:
    """The end of the start-up imports (called once train.py's imports have run)."""
    global _imports_over
    _imports_over = True
    if _recorder is not None:
        _recorder.end(IMPORTS)


def write(out: Path) -> None:
    if _recorder is not None:
        out.write_text(json.dumps(_recorder.data(), indent=1))


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc; elsewhere None, and the imports count from
    the recorder's start). Resolution: one clock tick, 10 ms."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22, starttime, after the parenthesised command name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def lightning_profiler():
    """A ``Trainer(profiler=...)`` that records Lightning's actions as phases; None when not recording
    (Lightning's default, which profiles nothing)."""
    if _recorder is None:
        return None
    from lightning.pytorch.profilers import Profiler

    class PhaseProfiler(Profiler):
        def start(self, action_name: str) -> None:
            if _recorder is not None and threading.get_ident() == _recorder._thread:
                _recorder.begin(action_name)

        def stop(self, action_name: str) -> None:
            if _recorder is not None and threading.get_ident() == _recorder._thread:
                _recorder.end(action_name)

    return PhaseProfiler()


if os.environ.get(ENV):
    enable(os.environ[ENV])
