"""Validate a composed config before anything runs: one line per bad key, naming what is accepted."""

from __future__ import annotations

from dataclasses import fields

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.attention import AttentionConfig
from attnlab.attention.backends import EXPLICIT
from attnlab.attention.config import latent_refusal
from attnlab.config.schema import rules
from attnlab.util.errors import ConfigError
from attnlab.util.fields import Check

WANDB_MODES = ("offline", "online", "disabled")

# One check per declared key, from the schema (attnlab.config.schema: each field's accepted values); the
# cross-key checks below stay as code.
RULES: list[tuple[str, Check]] = rules()


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


def check_config(cfg: DictConfig, schema: type | None = None) -> None:
    """Raise ConfigError for the first key whose value is not accepted (a renamed key's value is
    checked under its new name); ``schema``: another schema's rules than attnlab.config.schema.Schema's."""
    apply_renamed_keys(cfg)
    for key, (ok, accepted) in RULES if schema is None else rules(schema):
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if not ok(value):
            raise ConfigError(key, value, accepted)
    precision = str(cfg.trainer.get("precision", "32"))
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
    latent = OmegaConf.to_container(attention.get("latent") or {}, resolve=True)
    refusal = latent_refusal(
        AttentionConfig(**{k: v for k, v in attention.items() if k in ("differential", "qk_norm")}, latent=latent),
        cfg.model.n_head,
        n_kv,
        cfg.model.pos_encoding,
    )
    if refusal is not None:
        raise refusal
    if cfg.get("optim", {}).get("qk_clip") is not None:
        if attention.get("qk_norm"):  # a LayerNorm on q and k undoes any rescaling of their projections
            raise ConfigError("optim.qk_clip", cfg.optim.qk_clip, "null with model.attention.qk_norm=true")
        if cfg.model.get("compile"):  # the step's q and k are read from eager forwards
            raise ConfigError("optim.qk_clip", cfg.optim.qk_clip, "null with model.compile=true")
    wandb = cfg.get("logger", {}).get("wandb") if cfg.get("logger") else None
    if wandb is not None and wandb.get("mode") not in WANDB_MODES:
        raise ConfigError("logger.wandb.mode", wandb.get("mode"), "one of " + ", ".join(WANDB_MODES))
