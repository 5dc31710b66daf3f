"""The config's schema: one dataclass per section attnlab reads, each field with its type, its
default (where Python is the place that holds it), what it accepts and a doc line.

``model`` is ``GPTConfig`` (model/gpt.py) and ``model.attention`` is ``AttentionConfig``
(attention/config.py): the model is built from them, so they are the schema rather than a copy of
it. The other sections are declared here. Fields are made with attnlab.util.fields' ``checked`` and
``choice``; a field without a default (``REQUIRED``) takes its value from conf/, which holds it.

What follows from the schema: ``rules()``, the per-key config checks; ``axis_keys()``, the keys
every run carries as W&B axes (wandb_runs.AXES); ``tools.generated.key_table()``, docs/configuration.md's key table
(a test keeps the two equal); and ``Schema.from_cfg``, the one gate a composed config passes before
anything runs (every per-key check, then the checks across keys, ``Schema.check``: one line per bad
key, naming what is accepted) and the typed view train() reads. A checked key absent from the
composed config is checked as null (so a key with a check must be set in conf/); the typed view
gives an absent key its field's default. ``model.vocab_size`` (``from_data``) is the data module's,
not a config key.

Why a field walk rather than Hydra's ConfigStore or ``OmegaConf.structured``: ``data``, the
callbacks and the loggers are ``_target_`` blocks that Hydra instantiates, with keys that differ
per option, and experiments add keys freely; a structured config in the defaults list would make
the composed config strict (unknown keys refused, values typed) and change what composes. The
schema instead reads the keys it declares from the composed DictConfig and ignores the rest, so
composition stays exactly Hydra's; only the model's sections, built field by field, refuse a key they
do not declare (``unknown_keys``), since it would be dropped unread.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import cache

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from attnlab.attention.backends import EXPLICIT
from attnlab.attention.config import AttentionConfig, LatentConfig, latent_refusal
from attnlab.attention.normalizations import fused_names, normalization
from attnlab.data.tokens import DTYPES as TOKEN_DTYPES
from attnlab.model.gpt import GPTConfig
from attnlab.util.errors import ConfigError
from attnlab.util.fields import (
    REQUIRED,
    Check,
    boolean,
    checked,
    choice,
    field_check,
    int_at_least,
    non_negative_number,
    optional_positive_int,
    positive_int,
    positive_number,
)

KNOCKOUT = ("final", "always", "never")  # when the head-analysis callback measures induction_knockout

OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("auto", "32", "32-true", "64", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")
WANDB_MODES = ("offline", "online", "disabled")
non_negative_int = int_at_least(0)


@dataclass(kw_only=True)
class DataConfig:
    """``data``: the keys attnlab checks; the block is the data module's arguments (instantiated)."""

    batch_size: int = checked(REQUIRED, positive_int, "sequences per micro-batch (per process)")
    val_batches: int = checked(REQUIRED, positive_int, "batches per validation")
    dtype: str | None = checked(
        None,
        Check(lambda v: v is None or v in TOKEN_DTYPES, "null (meta.json's) or one of " + ", ".join(TOKEN_DTYPES)),
        "data=tokens: the token files' integer type",
    )
    vocab_multiple: int | None = checked(
        None, optional_positive_int, "data=tokens: the model's vocabulary rounded up to a multiple of this"
    )


@dataclass(kw_only=True)
class TrainerConfig:
    """``trainer``: the keys attnlab checks and reads; the block is Lightning's Trainer's arguments."""

    max_steps: int = checked(REQUIRED, positive_int, "optimizer steps")
    val_check_interval: int = checked(REQUIRED, positive_int, "steps between validations (clipped to max_steps)")
    accumulate_grad_batches: int | None = checked(
        1, optional_positive_int, "micro-batches per optimizer step (tokens per step = k x batch x block)"
    )
    # str() first: YAML's 32 is an int, Lightning takes either
    precision: str | int = checked(
        32,
        Check(lambda v: str(v) in PRECISIONS, "one of " + ", ".join(PRECISIONS)),
        "Lightning's precision",
        axis=True,
    )
    accelerator: str = checked(
        REQUIRED, None, "Lightning's accelerator (gpu is refused without CUDA)", accepted="cpu, gpu, cuda or auto"
    )
    strategy: str = checked(
        "auto", None, "Lightning's strategy (ddp: a process per device)", accepted="a strategy name"
    )
    devices: int | str | list[int] = checked(
        1, None, "devices per node (processes under ddp)", accepted="a count, a list of ids, -1 or auto"
    )
    num_nodes: int = checked(1, None, "nodes", accepted="a positive integer")
    enable_progress_bar: bool = checked(True, boolean, "the one-line progress display")
    profiler: str | None = checked(
        None, None, "Lightning's profiler; null: none, at the least cost per step", accepted="null or a profiler name"
    )


