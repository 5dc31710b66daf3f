"""The bench's latent_train section: a latent attention training step against multi-head attention's
at kv_frontier's shape, checked against the target (at most ``TARGET_RATIO`` times its step time).

The model is conf/experiment/kv_frontier.yaml's (2 attention-only layers, d_model 128, 4 heads of 32,
RoPE, fan_in init, block 64, batch 32, vocabulary 32); each latent arm is one of its variant files
(conf/variant/mla_dc*.yaml, read for their ``model`` block: the arms the study trains). A step is
the plain loop's (forward, cross-entropy, backward, clipping, AdamW) on seeded random batches, on
the study's kernel (conf/train.yaml's attention=scaled);
the arms alternate within every repeat (the order flips each repeat) and each ratio is taken within
a repeat.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import yaml

from attnlab.model.gpt import GPT, GPTConfig
from attnlab.tools.bench.timing import against_target, synchronize

TARGET_RATIO = 1.3
VARIANTS = Path(__file__).resolve().parents[4] / "conf" / "variant"
LATENT_ARMS = ("mla_dc128", "mla_dc64", "mla_dc32")
SHAPE = dict(n_layer=2, n_head=4, d_model=128, block_size=64, vocab_size=32, attn_only=True)
SHAPE_FIXED = dict(pos_encoding="rope", init_std="fan_in")
BATCH = 32
LATENT_TRAIN = {
    "full": dict(steps=40, warmup=5, repeats=5),
    "fast": dict(steps=8, warmup=2, repeats=2),  # fast mode keeps the whole bench near 3 minutes
    "tiny": dict(steps=3, warmup=1, repeats=2, arms=("mla_dc64",)),
}


def variant_model(name: str, variants: Path = VARIANTS) -> dict | None:
    """The ``model`` block of conf/variant/<name>.yaml, or None when the file is absent."""
    path = variants / f"{name}.yaml"
    return (yaml.safe_load(path.read_text()) or {}).get("model", {}) if path.is_file() else None


def _config(change: dict, backend: str) -> GPTConfig:
    change = dict(change)
    attention = {"backend": backend, **change.pop("attention", {})}
    return GPTConfig(**{**SHAPE, **SHAPE_FIXED, **change}, attention=attention)


def _steps(model, opt, batches, device) -> float:
    """Seconds of one training step per batch, over ``batches``."""
    synchronize(device)
    t0 = time.perf_counter()
    for x, y in batches:
        logits, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    synchronize(device)
    return (time.perf_counter() - t0) / len(batches)


def latent_train_section(
    steps: int,
    warmup: int,
    repeats: int,
    arms: tuple[str, ...] = LATENT_ARMS,
    backend: str = "scaled",
    device: torch.device | str = "cpu",
    variants: Path = VARIANTS,
    log=print,
) -> dict:
    """Per arm: median seconds per step and, against multi-head attention's, the median and range
    of the per-repeat ratios and the verdict against TARGET_RATIO (``timing.against_target``)."""
    device = torch.device(device)
    load_before = os.getloadavg()[0]
    changes, missing = {"mha": {}}, []
    for name in arms:
        change = variant_model(name, variants)
        if change is None:
            missing.append(name)
        else:
            changes[name] = change
    models, opts = {}, {}
    for name, change in changes.items():
        torch.manual_seed(0)
        models[name] = GPT(_config(change, backend)).to(device).train()
        opts[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SHAPE["vocab_size"], (steps + warmup, BATCH, SHAPE["block_size"] + 1), generator=gen)
    batches = [(b[:, :-1].to(device), b[:, 1:].to(device)) for b in ids]
    names = list(models)
    seconds = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            _steps(models[n], opts[n], batches[:warmup], device)
            seconds[n].append(_steps(models[n], opts[n], batches[warmup:], device))
    rows = []
    for n in names:
        ratios = [a / m for a, m in zip(seconds[n], seconds["mha"])]
        lat = models[n].cfg.attention.latent
        rows.append(
            {
                "arm": n,
                "d_c": lat.d_c,
                "d_rope": lat.d_rope,
                "d_cq": lat.d_cq,
                "parameters": sum(p.numel() for p in models[n].parameters()),
                "step_s": seconds[n],
                "step_ms": 1e3 * statistics.median(seconds[n]),
                "ratio_to_mha": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "verdict": against_target(min(ratios), max(ratios), TARGET_RATIO),
            }
        )
        log(f"  latent_train {n}: {rows[-1]['step_ms']:.1f} ms/step, {rows[-1]['ratio_to_mha']:.2f}x mha's")
    return {
        "setup": {
            **SHAPE,
            **SHAPE_FIXED,
            "batch_size": BATCH,
            "backend": backend,
            "steps": steps,
            "warmup": warmup,
            "repeats": repeats,
            "target_ratio": TARGET_RATIO,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "load_avg_1m": [load_before, os.getloadavg()[0]],
        },
        "rows": rows,
        "missing": missing,
    }
