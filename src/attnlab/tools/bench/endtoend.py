"""End to end: the whole ``python -m attnlab.training.train`` command against the plain script, same work.

Each arm is a fresh process timed from outside (start-up, imports, data, training, validation,
teardown: what a user waits for). ``make train`` (``attnlab train``) runs with its defaults (W&B offline + CSV,
default callbacks, progress bar); the plain script (``plain_train``) trains the same model on
the same batches with the same schedule and validation cadence and nothing else. Arms alternate
within a repeat and the order flips every repeat; each ratio is taken within a repeat.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.config.compose import compose_config
from attnlab.tools.bench.timing import median_and_range, paired_ratios

TARGET_RATIO = 1.05  # a whole default make train's wall time over the nanoGPT-structured plain script's


def plain_spec(overrides: list[str]) -> dict:
    """The settings ``plain_train`` needs, read from the config ``attnlab.training.train`` would compose."""
    cfg = compose_config(overrides, "unused")
    data = cfg.data
    if not str(data.get("_target_", "")).endswith("TextDataModule") or data.get("bos"):
        raise ValueError("the plain loop reads text corpora only (data=shakespeare|textfile, data.bos=false)")
    if str(cfg.trainer.precision) not in ("32", "32-true") or cfg.trainer.get("accelerator") not in ("cpu", None):
        raise ValueError("the plain loop runs on CPU in fp32 (trainer=cpu, trainer.precision=32)")
    steps = int(cfg.trainer.max_steps)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("compile", None)
    return {
        "seed": int(cfg.seed),
        "structure": "nanogpt" if nanogpt_expresses(model) else "attnlab",
        "source": data.source,
        "path": data.get("path"),
        "block_size": int(cfg.model.block_size),
        "batch_size": int(data.batch_size),
        "val_fraction": float(data.val_fraction),
        "val_batches": int(data.val_batches),
        "steps": steps,
        "val_every": min(int(cfg.trainer.val_check_interval), steps),
        "grad_clip": float(cfg.trainer.get("gradient_clip_val") or 0.0),
        "model": model,
        "optim": OmegaConf.to_container(cfg.optim, resolve=True),
    }


def nanogpt_expresses(model: dict) -> bool:
    """Whether nanoGPT's structure (plain_train.NanoGPT: fused c_attn, causal SDPA, learned
    positions) is the same model as this config: then the yardstick is that script, not attnlab's
    GPT in a plain loop."""
    a = model["attention"]
    return (
        a["backend"] == "sdpa"
        and a["scaling"] == "inv_sqrt_d"
        and not a["qk_norm"]
        and a.get("normalize", "softmax") == "softmax"
        and a.get("escape", "none") == "none"
        and not a.get("sink")
        and model["pos_encoding"] == "learned"
        and model.get("n_kv_head") in (None, model["n_head"])
        and model.get("d_k") in (None, model["d_model"] // model["n_head"])
        and not model["attn_only"]
        and not model["dropout"]
        and model["init_std"] != "fan_in"
    )


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return wall, proc


ATTNLAB_TRAIN = ("-m", "attnlab.cli", "train")  # what ``make train`` runs, after the interpreter


def alternated(items: list, rep: int) -> list:
    """The order of the arms in repeat ``rep``: as given, then reversed (A B, B A, A B ...), so a
    drift in the machine's load hits every arm alike over the repeats."""
    return list(items) if rep % 2 == 0 else list(items)[::-1]


