"""Validate a composed config before anything runs: one line per bad key, naming what is accepted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from .analysis.heads import KNOCKOUT
from .attention import MASK_FILLS, AttentionConfig
from .attention.backends import EXPLICIT
from .attention.position import POS_ENCODINGS
from .data.tokens import DTYPES as TOKEN_DTYPES
from .errors import ConfigError
from .module import OPTIMIZERS

PRECISIONS = ("auto", "32", "32-true", "64", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")
WANDB_MODES = ("offline", "online", "disabled")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def one_of(values) -> tuple[Callable, str]:
    return (lambda v: v in values), "one of " + ", ".join(map(str, values))


positive_int = (lambda v: _is_int(v) and v > 0), "a positive integer"
optional_positive_int = (lambda v: v is None or (_is_int(v) and v > 0)), "null or a positive integer"
positive_number = (lambda v: _is_number(v) and v > 0), "a positive number"
non_negative_number = (lambda v: _is_number(v) and v >= 0), "a number >= 0"
probability = (lambda v: _is_number(v) and 0 <= v < 1), "a number in [0, 1)"
boolean = (lambda v: isinstance(v, bool)), "true or false"
init_std = (lambda v: v == "fan_in" or (_is_number(v) and v > 0)), "a positive number or fan_in"


def _mask_fill_ok(v) -> bool:
    if v in MASK_FILLS:
        return True
    try:
        return float(v) < 0
    except (TypeError, ValueError):
        return False


mask_fill = _mask_fill_ok, "one of " + ", ".join(MASK_FILLS) + " (or another negative number)"

# model.attention's rules come from its schema (AttentionConfig's fields and their accepted values)
ATTENTION_RULES = [
    (f"model.attention.{f.name}", boolean if f.type in (bool, "bool") else one_of(f.metadata["choices"]))
    for f in fields(AttentionConfig)
    if "choices" in f.metadata
]

RULES: list[tuple[str, tuple[Callable, str]]] = [
    *ATTENTION_RULES,
    ("model.attention.mask_fill", mask_fill),
    ("model.pos_encoding", one_of(POS_ENCODINGS)),
    ("model.n_layer", positive_int),
    ("model.n_head", positive_int),
    ("model.n_kv_head", optional_positive_int),
    ("model.d_model", positive_int),
    ("model.d_k", optional_positive_int),
    ("model.block_size", positive_int),
    ("model.dropout", probability),
    ("model.init_std", init_std),
    ("model.attn_only", boolean),
    ("data.batch_size", positive_int),
    ("data.val_batches", positive_int),
    (
        "data.dtype",
        (lambda v: v is None or v in TOKEN_DTYPES, "null (meta.json's) or one of " + ", ".join(TOKEN_DTYPES)),
    ),
    ("data.vocab_multiple", optional_positive_int),
    ("trainer.accumulate_grad_batches", optional_positive_int),
    ("trainer.max_steps", positive_int),
    ("trainer.val_check_interval", positive_int),
    ("optim.lr", positive_number),
    ("optim.min_lr", non_negative_number),
    ("optim.warmup_steps", (lambda v: _is_int(v) and v >= 0, "an integer >= 0")),
    ("optim.weight_decay", non_negative_number),
    ("optim.name", one_of(OPTIMIZERS)),
    ("seed", (lambda v: _is_int(v) and v >= 0, "an integer >= 0")),
    ("checkpoint.every_n_steps", positive_int),
    ("checkpoint.keep", (lambda v: _is_int(v) and v >= -1, "an integer >= 0 (0: last.ckpt only), or -1 to keep all")),
    ("memory_check", boolean),
    ("callbacks.heads.knockout", (lambda v: v is None or v in KNOCKOUT, "one of " + ", ".join(KNOCKOUT))),
    (
        "callbacks.heads.max_len",
        (lambda v: v is None or (_is_int(v) and v >= 2), "an integer >= 2 or null (the whole block)"),
    ),
    (
        "callbacks.heads.probe_tokens",
        (lambda v: v is None or (_is_int(v) and v > 0), "a positive integer or null (every probe row)"),
    ),
    (
        "callbacks.attention_stats.max_tokens",
        (lambda v: v is None or (_is_int(v) and v > 0), "a positive integer or null (no bound)"),
    ),
    (
        "callbacks.attention_stats.max_rows",
        (lambda v: v is None or (_is_int(v) and v >= 2), "an integer >= 2 or null (every query)"),
    ),
]


def apply_renamed_keys(cfg: DictConfig) -> list[str]:
    """Move a value set under a renamed key (AttentionConfig's ``renamed_to``) to its new key, and
    return one notice line per key moved (for one release the old names are still read)."""
    notices = []
    for f in fields(AttentionConfig):
        new, old = f.metadata.get("renamed_to"), f"model.attention.{f.name}"
        value = OmegaConf.select(cfg, old, default=None)
        if new and value is not None:
            with open_dict(cfg):
                cfg.model.attention[new], cfg.model.attention[f.name] = value, None
            notices.append(
                f"{old} is now model.attention.{new} (set to {value}); the old key is read until the next release"
            )
    return notices


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first key whose value is not accepted (a renamed key's value is
    checked under its new name)."""
    apply_renamed_keys(cfg)
    for key, (ok, accepted) in RULES:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if not ok(value):
            raise ConfigError(key, value, accepted)
    precision = str(cfg.trainer.get("precision", "32"))
    if precision not in PRECISIONS:
        raise ConfigError("trainer.precision", cfg.trainer.precision, "one of " + ", ".join(PRECISIONS))
    accelerator = cfg.trainer.get("accelerator", "auto")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator", accelerator, "cpu or auto on a machine without CUDA (trainer=cpu)")
    if accelerator == "cpu" and precision.startswith("16"):
        # Lightning would quietly train bf16-mixed instead: no fp16 AMP on CPU
        raise ConfigError("trainer.precision", precision, "32, 64 or bf16-mixed on CPU (16-mixed needs a GPU)")
    if cfg.model.d_k is None and cfg.model.d_model % cfg.model.n_head:
        raise ConfigError(
            "model.d_model",
            cfg.model.d_model,
            f"a multiple of model.n_head={cfg.model.n_head} when model.d_k is null (or set model.d_k)",
        )
    attention = cfg.model.attention
    n_kv = cfg.model.get("n_kv_head")
    if n_kv is not None and cfg.model.n_head % n_kv:
        raise ConfigError(
            "model.n_kv_head", n_kv, f"a divisor of model.n_head={cfg.model.n_head} (1: multi-query), or null"
        )
    if attention.get("normalize", "softmax") != "softmax":
        if attention.backend not in EXPLICIT:
            raise ConfigError(
                "model.attention.normalize",
                attention.normalize,
                f"softmax with attention={attention.backend} (sigmoid runs on {' and '.join(EXPLICIT)})",
            )
        if attention.escape != "none":
            raise ConfigError(
                "model.attention.escape",
                attention.escape,
                "none with model.attention.normalize=sigmoid (an escape slot is a softmax's way out)",
            )
    if cfg.model.pos_encoding == "alibi" and cfg.model.attention.backend == "flash":
        raise ConfigError(
            "model.pos_encoding",
            "alibi",
            "learned, rope or none with attention=flash "
            "(the forced flash kernel takes no bias; alibi runs on naive, scaled and sdpa)",
        )
    d_k = cfg.model.d_k or cfg.model.d_model // cfg.model.n_head
    if cfg.model.pos_encoding == "rope" and d_k % 2:
        raise ConfigError("model.d_k", d_k, "an even head dim with model.pos_encoding=rope")
    measured = [name for name in ("attention_stats", "attention_maps", "heads") if name in (cfg.get("callbacks") or {})]
    if attention.get("differential") and measured:  # they read weights per head; a differential map is signed
        raise ConfigError(
            "model.attention.differential",
            True,
            f"false with callbacks {', '.join(measured)} on, or {' '.join('~callbacks.' + name for name in measured)}",
        )
    wandb = cfg.get("logger", {}).get("wandb") if cfg.get("logger") else None
    if wandb is not None and wandb.get("mode") not in WANDB_MODES:
        raise ConfigError("logger.wandb.mode", wandb.get("mode"), "one of " + ", ".join(WANDB_MODES))
