"""The machine's load while a run trains: a run that shared its cores reads as one.

Wall times measure the machine as much as the run; the planner prices seeds from them, so each
run records the 1-minute load average sampled every ``every_n_steps`` steps (and at its start and
end) beside ``os.cpu_count()``. ``machine/load_per_cpu`` above 1 means the run waited for a core.
Torch's thread count, which decides whether a CPU run repeats bit for bit, is part of the run's provenance
(``training.results.provenance``), not of this record.
"""

from __future__ import annotations

import os

import lightning as L


def load_now() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return None


class MachineLoad(L.Callback):
    def __init__(self, every_n_steps: int = 100):
        self.every_n_steps = every_n_steps
        self.samples: list[float] = []

    def _sample(self) -> None:
        if (value := load_now()) is not None:
            self.samples.append(value)

    def on_fit_start(self, trainer, pl_module):
        self._sample()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0:
            self._sample()

    def on_fit_end(self, trainer, pl_module):
        self._sample()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        mean = sum(self.samples) / len(self.samples)
        return {
            "machine/load": mean,
            "machine/load_max": max(self.samples),
            "machine/cpus": float(os.cpu_count() or 1),
            "machine/load_per_cpu": mean / (os.cpu_count() or 1),
        }