@dataclass(kw_only=True)
class OptimConfig:
    """``optim``: conf/train.yaml holds every value for a run. ``name`` and ``momentum`` also have a
    default here, which a module's saved hyperparameters without those keys fall back to."""

    lr: float = checked(REQUIRED, positive_number, "the peak learning rate", axis=True)
    min_lr: float = checked(REQUIRED, non_negative_number, "the learning rate the cosine decays to")
    warmup_steps: int = checked(REQUIRED, non_negative_int, "linear warmup steps")
    weight_decay: float = checked(REQUIRED, non_negative_number, "decoupled weight decay on matrices (not on vectors)")
    betas: list[float] = checked(REQUIRED, None, "AdamW's betas", accepted="two numbers in [0, 1)")
    name: str = choice("adamw", OPTIMIZERS, "the optimizer: adamw, or sgd with momentum (betas unused)", axis=True)
    momentum: float = checked(0.9, None, "sgd only: its momentum", accepted="a number")
    qk_clip: float | None = checked(
        None,
        Check(lambda v: v is None or positive_number.ok(v), "null or a positive number"),
        "QK-clip: after each step, a head whose largest logit passed this is rescaled to it; null: off",
        axis=True,
    )


@dataclass(kw_only=True)
class CheckpointConfig:
    """``checkpoint``: read by the checkpoint callback's block (callbacks/default.yaml interpolates them)."""

    every_n_steps: int = checked(REQUIRED, positive_int, "last.ckpt cadence in steps; also saved at the end")
    keep: int = checked(
        REQUIRED,
        int_at_least(-1, "an integer >= 0 (0: last.ckpt only), or -1 to keep all"),
        "`step<N>.ckpt` files kept beside last.ckpt, which resume=true falls back to",
    )


@dataclass(kw_only=True)
class HeadsCallbackConfig:
    """``callbacks.heads``: HeadAnalysis's arguments (its signature and the YAML hold the defaults)."""

    knockout: str | None = checked(
        REQUIRED,
        Check(lambda v: v is None or v in KNOCKOUT, "one of " + ", ".join(KNOCKOUT)),
        "when induction_knockout is measured",
    )
    max_len: int | None = checked(
        REQUIRED,
        int_at_least(2, "an integer >= 2 or null (the whole block)", optional=True),
        "the probe's length cap",
    )
    probe_tokens: int | None = checked(
        REQUIRED,
        int_at_least(1, "a positive integer or null (every probe row)", optional=True),
        "each probe's rows: at most this many tokens",
    )


@dataclass(kw_only=True)
class AttentionStatsCallbackConfig:
    """``callbacks.attention_stats``: AttentionStats's arguments (its signature and the YAML hold the defaults)."""

    max_tokens: int | None = checked(
        REQUIRED,
        int_at_least(1, "a positive integer or null (no bound)", optional=True),
        "probe tokens measured at most",
    )
    max_rows: int | None = checked(
        REQUIRED,
        int_at_least(2, "an integer >= 2 or null (every query)", optional=True),
        "query positions measured per sequence",
    )


@dataclass(kw_only=True)
class CallbacksConfig:
    """``callbacks``: each an instantiated block; absent with callbacks=none."""

    heads: HeadsCallbackConfig | None = checked(None, None, "the head analysis (callbacks/heads.yaml)")
    attention_stats: AttentionStatsCallbackConfig | None = checked(
        None, None, "the attention statistics (callbacks/default.yaml)"
    )


@dataclass(kw_only=True)
class WandbLoggerConfig:
    """``logger.wandb``: the keys attnlab reads; the block is the W&B logger's arguments (instantiated)."""

    mode: str | None = checked(
        "offline",
        Check(lambda v: v is None or v in WANDB_MODES, "one of " + ", ".join(WANDB_MODES)),
        "offline (no account, no network), online, or disabled (no W&B files)",
    )
    group: str | None = checked(None, None, "the W&B group; null: run_group, else the study", accepted="null or a name")
    name: str | None = checked(
        None, None, "the W&B run name; null: the axes the run sets, then its seed", accepted="null or a name"
    )
    tags: list[str] = checked([], None, "tags beside the run's own (each axis it sets, its sweep)", accepted="a list")


