"""Per-layer and per-head attention statistics on a fixed probe batch, every N steps.

Works for every backend: the probabilities are recomputed from the q and k that reach each
attention layer, in query blocks (``attnlab.attention.stats``), so fused kernels are measured the
same way as explicit ones. At long block sizes the probe is bounded (``probe_plan``): at most
``max_tokens`` tokens and ``max_rows`` query positions per sequence. Logged as ``attn/L{i}/{stat}`` and ``attn/L{i}/H{h}/{stat}`` to every
logger, appended to ``attention_stats.jsonl`` in the run dir, and the final per-layer values go
into results.json (``summary()``).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from attnlab.analysis.probe import probe, probe_batch, probe_plan, training_precision
from attnlab.attention.stats import SECOND_MAP, attention_stats, layer_values, record_stats
from attnlab.callbacks.cadence import log_metrics, should_run

HISTORY_FILE = "attention_stats.jsonl"  # one JSON line of per-layer statistics per probe step


def read_history(run_dir: Path) -> list[dict]:
    """The statistics a run recorded over training ([] if it recorded none)."""
    path = Path(run_dir) / HISTORY_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class AttentionStats(L.Callback):
    def __init__(
        self,
        every_n_steps: int = 100,
        probe_size: int = 8,
        block: int = 128,
        per_head: bool = True,
        max_tokens: int | None = 2048,
        max_rows: int | None = 1024,
    ):
        self.every_n_steps, self.probe_size, self.block, self.per_head = every_n_steps, probe_size, block, per_head
        self.max_tokens, self.max_rows = max_tokens, max_rows
        self.history: list[dict] = []
        self._x: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Every metric of the registry (attention.stats.METRICS) on the probe batch, as flat keys."""
        if self._x is None:
            x = probe_batch(trainer, self.probe_size)
            n, self._positions = probe_plan(len(x), x.shape[1], self.max_tokens, self.max_rows)
            self._x = x[:n]
        metrics: dict[str, float] = {}
        classes = getattr(trainer.datamodule, "query_classes", None)  # e.g. active vs dormant queries
        classes = classes(self._x) if classes is not None else None
        for rec in probe(pl_module.model, self._x.to(pl_module.device), training_precision(trainer)):
            i = rec.index
            per_head = {}
            # a differential layer's two softmax maps: A1 under the metrics' names, A2 as a2_<name>
            for prefix, (q, k) in zip(("", SECOND_MAP), rec.layer.maps(rec.q, rec.k)):
                stats = attention_stats(
                    q,
                    k,
                    rec.layer.weight_rule(fp32=True),
                    block=self.block,
                    query_classes=classes,
                    positions=self._positions,
                )
                per_head |= {prefix + name: v for name, v in stats.items()}
            per_layer = record_stats(rec)
            per_head |= {name: v for name, v in per_layer.items() if v.dim()}
            metrics.update({f"attn/L{i}/{name}": v for name, v in layer_values(per_head).items()})
            metrics.update({f"attn/L{i}/{name}": float(v) for name, v in per_layer.items() if not v.dim()})
            if self.per_head:
                for name, values_h in per_head.items():
                    metrics.update({f"attn/L{i}/H{h}/{name}": float(v) for h, v in enumerate(values_h)})
        return metrics

    def _record(self, trainer, metrics):
        step = trainer.global_step
        self.history.append({"step": step, **{k: v for k, v in metrics.items() if k.count("/") == 2}})
        if trainer.is_global_zero and trainer.default_root_dir:
            with open(Path(trainer.default_root_dir) / HISTORY_FILE, "a") as f:
                f.write(json.dumps(self.history[-1]) + "\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not should_run(trainer, self.every_n_steps, batch_idx):
            return
        metrics = self.measure(trainer, pl_module)
        log_metrics(trainer, metrics)
        self._record(trainer, metrics)
        self.final = metrics

    def on_train_end(self, trainer, pl_module):
        if self.history and self.history[-1]["step"] == trainer.global_step:
            return  # the last step was measured: that is the final measurement
        self.final = self.measure(trainer, pl_module)
        self._record(trainer, self.final)
        log_metrics(trainer, self.final)

    def summary(self) -> dict[str, float]:
        """Final per-layer values for results.json."""
        return {k: v for k, v in getattr(self, "final", {}).items() if k.count("/") == 2}
