"""``python -m attnlab.tools.bench.gpt2_cpu [--out reports/bench]``: a few steps of ``model=gpt2`` through ``train()``.

The whole run as a user gets it (data=tokens, every default callback, checkpoints), at batch 1 so
that it fits a small CPU: each step's wall time from a callback of its own (``StepTimer``, added
through the config like any callback), peak RSS, the memory estimate the run checked before
training, and the checkpoint's size and write time. Every measurement callback runs every 3
steps, so of 6 steps, 2 and 5 measure nothing (the step time), 4 runs the attention statistics,
maps, memory and gradient norms, and 3 and 6 the head analysis and a checkpoint. The head
analysis's knockout (n_layer x (n_head + 1) partial forwards) is off: at this size it alone would
cost far more than the steps (said in the report). Writes ``gpt2_cpu.json`` and ``gpt2_cpu.md``.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from attnlab.config.compose import compose_config
from attnlab.data.prepare import prepare
from attnlab.data.text import shakespeare_text
from attnlab.model import GPT, GPTConfig
from attnlab.training.resources import estimate_step
from attnlab.training.train import train
from attnlab.util.cli import command_parser
from attnlab.util.files import git_sha

STEPS, EVERY = 6, 3
PLAIN_STEPS, MEASURED_STEP, HEADS_STEP = (2, 5), 4, 3  # 1-based steps (batches) by the cadences above
CORPUS_LABEL = "data.dir=<the first 1,000,000 characters of the default corpus, attnlab prepare --vocab-size 4096>"


class StepTimer(L.Callback):
    """The wall time of each training step, from one step's start to the next (callbacks included),
    and the time from the last step's end to the end of training (final validation, closing analysis)."""

    starts: list[float] = []
    ended: float | None = None
    done: float | None = None
    checkpoint: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        StepTimer.starts.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module):
        StepTimer.ended = time.perf_counter()
        # one more checkpoint, timed on its own: the periodic ones share their step with the head analysis
        path = Path(trainer.default_root_dir) / "timed.ckpt"
        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        StepTimer.checkpoint = {"seconds": round(time.perf_counter() - t0, 2), "bytes": path.stat().st_size}
        path.unlink()


def prepared_corpus(directory: Path) -> Path:

    out = directory / "shakespeare_bpe"
    prepare(out, shakespeare_text()[:1_000_000], "shakespeare[:1000000]", vocab_size=4096)
    return out