@dataclass(kw_only=True)
class LoggersConfig:
    """``logger``: each an instantiated block; attnlab reads the W&B one's identity and mode."""

    wandb: WandbLoggerConfig | None = checked(None, None, "the W&B logger (logger/wandb.yaml); absent: no W&B run")


@dataclass(kw_only=True)
class Schema:
    """The composed config, as far as attnlab reads it (``Schema.from_cfg(cfg)``)."""

    model: GPTConfig = checked(REQUIRED, None, "the model (GPTConfig)")
    data: DataConfig = checked(REQUIRED, None, "the data module")
    trainer: TrainerConfig = checked(REQUIRED, None, "Lightning's Trainer")
    optim: OptimConfig = checked(REQUIRED, None, "the optimizer and its schedule")
    seed: int = checked(REQUIRED, non_negative_int, "seeds torch, Python, NumPy and the data", axis=True)
    checkpoint: CheckpointConfig = checked(REQUIRED, None, "checkpoint cadence and rotation")
    memory_check: bool = checked(
        True, boolean, "refuse, before training, a run whose estimated memory exceeds the device's"
    )
    callbacks: CallbacksConfig | None = checked(None, None, "the measurement callbacks", instantiated=True)
    logger: LoggersConfig | None = checked(None, None, "the experiment loggers")
    study: str = checked(
        "adhoc", None, "the study a run belongs to: its sweep dir, report dir and W&B group", accepted="a name"
    )
    run_group: str | None = checked(None, None, "the W&B group; null: the study", accepted="null or a name")
    tf32: bool = checked(True, None, "CUDA: fp32 matmuls may use TF32; false: full fp32", accepted="true or false")
    resume: bool = checked(
        False, None, "continue `<hydra.run.dir>/checkpoints/last.ckpt`, same W&B run", accepted="true or false"
    )
    ckpt_path: str | None = checked(
        None, None, "continue from this checkpoint file, into a new run dir", accepted="null or a file"
    )

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> Schema:
        """The gate and the typed view of a composed config: ConfigError for the first key whose
        value is not accepted, each key's own check first (``rules``), then the checks across keys
        (``check``); else each declared key read once (a key absent from ``cfg`` takes its field's
        default). Instantiated blocks and undeclared keys stay in ``cfg``. A renamed key is read
        under its new name once ``apply_renamed_keys`` has moved it, which the caller does once."""
        unknown_keys(cfg, cls)
        for key, (ok, accepted) in rules(cls):
            value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
            if not ok(value):
                raise ConfigError(key, value, accepted)
        typed = _build(cls, cfg, "")
        typed.check()
        return typed

    def check(self) -> None:
        """The checks across keys: ConfigError for the first combination attnlab does not accept."""
        model, attention = self.model, self.model.attention
        precision = str(self.trainer.precision)
        accelerator = self.trainer.accelerator
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise ConfigError("trainer.accelerator", accelerator, "cpu or auto on a machine without CUDA (trainer=cpu)")
        if accelerator == "cpu" and precision.startswith("16"):
            # Lightning would quietly train bf16-mixed instead: no fp16 AMP on CPU
            raise ConfigError("trainer.precision", precision, "32, 64 or bf16-mixed on CPU (16-mixed needs a GPU)")
        if model.n_head % model.n_kv_head:
            raise ConfigError(
                "model.n_kv_head",
                model.n_kv_head,
                f"a divisor of model.n_head={model.n_head} (1: multi-query), or null",
            )
        norm = normalization(attention.normalize)
        if not norm.fused and attention.backend not in EXPLICIT:
            raise ConfigError(
                "model.attention.normalize",
                attention.normalize,
                f"{' or '.join(fused_names())} with attention={attention.backend} "
                f"({attention.normalize} runs on {' and '.join(EXPLICIT)})",
            )
        if not norm.takes_escape and attention.escape != "none":
            raise ConfigError(
                "model.attention.escape",
                attention.escape,
                f"none with model.attention.normalize={attention.normalize} (an escape slot is a softmax's way out)",
            )
        if model.pos_encoding == "alibi" and attention.backend == "flash":
            raise ConfigError(
                "model.pos_encoding",
                "alibi",
                "learned, rope or none with attention=flash "
                "(the forced flash kernel takes no bias; alibi runs on naive, scaled and sdpa)",
            )
        if model.pos_encoding == "rope" and model.d_k % 2:
            raise ConfigError("model.d_k", model.d_k, "an even head dim with model.pos_encoding=rope")
        if (refusal := latent_refusal(attention, model.n_head, model.n_kv_head, model.pos_encoding)) is not None:
            raise refusal
        if self.optim.qk_clip is not None:
            if attention.qk_norm:  # a LayerNorm on q and k undoes any rescaling of their projections
                raise ConfigError("optim.qk_clip", self.optim.qk_clip, "null with model.attention.qk_norm=true")
            if model.compile:  # the step's q and k are read from eager forwards
                raise ConfigError("optim.qk_clip", self.optim.qk_clip, "null with model.compile=true")
        if self.logger is not None and self.logger.wandb is not None and self.logger.wandb.mode is None:
            raise ConfigError("logger.wandb.mode", None, "one of " + ", ".join(WANDB_MODES))


