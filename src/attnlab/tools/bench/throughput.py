"""Training throughput: the Lightning loop against a plain PyTorch loop, and what the callbacks cost.

Both loops train the same model (same seed, config, batches, AdamW + warmup-cosine schedule and
gradient clipping) in the same process, in alternation, so a neighbour's load hits both alike.
A step's time is the span between the ends of consecutive training batches: it covers the whole
cycle (data loading, forward, backward, clipping, optimizer, every hook and log call) and leaves
out start-up, validation and teardown. The first ``warmup`` steps are not counted.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.profilers import Profiler
from omegaconf import DictConfig, OmegaConf

from attnlab.config.compose import compose_config
from attnlab.tools.bench.timing import median_and_range, paired_ratios
from attnlab.training.console import quiet_lightning
from attnlab.training.lit_module import GPTModule
from attnlab.training.train import build_callbacks

INTERVAL_KEYS = ("every_n_steps", "every_n_train_steps", "check_every_n_steps")


class HookTimer(Profiler):
    """Lightning's profiler seam: the seconds inside each callback's hooks, read from the actions
    Lightning itself profiles around every callback hook ("[Callback]<state_key>.<hook>"), nothing
    wrapped or replaced. Work a callback does in module hooks it registers (e.g. forward hooks) is
    not seen here; the whole-run comparison still counts it.
    """

    PREFIX = "[Callback]"

    def __init__(self, device: torch.device, callbacks: list[L.Callback]):
        super().__init__()
        self.device, self._open = device, {}
        self.seconds = {type(c).__name__: 0.0 for c in callbacks}

    def start(self, action_name: str) -> None:
        if action_name.startswith(self.PREFIX):
            self._open[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        t0 = self._open.pop(action_name, None)
        if t0 is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        # "<state_key>.<hook>", a state_key being the class name, with the callback's settings in {...} for some
        name = action_name[len(self.PREFIX) :].rsplit(".", 1)[0].split("{")[0]
        if name in self.seconds:  # the callbacks under test, not the bench's own step clock
            self.seconds[name] += time.perf_counter() - t0


class StepClock(L.Callback):
    """A time stamp at the end of every training batch (after a device sync)."""

    def __init__(self, device: torch.device):
        self.device, self.stamps = device, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stamps.append(time.perf_counter())


def seconds_per_step(stamps: list[float], warmup: int) -> float:
    """Mean step time over the stamps after the first ``warmup`` steps."""
    if warmup < 1 or len(stamps) <= warmup:
        raise ValueError(f"need more than warmup={warmup} >= 1 steps, got {len(stamps)}")
    return (stamps[-1] - stamps[warmup - 1]) / (len(stamps) - warmup)


@dataclass
class TrainSetup:
    """One backend's composed config, its data and the model/optimizer arguments both loops share."""

    cfg: DictConfig
    datamodule: L.LightningDataModule
    device: torch.device
    model_cfg: dict = field(default_factory=dict)
    optim_cfg: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.cfg.trainer.max_steps)

    @property
    def tokens_per_step(self) -> int:
        return int(self.cfg.data.batch_size) * int(self.cfg.model.block_size)

    def new_module(self) -> GPTModule:
        torch.manual_seed(int(self.cfg.seed))
        return GPTModule(self.model_cfg, self.optim_cfg, self.steps)


def make_setup(overrides: list[str], out_dir: Path, device: torch.device, datamodule=None) -> TrainSetup:
    cfg = compose_config(overrides, out_dir)
    if datamodule is None:
        datamodule = instantiate(cfg.data, block_size=cfg.model.block_size, steps=cfg.trainer.max_steps, seed=cfg.seed)
        datamodule.setup("fit")
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True) | {"vocab_size": datamodule.vocab_size}
    return TrainSetup(cfg, datamodule, device, model_cfg, OmegaConf.to_container(cfg.optim, resolve=True))


def lightning_step_seconds(
    setup: TrainSetup, warmup: int, callbacks: list | None = None, profiler: Profiler | None = None
) -> float:
    """Seconds per step of ``Trainer.fit`` as the project configures it (validation off), with
    ``profiler`` (a HookTimer) as the Trainer's."""
    module = setup.new_module()
    clock = StepClock(setup.device)
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as root, quiet_lightning(silence_output=True):
        trainer = instantiate(
            setup.cfg.trainer,
            logger=False,
            callbacks=[*(callbacks or []), clock],
            default_root_dir=root,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            **({} if profiler is None else {"profiler": profiler}),
        )
        trainer.fit(module, datamodule=setup.datamodule)
    return seconds_per_step(clock.stamps, warmup)


