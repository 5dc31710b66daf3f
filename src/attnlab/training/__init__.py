"""Running one training: the entry point, the LightningModule, checkpoints, devices, what a run prints
and records (results.json), and where it goes in W&B."""
