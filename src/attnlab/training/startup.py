"""Start-up trims for the processes that train: what a run imports but never uses is loaded on use.

torchmetrics imports ``scipy.signal`` when it is imported itself, only to give old code a
``scipy.signal.hamming``; Lightning imports torchmetrics to read its version. That is 1-1.5 s of
every training process's start-up on a 2-core machine (reports/bench/breakdown.md), and nothing in
training uses scipy.signal. ``defer_scipy_signal()`` puts a stand-in module in its place that
imports the real one at the first attribute anyone reads (its ``hamming`` included), so code that
does use scipy.signal gets the real module, one import later. The package's ``__init__`` calls it, so it
runs before any training module imports Lightning.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

SIGNAL = "scipy.signal"


class DeferredModule(types.ModuleType):
    """A module that imports the real one, and hands it over, at the first attribute read."""

    def __getattr__(self, name: str):
        return getattr(load_deferred(self.__name__), name)


def load_deferred(name: str) -> types.ModuleType:
    """Replace the stand-in for ``name`` by the real module (imported now) and return it."""
    stand_in = sys.modules.get(name)
    if not isinstance(stand_in, DeferredModule):
        return stand_in
    del sys.modules[name]
    module = importlib.import_module(name)
    for key, value in vars(stand_in).items():  # what was set on the stand-in (torchmetrics' patch) stays set
        if not key.startswith("__") and not hasattr(module, key):
            setattr(module, key, value)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)
    return module


def _hamming(*args, **kwargs):
    """scipy.signal.hamming as torchmetrics patches it in: the real window, imported on first call."""
    return load_deferred(SIGNAL).windows.hamming(*args, **kwargs)


def defer_scipy_signal() -> bool:
    """Put the stand-in in place if scipy is installed and scipy.signal not imported yet; True if so."""
    if SIGNAL in sys.modules or importlib.util.find_spec("scipy") is None:
        return False
    import scipy

    stand_in = DeferredModule(SIGNAL, "stands in for scipy.signal until it is used (attnlab.training.startup)")
    stand_in.__file__ = importlib.util.find_spec(SIGNAL).origin  # read by inspect.getmodule over sys.modules
    stand_in.hamming = _hamming  # torchmetrics tests hasattr(scipy.signal, "hamming"): answered without an import
    sys.modules[SIGNAL] = stand_in
    scipy.signal = stand_in
    return True
