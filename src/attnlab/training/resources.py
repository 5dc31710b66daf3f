"""Will one training step fit in memory? An estimate made before training, and the message when it will not.

A request far too large (``model.block_size=100000`` asks the CPU allocator for terabytes) should
end in one line naming the key to lower, not in an allocator traceback minutes into a sweep. The
estimate counts what a step keeps alive at its peak: parameters, gradients and the two AdamW
moments, the activations saved for the backward pass, and, for the explicit backends (naive,
scaled), the B x H x T x T attention matrix of each layer. It errs low (it counts the tensors it
knows, not allocator slack), so it refuses only requests that cannot fit; a run that still runs out
of memory ends with the same kind of line (``out_of_memory``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attnlab.attention.backends import EXPLICIT
from attnlab.config.schema import Schema
from attnlab.model.gpt import GPTConfig
from attnlab.util.errors import OutOfMemory
from attnlab.util.files import fmt_bytes

# Activations saved for backward per layer, in units of B x T x d_model (d) and B x T x n_head*d_k
# (inner), read off the model: ln_1 in/out, the block's residual output, ln_2 out, the MLP's fc and
# gelu outputs (4d each) -> 12 d (attn_only: 3 d); q, k, v and the merged heads -> 4 inner.
PER_LAYER_D, PER_LAYER_D_ATTN_ONLY, PER_LAYER_INNER = 12, 3, 4


@dataclass
class StepMemory:
    weights: int  # params + AdamW moments (kept all run)
    grads: int  # filled in as the backward pass frees activations
    activations: int  # saved for backward, without the attention matrices
    attention: int  # the B x H x T x T matrices (explicit backends), saved and transient
    matrix: int  # one layer's matrix, for the message

    @property
    def total(self) -> int:
        return self.weights + max(self.activations + self.attention, self.grads)


def element_bytes(precision: str) -> tuple[int, int]:
    """(bytes per weight, bytes per activation) under a Lightning precision setting."""
    precision = str(precision)
    if precision.startswith("64"):
        return 8, 8
    if precision in ("bf16-true", "16-true"):
        return 2, 2
    if precision.endswith("-mixed"):
        return 4, 2  # autocast: fp32 weights, half-precision matmul outputs
    return 4, 4


def estimate_step(model: GPTConfig, n_params: int, batch: int, precision: str = "32") -> StepMemory:
    """Bytes one training step holds at its peak, from the model's config (block_size, n_layer, ...)."""
    w, a = element_bytes(precision)
    t, n_layer, heads, d = model.block_size, model.n_layer, model.n_head, model.d_model
    inner = heads * model.d_k
    tokens = batch * t
    per_layer = (PER_LAYER_D_ATTN_ONLY if model.attn_only else PER_LAYER_D) * d + PER_LAYER_INNER * inner
    # embeddings and ln_f (2 d); logits, their fp32 log-softmax and its gradient (3 x vocab, fp32)
    activations = tokens * (n_layer * per_layer + 2 * d) * a + 3 * tokens * model.vocab_size * 4
    matrix = 0
    attention = 0
    if model.attention.backend in EXPLICIT:
        matrix = batch * heads * t * t * 4  # softmax runs in fp32, also under autocast
        kept = 1 + (1.5 if model.dropout > 0 else 0)  # probs (+ dropout output, its mask, slack)
        attention = int(matrix * (n_layer * kept + 1))  # + the gradient in flight in the backward pass
    weights = n_params * 3 * w  # params, AdamW exp_avg and exp_avg_sq
    return StepMemory(weights, n_params * w, activations, attention, matrix)


def cgroup_limit() -> int | None:
    """Bytes left under this container's memory limit (cgroup v2 or v1), or None if unlimited."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 1 << 60:
                return None
            return int(limit) - int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
    return None


def available_bytes(device: torch.device) -> int | None:
    """Memory a run may still take on ``device``: free CUDA memory, or available RAM (None if unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free = None
    try:
        import psutil

        free = psutil.virtual_memory().available
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
        except OSError:
            pass
    limit = cgroup_limit()
    if limit is not None:
        free = limit if free is None else min(free, limit)
    return free


def what_to_lower(cfg: Schema, step: StepMemory) -> str:
    backend = cfg.model.attention.backend
    if step.attention >= max(step.activations, step.weights):
        return (
            f"lower model.block_size or data.batch_size, or use attention=sdpa or attention=flash "
            f"(attention={backend} keeps a {fmt_bytes(step.matrix)} T x T matrix per layer)"
        )
    if step.activations >= step.weights + step.grads:
        return "lower data.batch_size or model.block_size (or model.n_layer, model.d_model)"
    return "lower model.d_model or model.n_layer"


def check_fits(cfg: Schema, n_params: int, vocab_size: int, device: torch.device, processes: int = 1) -> StepMemory:
    """Raise OutOfMemory when the estimate for one step exceeds what ``device`` has available."""
    step = estimate_step(
        replace(cfg.model, vocab_size=vocab_size), n_params, cfg.data.batch_size, cfg.trainer.precision
    )
    available = available_bytes(device)
    need = step.total * processes  # CPU DDP: the processes share the machine's RAM
    if available is not None and need > available:
        parts = f"params and AdamW {fmt_bytes(step.weights)}, activations {fmt_bytes(step.activations)}" + (
            f", attention matrices {fmt_bytes(step.attention)}" if step.attention else ""
        )
        who = f" x {processes} processes" if processes > 1 else ""
        raise OutOfMemory(
            f"model.block_size={cfg.model.block_size} with data.batch_size={cfg.data.batch_size} does not fit: "
            f"one training step needs about {fmt_bytes(need)}{who} ({parts}), {device.type} has "
            f"{fmt_bytes(available)} available; {what_to_lower(cfg, step)}"
        )
    return step


def is_out_of_memory(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "DefaultCPUAllocator" in text or "out of memory" in text.lower()


def out_of_memory(err: BaseException, cfg: Schema | None, step: int | None, estimate: StepMemory | None) -> OutOfMemory:
    """One line for an allocator failure met during the run (``cfg`` is read only with an ``estimate``)."""
    text = str(err)
    asked = re.search(r"tried to allocate (\d+) bytes", text) or re.search(
        r"Tried to allocate ([\d.]+ [KMGT]i?B)", text
    )
    size = (fmt_bytes(int(asked.group(1))) if asked.group(1).isdigit() else asked.group(1)) if asked else None
    when = f" at step {step}" if step is not None else ""
    said = f" (an allocation of {size} failed)" if size else ""
    est = f"; the estimate before training was {fmt_bytes(estimate.total)}" if estimate is not None else ""
    lower = (
        what_to_lower(cfg, estimate)
        if estimate is not None
        else "lower data.batch_size or model.block_size, or use attention=sdpa"
    )
    return OutOfMemory(f"out of memory{when}{said}{est}; {lower}")
