"""A callback for subprocess tests (``+callbacks.recorder._target_=batch_recorder.RecordBatches``,
``PYTHONPATH=tests``): every rank writes the input batches it trained on, so a test can check
what each DDP process saw."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L


class RecordBatches(L.Callback):
    def __init__(self):
        self.batches: list[list[list[int]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch[0].tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        path = Path(trainer.default_root_dir) / f"batches_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.batches))
