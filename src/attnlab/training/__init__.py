"""Running one training: the entry point, the LightningModule, checkpoints, devices, what a run prints
and records (results.json), and where it goes in W&B."""

from attnlab.training.startup import defer_scipy_signal

defer_scipy_signal()  # before any module of the package imports Lightning (torchmetrics imports scipy.signal)
