"""How a config field declares what it accepts, for every schema (attnlab.config.schema, AttentionConfig,
GPTConfig): ``choice(default, choices, doc)`` for a closed set of values, ``checked(default, check,
doc)`` for anything a predicate decides. A ``Check`` pairs that predicate with the phrase a one-line
error says after "expected". The config checks and the configuration doc's key table read this
metadata; nothing here imports the rest of attnlab, so every layer can declare its fields with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any, NamedTuple


class Check(NamedTuple):
    ok: Callable[[Any], bool]
    accepted: str  # the phrase after "expected", e.g. "a positive integer"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def one_of(values, accepted: str | None = None) -> Check:
    return Check(lambda v: v in values, accepted or "one of " + ", ".join(map(str, values)))


def int_at_least(low: int, accepted: str | None = None, optional: bool = False) -> Check:
    """An integer >= low (and None too with ``optional``)."""
    return Check(lambda v: (optional and v is None) or (_is_int(v) and v >= low), accepted or f"an integer >= {low}")


positive_int = int_at_least(1, "a positive integer")
optional_positive_int = int_at_least(1, "null or a positive integer", optional=True)
positive_number = Check(lambda v: _is_number(v) and v > 0, "a positive number")
non_negative_number = Check(lambda v: _is_number(v) and v >= 0, "a number >= 0")
probability = Check(lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)")
boolean = Check(lambda v: isinstance(v, bool), "true or false")

# the default when a field has none: its value comes from conf/ (a preset, a group), never from Python
REQUIRED = MISSING


def checked(default, check: Check | None, doc: str, **metadata):
    """A config field whose value ``check`` accepts (None: the config checks leave it to the code
    that reads it, and ``accepted`` says in words what it takes). ``metadata`` adds flags:
    ``axis=True`` (a W&B axis every run carries), ``from_data=True`` (set by the data module, not
    a config key), ``instantiated=True`` (a block Hydra instantiates: no typed view), ``renamed_to``
    (an old key name, read until the next release)."""
    meta = {"doc": doc, **metadata}
    if check is not None:
        meta["check"] = check
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def choice(default, choices: tuple, doc: str, **metadata):
    """A config field with its accepted values: the config checks and the W&B axes read them here."""
    return field(default=default, metadata={"choices": choices, "doc": doc, **metadata})


def field_check(f) -> Check | None:
    """The check a field declares: its own, or membership of its choices (true or false for a bool)."""
    if "check" in f.metadata:
        return f.metadata["check"]
    if "choices" in f.metadata:
        return boolean if f.type in (bool, "bool") else one_of(f.metadata["choices"])
    return None
