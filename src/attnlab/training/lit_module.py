"""The LightningModule: next-token cross-entropy, AdamW with warmup + cosine, val loss and perplexity.

With ``model.compile=true`` the training and validation forwards run ``torch.compile(model)``; the
module itself stays eager (``self.model``), so probes, hooks and checkpoints see the plain model.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from attnlab.analysis.probe import capture
from attnlab.attention.stats import head_max_logits
from attnlab.config.schema import OptimConfig
from attnlab.model import GPT, GPTConfig
from attnlab.training.rng import rng_state, set_rng_state
from attnlab.util.errors import ConfigError


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, lr: float, min_lr: float) -> float:
    """nanoGPT's schedule as a multiplier of ``lr``: linear warmup, cosine decay to min_lr, then flat."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if step >= max_steps:
        return min_lr / lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return (min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)) / lr


def loggers_write_this_step(trainer: L.Trainer) -> bool:
    """Whether the loggers will write what a training step logs: Lightning's own rule (every
    ``log_every_n_steps``-th optimizer step, counted from 1, and a step at which a stop was
    requested), read from public state before the step's optimizer update."""
    n = trainer.log_every_n_steps
    return n > 0 and ((trainer.global_step + 1) % n == 0 or trainer.should_stop)


class GPTModule(L.LightningModule):
    def __init__(
        self, model: GPTConfig | dict, optim: OptimConfig | dict, max_steps: int, vocab: list[str] | None = None
    ):
        """``model`` and ``optim`` typed (train()) or as a checkpoint's plain dicts; the checkpoint
        holds plain dicts either way, which load without attnlab's classes (weights_only)."""
        super().__init__()
        typed = model if isinstance(model, GPTConfig) else None
        model = asdict(model) if typed else model
        optim = asdict(optim) if isinstance(optim, OptimConfig) else optim
        self.save_hyperparameters()  # reads the arguments as they are now: the plain dicts
        if not isinstance(model.get("compile", False), bool):
            raise ConfigError("model.compile", model["compile"], "true or false")
        self.model = GPT(typed or GPTConfig(**model))
        self.val_loss = MeanMetric()  # token-weighted mean NLL; val/ppl is its exp (no second log-softmax)
        # next-token accuracy over the scored positions (all of them for text; answers only for tasks);
        # validate_args off: its per-batch range checks cost more than the update itself
        self.val_acc = MulticlassAccuracy(
            num_classes=model["vocab_size"], average="micro", ignore_index=-100, validate_args=False
        )
        self.last_val_step = -1
        self._grad_norm: torch.Tensor | None = None  # this step's, once computed (gradient_norm)
        self._step_rates: list[float] = []
        self._logged_step = False  # whether the loggers write this training step (set in training_step)
        self._masked: dict[str, MeanMetric] = {}  # val/<class>/loss|acc of a task's metric masks, made on first use
        self.qk_clip = optim.get("qk_clip")  # None (off) for a module built without an optim group
        self._step_max_logits: list[torch.Tensor] | None = None  # per layer (H,), over the step's micro-batches

    def forward(self, idx, targets=None):
        return self.model(idx, targets)

    @property
    def compiled(self) -> bool:
        """True while the steps run the torch.compile'd model (false again after a failed compile)."""
        return bool(self.model.cfg.compile) and not self.__dict__.get("_compile_failed")

    @property
    def compile_record(self) -> dict:
        """For results.json: whether torch.compile was asked for, ran, or fell back (and why)."""
        return {
            "asked": bool(self.model.cfg.compile),
            "ran": self.compiled,
            "fallback": self.__dict__.get("_compile_failed"),
        }

    def step_forward(self, x, y):
        """The training and validation forward: ``self.model``, or its torch.compile'd wrapper.

        The wrapper is kept out of the module tree (``__dict__``), so the state dict, checkpoints and
        hooks are the eager model's (hooks on a compiled graph would not fire: probes run eager). If
        the compiler cannot run here (inductor needs a C++ compiler), one line says so and the run
        goes on eager.
        """
        if not self.compiled:
            return self.model(x, y)
        if "_compiled" not in self.__dict__:
            self.__dict__["_compiled"] = torch.compile(self.model)
        try:
            return self.__dict__["_compiled"](x, y)
        except torch._dynamo.exc.BackendCompilerFailed as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            print(
                f"attnlab: model.compile=true: torch.compile cannot run here ({reason}); training eager",
                file=sys.stderr,
            )
            self.__dict__["_compile_failed"] = reason
            return self.model(x, y)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.qk_clip is None:
            _, loss = self.step_forward(x, y)
        else:
            loss = self._forward_noting_max_logits(x, y)
        # Only on the steps the loggers write (trainer.log_every_n_steps, as LearningRateMonitor does) and
        # the last one: a self.log call is a measurable share of a tiny-preset step, and the other
        # steps' values would be overwritten unwritten. results.json's train/loss is the last step's. A stop
        # by signal hands its step's values to the loggers itself (callbacks.interrupt.write_step_logs).
        self._logged_step = loggers_write_this_step(self.trainer)  # on_train_batch_end reuses it, after the update
        if self._logged_step or self.global_step + 1 >= self.trainer.max_steps:
            # under DDP, the mean over processes (the loss the update actually follows), not rank 0's share
            self.log("train/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
            self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def _forward_noting_max_logits(self, x, y) -> torch.Tensor:
        """The training forward, keeping each head's largest logit (``stats.head_max_logits``, the
        statistics' max_logit) from the q and k it recorded: detached views of tensors the backward
        keeps anyway."""

        with capture(self.model) as records:
            _, loss = self.step_forward(x, y)
        maxima = [head_max_logits(rec.layer, rec.q, rec.k) for rec in records]
        previous = self._step_max_logits
        self._step_max_logits = maxima if previous is None else [torch.maximum(a, b) for a, b in zip(previous, maxima)]
        return loss

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        """The optimizer's step, then QK-clip (``optim.qk_clip``) on the logits of the step's forwards."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        if self.qk_clip is None or self._step_max_logits is None:
            return
        layers = [block.attn for block in self.model.blocks]
        clipped = sum(layer.clip_qk(m, self.qk_clip) for layer, m in zip(layers, self._step_max_logits))
        self._step_max_logits = None
        if self._logged_step:
            self.log("train/qk_clipped_heads", float(clipped))

    def on_after_backward(self):
        self._grad_norm = None  # new gradients (each micro-batch, with gradient accumulation)

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """The module's parameters as a list, walked once: each ``parameters()`` call walks the whole
        module tree, and the guard and the clipping read the list every step."""
        if "_trained_parameters" not in self.__dict__:
            self.__dict__["_trained_parameters"] = list(self.parameters())
        return self.__dict__["_trained_parameters"]

    def step_gradients(self) -> list[torch.Tensor]:
        """This step's gradients (the parameters that have one)."""
        return [p.grad for p in self.trained_parameters() if p.grad is not None]

    def gradient_norm(self) -> torch.Tensor:
        """The total 2-norm of this step's gradients, computed once per step: the non-finite guard
        (callbacks.guard) and the gradient clipping both read this one value."""
        if self._grad_norm is None:
            grads = self.step_gradients()
            self._grad_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self.device)
        return self._grad_norm

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """Clipping by norm uses the step's ``gradient_norm()`` (Lightning's own would compute it again);
        the numbers are those of torch.nn.utils.clip_grad_norm_."""
        if gradient_clip_val and (gradient_clip_algorithm or "norm") == "norm":
            torch.nn.utils.clip_grads_with_norm_(self.trained_parameters(), gradient_clip_val, self.gradient_norm())
        else:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def _sync(self):
        """CUDA runs asynchronously: without a synchronize the timer would stop before the GPU does."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_train_batch_start(self, batch, batch_idx):
        self._sync()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._sync()
        rate = batch[0].numel() / (time.perf_counter() - self._t0)
        self._step_rates.append(rate)
        if self._logged_step:  # other steps' values would be overwritten unwritten
            self.log("perf/tokens_per_s", rate)

    @property
    def median_tokens_per_s(self) -> float:
        """Median over steps of tokens/s (forward, backward, optimizer, callbacks); the median keeps
        the occasional profiled or checkpointing step from skewing it."""
        return float(torch.tensor(self._step_rates).median()) if self._step_rates else float("nan")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits, loss = self.step_forward(x, y)
        self.val_loss.update(loss, weight=(y != -100).sum())
        self.val_acc.update(logits.argmax(-1).flatten(), y.flatten())
        masks = getattr(getattr(self.trainer, "datamodule", None), "metric_masks", None)
        if masks is not None:  # a task's named position classes: val/<name>/loss and val/<name>/acc
            self._update_masked(logits, y, masks(x))

    def _update_masked(self, logits, y, masks: dict[str, torch.Tensor]) -> None:
        nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none").view_as(y)
        right = (logits.argmax(-1) == y).float()
        for name, mask in masks.items():
            mask = mask & (y != -100)
            for kind, values in (("loss", nll), ("acc", right)):
                key = f"val/{name}/{kind}"
                if key not in self._masked:
                    self._masked[key] = MeanMetric().to(self.device)
                self._masked[key].update(values[mask])

    def on_validation_epoch_end(self):
        val_loss = self.val_loss.compute()
        self.log("val/loss", val_loss, prog_bar=True)
        self.log("val/ppl", torch.exp(val_loss))  # exp of the token-weighted mean NLL: perplexity's definition
        self.log("val/acc", self.val_acc.compute())
        for key, metric in self._masked.items():
            self.log(key, metric.compute())
            metric.reset()
        for metric in (self.val_loss, self.val_acc):
            metric.reset()
        self.last_val_step = self.global_step

    def on_save_checkpoint(self, checkpoint):
        checkpoint["rng"] = rng_state()  # dropout and any sampling continue identically on resume

    def on_load_checkpoint(self, checkpoint):
        if "rng" in checkpoint:
            set_rng_state(checkpoint["rng"])

    def configure_optimizers(self):
        o = OptimConfig(**self.hparams.optim)
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if o.name == "sgd":  # the sinks testbed's control arm: no adaptive step sizes
            opt = torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum)
        else:
            opt = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, o.warmup_steps, self.hparams.max_steps, o.lr, o.min_lr)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
