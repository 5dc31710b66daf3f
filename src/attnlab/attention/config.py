"""The attention's config: ``AttentionConfig`` and ``LatentConfig``, each field with its type,
its default, what it accepts and a doc line, and the checks that read only the config.

It is its own module because it is what the schema, the config gate, interop and the model all
read, while attention/module.py is the computation: reading the config does not need the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.attention.backends import BACKENDS
from attnlab.attention.masks import MASK_FILLS
from attnlab.attention.normalizations import NORMALIZATIONS
from attnlab.attention.scaling import SCALINGS
from attnlab.attention.sink import ESCAPES
from attnlab.util.errors import ConfigError
from attnlab.util.fields import Check, checked, choice, int_at_least, optional_positive_int

GATES = ("none", "headwise", "elementwise")


def _mask_fill_ok(v) -> bool:
    if v in MASK_FILLS:
        return True
    try:
        return float(v) < 0
    except (TypeError, ValueError):
        return False


MASK_FILL = Check(_mask_fill_ok, "one of " + ", ".join(MASK_FILLS) + " (or another negative number)")


def optional_int(value, key: str, low: int) -> int | None:
    """``value`` as an int >= low, or None; anything else is a one-line error naming ``key``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}={value!r}; expected null or an integer >= {low}")
    return value


@dataclass
class LatentConfig:
    """``model.attention.latent``: multi-head latent attention (MLA, DeepSeek-V2). Keys and values
    are expanded per head from one latent of ``d_c`` per token; a decoupled RoPE key of ``d_rope``,
    shared by the heads, carries the positions (each head's query gets a RoPE part of that size);
    the KV cache holds the latent and the RoPE key, (d_c + d_rope) values per token and layer."""

    d_c: int | None = checked(
        None,
        optional_positive_int,
        "MLA: the latent per token that keys and values are expanded from (and the cache holds); null: no latent",
        axis=True,
    )
    d_rope: int = checked(
        0,
        int_at_least(0, "an integer >= 0 (> 0 exactly with model.pos_encoding=rope)"),
        "MLA: the decoupled RoPE key, shared by the heads, and each head's RoPE query part",
        axis=True,
    )
    d_cq: int | None = checked(
        None,
        optional_positive_int,
        "MLA: a query latent (queries expanded from it); null: queries from the input",
        axis=True,
    )


@dataclass
class AttentionConfig:
    """``model.attention``, the schema: how each head turns its layer input into its output. The
    config checks (``Schema.from_cfg``), the doc's key table and the W&B grouping axes (every field is
    one) are derived from these fields. The defaults here are the source; conf/model/tiny.yaml repeats
    them so a composed config shows every key, and tests/test_schema.py keeps the two equal."""

    backend: str = choice("scaled", BACKENDS, "the kernel; the attention= group sets it with its default scaling")
    scaling: str = choice("inv_sqrt_d", SCALINGS, "the factor s in s * q.k")
    qk_norm: bool = choice(False, (False, True), "LayerNorm on q and k per head")
    mask_fill: str = checked(
        "-inf", MASK_FILL, "what masked logits hold: " + ", ".join(MASK_FILLS) + " or another negative number"
    )
    normalize: str = choice(
        "softmax",
        NORMALIZATIONS,
        "how a row of logits becomes weights (attention/normalizations.py); all but softmax on naive and scaled only",
    )
    escape: str = choice("none", ESCAPES, "an escape slot per head: zero_logit (softmax plus one) or learned")
    gate: str = choice(
        "none",
        GATES,
        "a sigmoid gate on each head's output from the layer input: one per head "
        "(headwise) or per channel (elementwise)",
    )
    # window and window_sinks are checked where they are read, in __post_init__ (a ValueError naming the key)
    window: int | None = checked(
        None,
        None,
        "sliding window: each query sees its W most recent keys, itself included; null: every earlier key",
        accepted="null or an integer >= 1",
    )
    window_sinks: int = checked(
        0, None, "with a window, the first k tokens stay visible to every query", accepted="an integer >= 0"
    )
    differential: bool = choice(
        False, (False, True), "the difference of two softmax maps per head, A1 - lambda A2, then a head-wise RMSNorm"
    )
    sink: str | None = checked(
        None, None, "the escape slot's old name, read until the next release", renamed_to="escape", accepted="as escape"
    )
    latent: LatentConfig = field(
        default_factory=LatentConfig, metadata={"doc": "multi-head latent attention (LatentConfig)"}
    )

    def __post_init__(self):
        if isinstance(self.latent, dict):
            self.latent = LatentConfig(**self.latent)
        if self.sink is not None:  # the old key (checkpoints and configs written before the rename)
            self.escape, self.sink = self.sink, None
        for key, accepted in (("normalize", NORMALIZATIONS), ("escape", ESCAPES), ("gate", GATES)):
            if getattr(self, key) not in accepted:
                raise ValueError(f"model.attention.{key}={getattr(self, key)!r}; expected one of {', '.join(accepted)}")
        self.window = optional_int(self.window, "model.attention.window", 1)
        self.window_sinks = optional_int(self.window_sinks, "model.attention.window_sinks", 0) or 0
        if self.window_sinks and self.window is None:
            raise ValueError(
                f"model.attention.window_sinks={self.window_sinks} needs model.attention.window; "
                "expected window_sinks=0 or a window"
            )


def latent_refusal(cfg: AttentionConfig, n_head: int, n_kv_head: int | None, pos_encoding: str) -> ConfigError | None:
    """Why ``model.attention.latent`` cannot build with the rest of the config (a ConfigError
    naming the key), or None."""
    lat = cfg.latent
    if lat.d_c is None:
        if lat.d_rope or lat.d_cq is not None:
            return ConfigError("model.attention.latent.d_c", None, "a positive integer with latent.d_rope or d_cq set")
        return None
    key = "model.attention.latent.d_c"
    if n_kv_head not in (None, n_head):  # the latent is the one shared key/value state; each head expands its own
        return ConfigError("model.n_kv_head", n_kv_head, f"null or model.n_head={n_head} with {key} set")
    if cfg.differential or cfg.qk_norm:
        name = "differential" if cfg.differential else "qk_norm"
        return ConfigError(f"model.attention.{name}", True, f"false with {key} set")
    if (pos_encoding == "rope") != (lat.d_rope > 0):  # positions enter only through the decoupled RoPE part
        return ConfigError(
            "model.attention.latent.d_rope", lat.d_rope, "a positive integer with model.pos_encoding=rope, else 0"
        )
    return None


def kv_values_per_token(cfg: AttentionConfig, n_kv_head: int, d_k: int) -> int:
    """What one layer's KV cache holds per token, in values: the latent and the RoPE key with
    latent attention (d_c + d_rope), else the n_kv_head keys and values of d_k (2 x n_kv_head x d_k)."""
    if cfg.latent.d_c is not None:
        return cfg.latent.d_c + cfg.latent.d_rope
    return 2 * n_kv_head * d_k