def run_attnlab(overrides: list[str], run_dir: Path, command: tuple[str, ...] = ATTNLAB_TRAIN) -> dict:
    """``attnlab train OVERRIDES``, the command ``make train`` runs; wall time and results.json's figures.

    ``command`` replaces ``-m attnlab.cli train`` by a wrapper that runs the same command and
    records more (the longctx bench's ``-m attnlab.tools.bench.longctx --child ... -- train``);
    ``finished_at`` (epoch seconds when the process had exited) dates the wrapper's own stamps.
    """
    wall, _ = timed([sys.executable, *command, *overrides, f"hydra.run.dir={run_dir}"])
    finished_at = time.time()
    results = json.loads((run_dir / "results.json").read_text())
    m = results["metrics"]
    tokens = int(results["config"]["data"]["batch_size"]) * int(results["config"]["model"]["block_size"])
    return {
        "wall_s": wall,
        "median_step_s": tokens / m["perf/tokens_per_s"],
        "val_loss": m.get("val/loss"),
        "steps": int(m.get("step", 0)),
        "kernel": results["attention"].get("kernel"),
        "finished_at": finished_at,
    }


def run_plain(spec: dict, work: Path) -> dict:
    spec_path, out = work / "spec.json", work / "plain.json"
    work.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec))
    wall, _ = timed([sys.executable, "-m", "attnlab.tools.bench.plain_train", str(spec_path), str(out)])
    data = json.loads(out.read_text())
    return {
        "wall_s": wall,
        "median_step_s": data["median_step_s"],
        "val_loss": data["val_loss"],
        "steps": data["steps"],
        "setup_s": data["setup_s"],
        "loop_s": data["loop_s"],
    }


def end_to_end(
    arms: dict[str, list[str]], repeats: int, extra: list[str] = (), log: Callable[[str], None] = print
) -> dict:
    """Per arm (name -> overrides): the attnlab command and the plain script, alternated; wall and per-step ratios."""
    samples = {name: {"attnlab": [], "plain": []} for name in arms}
    specs = {name: plain_spec([*overrides, *extra]) for name, overrides in arms.items()}
    load = [list(os.getloadavg())]
    with tempfile.TemporaryDirectory(prefix="attnlab-e2e-") as tmp:
        for rep in range(repeats):
            order = [(name, side) for name in arms for side in ("attnlab", "plain")]
            for name, side in alternated(order, rep):
                work = Path(tmp) / f"r{rep}-{name}-{side}"
                if side == "attnlab":
                    sample = run_attnlab([*arms[name], *extra], work)
                else:
                    sample = run_plain(specs[name], work)
                samples[name][side].append(sample)
                log(
                    f"  e2e rep {rep + 1}/{repeats} {name} {side}: {sample['wall_s']:.1f} s, "
                    f"step {sample['median_step_s'] * 1e3:.1f} ms, val/loss {sample['val_loss']:.4f}"
                )
            load.append(list(os.getloadavg()))
    rows = []
    for name, overrides in arms.items():
        a, p = samples[name]["attnlab"], samples[name]["plain"]
        wall = paired_ratios([s["wall_s"] for s in a], [s["wall_s"] for s in p])
        step = paired_ratios([s["median_step_s"] for s in a], [s["median_step_s"] for s in p])
        aw, pw = median_and_range([s["wall_s"] for s in a]), median_and_range([s["wall_s"] for s in p])
        rows.append(
            {
                "arm": name,
                "overrides": list(overrides) + list(extra),
                "steps": specs[name]["steps"],
                "attnlab_wall_s": aw["median"],
                "attnlab_wall_range": [aw["min"], aw["max"]],
                "plain_wall_s": pw["median"],
                "plain_wall_range": [pw["min"], pw["max"]],
                "wall_ratio": wall["median"],
                "wall_ratio_range": [wall["min"], wall["max"]],
                "step_ratio": step["median"],
                "step_ratio_range": [step["min"], step["max"]],
                "attnlab_step_ms": median_and_range([s["median_step_s"] * 1e3 for s in a])["median"],
                "plain_step_ms": median_and_range([s["median_step_s"] * 1e3 for s in p])["median"],
                "val_loss": {"attnlab": [s["val_loss"] for s in a], "plain": [s["val_loss"] for s in p]},
                "kernel": a[0]["kernel"] if a else None,
                "samples": samples[name],
            }
        )
    return {"repeats": repeats, "rows": rows, "load": load, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