# the sections the model is built from, field by field: a key they do not declare would be dropped unread
MODEL_SECTIONS = (GPTConfig, AttentionConfig, LatentConfig)


def unknown_keys(cfg, cls=None, prefix: str = "") -> None:
    """ConfigError for a key a model section does not declare (``+model.foo=1``), naming the keys it does."""
    cls = cls or Schema
    for f in fields(cls):
        sub, node = section_type(cls, f), cfg.get(f.name) if isinstance(cfg, DictConfig) else None
        if sub is None or not isinstance(node, DictConfig):
            continue
        if issubclass(sub, MODEL_SECTIONS):
            declared = [g.name for g in fields(sub)]
            for key in node:
                if key not in declared:
                    raise ConfigError(
                        f"{prefix}{f.name}.{key}", node.get(key), f"a key of {prefix}{f.name}: " + ", ".join(declared)
                    )
        unknown_keys(node, sub, f"{prefix}{f.name}.")


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


@cache
def type_hints(cls) -> dict[str, typing.Any]:
    """A schema class's field types, evaluated once: each evaluation compiles every annotation
    (they are strings here), and the schema is walked at each process's start (rules, AXES, from_cfg)."""
    return typing.get_type_hints(cls)


def section_type(cls, f) -> type | None:
    """The dataclass a field holds (a section), or None for a plain value."""
    hint = type_hints(cls)[f.name]
    for t in (hint, *typing.get_args(hint)):
        if is_dataclass(t):
            return t
    return None


def has_default(f) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def plain_value(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _build(cls, node, prefix: str):
    kwargs = {}
    for f in fields(cls):
        key = prefix + f.name
        if f.metadata.get("from_data") or f.metadata.get("instantiated"):
            continue
        if node is None or f.name not in node:
            if not has_default(f):
                raise ConfigError(key, None, (field_check(f) or Check(None, "a value")).accepted)
            continue
        value, sub = node[f.name], section_type(cls, f)
        kwargs[f.name] = _build(sub, value, key + ".") if sub is not None and value is not None else plain_value(value)
    return cls(**kwargs)


def walk(cls=Schema, prefix: str = ""):
    """(key, field, owner class) for every leaf of the schema, sections in declaration order."""
    for f in fields(cls):
        if f.metadata.get("from_data"):
            continue
        sub = section_type(cls, f)
        if sub is not None:
            yield from walk(sub, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, cls


@cache
def rules(cls=Schema) -> list[tuple[str, Check]]:
    """Every key whose field declares what it accepts, with its check (the gate's per-key checks)."""
    return [(key, check) for key, f, _ in walk(cls) if (check := field_check(f)) is not None]


def axis_keys(cls=Schema) -> list[str]:
    """The keys every run carries as W&B axes: each attention field, then each field flagged ``axis``."""
    attention = [key for key, _, owner in walk(cls) if issubclass(owner, AttentionConfig)]
    return attention + [key for key, f, _ in walk(cls) if f.metadata.get("axis")]


def accepted(f) -> str:
    check = field_check(f)
    return check.accepted if check is not None else f.metadata.get("accepted", "")