def run(out_dir: Path, extra: list[str] = ()) -> dict:
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        corpus = prepared_corpus(tmp)
        prepare_s = time.perf_counter() - t0
        overrides = [
            "model=gpt2",
            "+optim=gpt2",
            "data=tokens",
            f"data.dir={corpus}",
            "data.vocab_size=50304",
            "data.batch_size=1",
            "data.val_batches=1",
            f"trainer.max_steps={STEPS}",
            "trainer.log_every_n_steps=1",
            "trainer.enable_progress_bar=false",
            "logger=csv",
            "callbacks=default",
            f"checkpoint.every_n_steps={EVERY}",
            *(
                f"callbacks.{name}.every_n_steps={EVERY}"
                for name in ("attention_stats", "attention_maps", "peak_memory", "qk_grad_norms", "heads")
            ),
            "callbacks.heads.knockout=never",
            "+callbacks.step_timer._target_=attnlab.tools.bench.gpt2_cpu.StepTimer",
            *extra,
        ]
        cfg = compose_config(overrides, tmp / "run")
        # the class the config instantiates: under `python -m` this file is also __main__, another module object
        timer = importlib.import_module("attnlab.tools.bench.gpt2_cpu").StepTimer
        timer.starts, timer.ended = [], None
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        metrics = train(cfg)
        wall = time.perf_counter() - t0
        record = json.loads((tmp / "run" / "results.json").read_text())
        n_params = record.get("model", {}).get("n_params")
    starts = timer.starts
    steps = [b - a for a, b in zip(starts, [*starts[1:], timer.ended])]
    plain = sum(steps[i - 1] for i in PLAIN_STEPS) / len(PLAIN_STEPS)
    model = GPTConfig(**OmegaConf.to_container(cfg.model, resolve=True) | {"vocab_size": 50304})
    if n_params is None:
        with torch.device("meta"):
            n_params = sum(p.numel() for p in GPT(model).parameters())
    estimate = estimate_step(model, n_params, cfg.data.batch_size, str(cfg.trainer.precision))
    tokens = cfg.data.batch_size * cfg.model.block_size
    row = {
        "model": "gpt2",
        "params_m": round(n_params / 1e6, 1),
        "vocab_size": 50304,
        "block_size": cfg.model.block_size,
        "batch_size": cfg.data.batch_size,
        "attention": cfg.model.attention.backend,
        "precision": str(cfg.trainer.precision),
        "steps": STEPS,
        "step_s": round(plain, 2),
        "tokens_per_s": round(tokens / plain, 1),
        "first_step_s": round(steps[0], 2),
        "measurement_step_extra_s": round(steps[MEASURED_STEP - 1] - plain, 2),
        "heads_and_checkpoint_step_extra_s": round(steps[HEADS_STEP - 1] - plain, 2),
        "checkpoint_write_s": timer.checkpoint.get("seconds"),
        "checkpoint_bytes": timer.checkpoint.get("bytes"),
        "after_last_step_s": round(timer.ended and (t0 + wall - timer.ended) or 0.0, 2),
        "wall_s": round(wall, 1),
        "corpus_prepare_s": round(prepare_s, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_bytes": rss_before,
        "estimate_bytes": estimate.total,
        "mem_peak_bytes_logged": metrics.get("mem/peak_bytes"),
        "val_loss": round(float(metrics.get("val/loss", float("nan"))), 4),
        "status": record["status"],
        "step_times_s": [round(s, 2) for s in steps],
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "git_sha": git_sha(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "overrides": [CORPUS_LABEL if o.startswith("data.dir=") else o for o in overrides[:-1]],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpt2_cpu.json").write_text(json.dumps(row, indent=2) + "\n")
    (out_dir / "gpt2_cpu.md").write_text(markdown(row))
    return row


def gib(n) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def markdown(r: dict) -> str:
    return f"""# model=gpt2 on CPU: a few steps

`python -m attnlab.tools.bench.gpt2_cpu` ({r["date"]}, git {r["git_sha"]}, torch {r["torch"]}, {r["threads"]} threads on
{r["cpus"]} cores, shared with other work): {r["steps"]} steps of GPT-2 small ({r["params_m"]}M parameters, vocabulary
{r["vocab_size"]}, block {r["block_size"]}, attention={r["attention"]}, precision {r["precision"]}) at batch
{r["batch_size"]}, through `train()` with every default callback, each every 3 steps, and checkpoints; the head
analysis's knockout off (`callbacks.heads.knockout=never`; on, it adds n_layer x (n_head + 1) = 156 partial forwards
to the closing analysis).

| step | tokens/s | first step | measurement step, extra | head analysis + checkpoint step, extra | checkpoint write | checkpoint | after the last step | peak RSS | estimate checked before training | run wall |
|---|---|---|---|---|---|---|---|---|---|---|
| {r["step_s"]} s | {r["tokens_per_s"]} | {r["first_step_s"]} s | {r["measurement_step_extra_s"]} s | {r["heads_and_checkpoint_step_extra_s"]} s | {r["checkpoint_write_s"]} s | {gib(r["checkpoint_bytes"])} | {r["after_last_step_s"]} s | {gib(r["peak_rss_bytes"])} | {gib(r["estimate_bytes"])} | {r["wall_s"]} s |

Step times: {", ".join(f"{s} s" for s in r["step_times_s"])} (steps 2 and 5 measure nothing; 4 runs the statistics,
maps, memory and gradient norms; 3 and 6 the head analysis and a checkpoint). The step is the mean of steps 2 and 5;
"extra" is a step's time above it. Peak RSS is the whole process's (Python, torch, the model, AdamW, activations and
the measurements); the estimate counts one step's tensors (`attnlab.training.resources.estimate_step`). Status
`{r["status"]}`, val loss {r["val_loss"]} after {r["steps"]} steps (numbers of a few steps mean nothing about the model).
"""


def main(argv: list[str] | None = None) -> int:

    parser = command_parser("bench gpt2-cpu", __doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench", help="where gpt2_cpu.json and gpt2_cpu.md go")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args(argv)
    row = run(Path(args.out), args.overrides)
    print(
        f"attnlab: model=gpt2: {row['step_s']} s per step of {row['batch_size'] * row['block_size']} tokens, peak RSS "
        f"{gib(row['peak_rss_bytes'])}; {args.out}/gpt2_cpu.md"
    )
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
