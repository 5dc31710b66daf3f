"""HeadAnalysis: head-type scores over training, and the head table at its end.

Every ``every_n_steps`` steps (and at step 0) it scores every head on a fixed probe
(``attnlab.analysis.heads``) and logs the maxima as ``heads/<score>_max`` and
``heads/L{i}/<score>_max``, plus ``heads/repeat_acc`` (copying accuracy on the repeated probe),
so one can see whether an induction score jumps together with accuracy. At the end of training
it classifies every head and writes heads.json, heads.md and heads.png in the run dir, logs a
W&B Table when a WandbLogger is attached, and keeps the list on ``self.heads``.
``knockout`` says when induction_knockout is measured: "final" (default; it costs
n_layer x (n_head + 1) extra forward passes, 6 % of a tiny-preset run at every 250 steps),
"always" (every measurement, for its curve over training) or "never". ``max_len`` bounds the
probes' length and ``probe_tokens`` each probe's tokens (``analysis.heads.probe_rows``: all 16
rows up to T = 64, evenly spaced fewer beyond), so a measurement costs about what it costs at
T = 64 at any block size.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from attnlab.analysis.heads import THRESHOLDS, Probes, analyze_heads, build_probes
from attnlab.analysis.outputs import table_columns, table_rows, write_outputs
from attnlab.analysis.probe import training_precision
from attnlab.callbacks.cadence import log_metrics
from attnlab.config.schema import KNOCKOUT


class HeadAnalysis(Callback):
    def __init__(
        self,
        every_n_steps: int = 100,
        n_probe: int = 16,
        seed: int = 0,
        output_dir: str | None = None,
        plot: bool = True,
        thresholds: dict | None = None,
        knockout: str = "final",
        max_len: int | None = 256,
        probe_tokens: int | None = 1024,
    ):
        if knockout not in KNOCKOUT:
            raise ValueError(f"callbacks.heads.knockout={knockout!r}; expected one of {', '.join(KNOCKOUT)}")
        if max_len is not None and (not isinstance(max_len, int) or max_len < 2):
            raise ValueError(f"callbacks.heads.max_len={max_len!r}; expected an integer >= 2 or null (the whole block)")
        if probe_tokens is not None and (not isinstance(probe_tokens, int) or probe_tokens < 1):
            raise ValueError(
                f"callbacks.heads.probe_tokens={probe_tokens!r}; expected a positive integer or null (every probe row)"
            )
        self.probe_tokens = probe_tokens
        self.every_n_steps, self.n_probe, self.seed, self.knockout, self.max_len = (
            every_n_steps,
            n_probe,
            seed,
            knockout,
            max_len,
        )
        self.output_dir, self.plot = output_dir, plot
        self.thresholds = {**THRESHOLDS, **(thresholds or {})}
        self.probes: Probes | None = None
        self.heads: list[dict] = []
        self.final: dict = {}  # summary of the last measurement
        self.history: list[dict] = []

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool = False) -> dict:
        if self.probes is None:
            vocab = pl_module.hparams.get("vocab") if hasattr(pl_module, "hparams") else None
            self.probes = build_probes(
                pl_module.model,
                vocab,
                getattr(trainer, "datamodule", None),
                self.n_probe,
                self.seed,
                self.max_len,
                self.probe_tokens,
            )
        knockout = self.knockout == "always" or (final and self.knockout == "final")
        with training_precision(trainer)():  # the forwards see the training dtype and kernel
            self.heads, self.final = analyze_heads(pl_module.model, self.probes, self.thresholds, knockout=knockout)
        entry = {"step": trainer.global_step, **self.final}
        if self.history and self.history[-1]["step"] == entry["step"]:
            self.history[-1] = entry  # the final analysis of a step already measured: it adds the knockout
        else:
            self.history.append(entry)
        return self.summary()

    def summary(self) -> dict[str, float]:
        """The last measurement as flat metrics (``heads/induction_max``, ...), for results.json."""
        return {f"heads/{k}": float(v) for k, v in self.final.items()}

    def results_fields(self) -> dict:
        """Top-level fields for results.json: the classified heads."""
        return {"heads": self.heads}

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero and self.every_n_steps:
            log_metrics(trainer, self._measure(trainer, pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not (self.every_n_steps and step % self.every_n_steps == 0 and trainer.is_global_zero):
            return
        if self.history and self.history[-1]["step"] == step:
            return  # gradient accumulation: one measurement per optimizer step
        log_metrics(trainer, self._measure(trainer, pl_module))

    def on_train_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        measured = self.history and self.history[-1]["step"] == trainer.global_step
        if not measured or self.knockout == "final":
            log_metrics(trainer, self._measure(trainer, pl_module, final=True))
        out_dir = Path(self.output_dir or trainer.default_root_dir)
        meta = {
            "plain": self.probes.plain_source,
            "n": len(self.probes.repeat),
            "half": f"{int(self.probes.half.min())}..{int(self.probes.half.max())}",
            "step": trainer.global_step,
        }
        paths = write_outputs(self.heads, self.final, out_dir, self.history, meta, plot=self.plot)
        self._log_wandb(trainer, paths.get("png"))

    def _log_wandb(self, trainer, png: Path | None) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(key="heads/table", columns=table_columns(self.heads), data=table_rows(self.heads))
                if png is not None:
                    logger.log_image(key="heads/heatmap", images=[str(png)])
