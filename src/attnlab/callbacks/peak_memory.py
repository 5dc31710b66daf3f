"""Peak memory of a training step (forward, backward, optimizer), sampled every K steps.

``mem/peak_bytes`` is the peak of tensor memory allocated during the step above the level at its
start (CPU: profiler allocation events; CUDA: the allocator's peak counter), so it is comparable
across devices. ``mem/attn_matrix_bytes`` is the analytic size of one layer's attention matrix,
B x H x T^2 x bytes: the quadratic term that explicit backends materialise and fused ones do not.
``mem/kv_cache_bytes_per_token`` is what an inference KV cache holds per token of context at
``mem/kv_cache_context`` = model.block_size tokens (``GPTConfig.kv_cache_bytes`` over that context):
2 x n_layer x n_kv_head x d_k x bytes, what grouped-query attention saves; n_layer x (d_c + d_rope) x
bytes with latent attention; with a window, scaled by min(1, (window + window_sinks) / block_size).
On CUDA ``mem/cuda_max_allocated_bytes`` adds the absolute peak (weights and optimizer state included).
"""

from __future__ import annotations

import lightning as L

from attnlab.callbacks.cadence import log_metrics
from attnlab.util.profiling import PeakMemory


class PeakMemoryMonitor(L.Callback):
    def __init__(self, every_n_steps: int = 250):
        self.every_n_steps = every_n_steps
        self._mem: PeakMemory | None = None
        self.last: dict[str, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # global_step counts finished steps: sample steps 0, K, 2K, ... (the first step included)
        if self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0:
            self._mem = PeakMemory(pl_module.device).__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._mem is None:
            return
        self._mem.__exit__(None, None, None)
        x = batch[0]
        cfg = pl_module.model.cfg
        dtype_bytes = 2 if trainer.precision in ("bf16-mixed", "16-mixed", "bf16-true", "16-true") else 4
        self.last = {
            "mem/peak_bytes": float(self._mem.peak_bytes),
            "mem/attn_matrix_bytes": float(x.shape[0] * cfg.n_head * x.shape[1] ** 2 * dtype_bytes),
            "mem/kv_cache_bytes_per_token": cfg.kv_cache_bytes(cfg.block_size, dtype_bytes) / cfg.block_size,
            "mem/kv_cache_context": float(cfg.block_size),
        }
        if self._mem.cuda_max_allocated is not None:
            self.last["mem/cuda_max_allocated_bytes"] = float(self._mem.cuda_max_allocated)
        log_metrics(trainer, self.last)
        self._mem = None

    def on_exception(self, trainer, pl_module, exception):
        """A step that raised never reaches on_train_batch_end: close its window, so stderr is the run's again."""
        if self._mem is not None:
            self._mem.__exit__(None, None, None)
            self._mem = None

    def summary(self) -> dict[str, float]:
        return dict(self.last)