def _autocast(setup: TrainSetup):
    precision = str(setup.cfg.trainer.precision)
    if precision in ("32", "32-true"):
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(setup.device.type, dtype=torch.bfloat16)
    raise ValueError(f"the plain loop supports trainer.precision 32 and bf16-mixed, got {precision!r}")


class PlainUpdate:
    """A fresh model of the setup with its AdamW and schedule, and the update Lightning's automatic
    optimisation does after a forward (zero grads, backward, clip, step, schedule): the hand-written
    loop the benches compare against."""

    def __init__(self, setup: TrainSetup):
        module = setup.new_module().to(setup.device)
        self.model = module.model.train()
        conf = module.configure_optimizers()
        self.optimizer, self.scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        self.clip = setup.cfg.trainer.get("gradient_clip_val") or 0.0

    def __call__(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()


def plain_step_seconds(setup: TrainSetup, warmup: int) -> float:
    """Seconds per step of a hand-written loop doing what Lightning's automatic optimisation does."""
    update = PlainUpdate(setup)
    stamps: list[float] = []
    for step, (x, y) in enumerate(setup.datamodule.train_dataloader()):
        if step >= setup.steps:
            break
        x, y = x.to(setup.device, non_blocking=True), y.to(setup.device, non_blocking=True)
        with _autocast(setup):
            _, loss = update.model(x, y)
        update(loss)
        if setup.device.type == "cuda":
            torch.cuda.synchronize(setup.device)
        stamps.append(time.perf_counter())
    return seconds_per_step(stamps, warmup)


def device_overrides(device: torch.device) -> list[str]:
    """CUDA: the gpu trainer in bf16 (flash kernels take no fp32); CPU: the project's defaults."""
    return ["trainer=gpu", "trainer.precision=bf16-mixed"] if device.type == "cuda" else []


def train_throughput(
    backends: tuple[str, ...],
    steps: int,
    warmup: int,
    repeats: int,
    device: torch.device,
    extra_overrides: list[str] = (),
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Per backend: tokens/s of the Lightning and the plain loop, their ratio, and each loop's ratio to ``scaled``.

    Each repeat runs every backend, Lightning and plain back to back (the order flips every
    repeat); every ratio is taken within a repeat and then summarised.
    """
    base = ["logger=none", "callbacks=none", f"trainer.max_steps={steps}", *device_overrides(device), *extra_overrides]
    setups, datamodule = {}, None
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as out:
        for backend in backends:
            setups[backend] = make_setup([*base, f"attention={backend}"], Path(out), device, datamodule)
            datamodule = setups[backend].datamodule
        light = {b: [] for b in backends}
        plain = {b: [] for b in backends}
        for rep in range(repeats):
            for backend in backends:
                s = setups[backend]
                runs = [("lightning", lightning_step_seconds), ("plain", plain_step_seconds)]
                for loop, fn in runs if rep % 2 == 0 else runs[::-1]:
                    tps = s.tokens_per_step / fn(s, warmup)
                    (light if loop == "lightning" else plain)[backend].append(tps)
            log(
                f"  train rep {rep + 1}/{repeats}: "
                + "  ".join(f"{b} L {light[b][-1]:.0f} / plain {plain[b][-1]:.0f} tok/s" for b in backends)
            )
    rows = []
    first = setups[backends[0]]
    for backend in backends:
        lt, pt = median_and_range(light[backend]), median_and_range(plain[backend])
        ratio = paired_ratios(light[backend], plain[backend])
        row = {
            "backend": backend,
            "lightning_tokens_per_s": lt["median"],
            "lightning_range": [lt["min"], lt["max"]],
            "plain_tokens_per_s": pt["median"],
            "plain_range": [pt["min"], pt["max"]],
            "ratio": ratio["median"],
            "ratio_range": [ratio["min"], ratio["max"]],
            "ratio_to_scaled": None,
            "ratio_to_scaled_range": None,
            "plain_ratio_to_scaled": None,
            "lightning_samples": light[backend],
            "plain_samples": plain[backend],
        }
        if "scaled" in light:
            rs = paired_ratios(light[backend], light["scaled"])
            row.update(
                ratio_to_scaled=rs["median"],
                ratio_to_scaled_range=[rs["min"], rs["max"]],
                plain_ratio_to_scaled=paired_ratios(plain[backend], plain["scaled"])["median"],
            )
        rows.append(row)
    meta = {
        "preset": "tiny",
        "batch_size": int(first.cfg.data.batch_size),
        "block_size": int(first.cfg.model.block_size),
        "steps": steps,
        "warmup_steps": warmup,
        "repeats": repeats,
        "precision": str(first.cfg.trainer.precision),
        "tokens_per_step": first.tokens_per_step,
    }
    return [dict(r, **{"setup": meta}) for r in rows]


def callback_intervals(cfg: DictConfig) -> dict[str, int]:
    """Each enabled callback's cadence in steps (the keys INTERVAL_KEYS), read from the composed config."""
    found = {}
    for name, c in (cfg.get("callbacks") or {}).items():
        if c is None:
            continue
        for key in INTERVAL_KEYS:
            value = c.get(key)
            if isinstance(value, int) and value > 0:
                found[name] = value
    return found


def representative_window(intervals: dict[str, int], cap: int) -> int:
    """Steps in which every callback fires exactly steps/interval times: the lcm of the intervals.

    Above ``cap``, the longest interval within it (each callback then fires at least once).
    """
    window = 1
    for value in intervals.values():
        window = math.lcm(window, value)
    return window if window <= cap else max((v for v in intervals.values() if v <= cap), default=cap)


def callback_overhead(
    steps: int | None,
    warmup: int,
    repeats: int,
    device: torch.device,
    backend: str = "scaled",
    cap: int = 2000,
    log: Callable[[str], None] = print,
) -> dict:
    """Step time with ``callbacks=default`` over step time with ``callbacks=none``, pair by pair, and
    both over the plain loop's (same model and batches, no Lightning) in the same repeat.

    ``steps=None`` measures over the lcm of the callbacks' intervals (so each fires at its true
    rate, e.g. 1000 steps for intervals 10, 100, 250, 500, 1000); a given ``steps`` is quicker
    but over- or under-counts the rare callbacks.
    """
    probe = compose_config(["callbacks=default"])
    intervals = callback_intervals(probe)
    window = representative_window(intervals, cap) if steps is None else steps
    base = ["logger=none", f"attention={backend}", f"trainer.max_steps={warmup + window}", *device_overrides(device)]
    on_s, off_s, plain_s, hook_ms = [], [], [], {}
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as out:
        on = make_setup([*base, "callbacks=default"], Path(out) / "on", device)
        off = make_setup([*base, "callbacks=none"], Path(out) / "off", device, on.datamodule)
        for rep in range(repeats):
            arms = [(on, on_s), (off, off_s)]
            for setup, sink in arms if rep % 2 == 0 else arms[::-1]:
                with quiet_lightning(silence_output=True):
                    callbacks = build_callbacks(setup.cfg.get("callbacks"))
                hooks = HookTimer(device, callbacks)
                sink.append(lightning_step_seconds(setup, warmup, callbacks, profiler=hooks))
                if setup is on:  # hook time over the whole run (warm-up and on_train_end too), per step
                    for name, sec in hooks.seconds.items():
                        hook_ms.setdefault(name, []).append(sec * 1e3 / setup.steps)
            plain_s.append(plain_step_seconds(off, warmup))
            log(
                f"  callbacks rep {rep + 1}/{repeats}: on {on_s[-1] * 1e3:.2f} ms/step, off {off_s[-1] * 1e3:.2f} ms/step, "
                f"plain {plain_s[-1] * 1e3:.2f} ms/step"
            )
        names = [type(c).__name__ for c in build_callbacks(on.cfg.get("callbacks"))]
    ratio = paired_ratios(on_s, off_s)
    to_plain, off_to_plain = paired_ratios(on_s, plain_s), paired_ratios(off_s, plain_s)
    on_sum, off_sum = median_and_range(on_s), median_and_range(off_s)
    return {
        "overhead_ratio": ratio["median"],
        "overhead_ratio_range": [ratio["min"], ratio["max"]],
        "ratio_to_plain": to_plain["median"],
        "ratio_to_plain_range": [to_plain["min"], to_plain["max"]],
        "none_ratio_to_plain": off_to_plain["median"],
        "none_ratio_to_plain_range": [off_to_plain["min"], off_to_plain["max"]],
        "step_ms_with": on_sum["median"] * 1e3,
        "step_ms_without": off_sum["median"] * 1e3,
        "step_ms_plain": median_and_range(plain_s)["median"] * 1e3,
        "step_s_samples": {"with": on_s, "without": off_s, "plain": plain_s},
        "callbacks": names,
        "intervals": intervals,
        "measured_steps": window,
        "warmup_steps": warmup,
        "repeats": repeats,
        "backend": backend,
        "hook_ms_per_step": {name: median_and_range(v)["median"] for name, v in hook_ms.items()},
        "representative": steps is None and window == representative_window(intervals, 10**9),
    }
