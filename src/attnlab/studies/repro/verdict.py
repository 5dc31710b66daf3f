"""Claims, tables and verdicts: the common shape every reproduction returns.

A verdict takes one of five values, each with a ``reason`` built from the measurement (the source's
statements checked, each marked as holding or not):
``agrees``; ``partly`` (the main claim holds, a detail differs: the reason names it); ``depends``
(holds under one condition, not another: the reason names both); ``differs``; and ``untested``
(what this budget or machine cannot test, a mechanism that did not form included: the reason says
what would test it). A two-valued verdict would call an untested claim wrong, or a claim with a
wrong detail right. How much and why goes in ``detail``. Numbers are compared with explicit
tolerances, chosen per claim from the precision the source prints.

A ``Finding`` is what the summary table prints: one or two sentences a reader can quote, saying what
was found with its key numbers. Its wording is selected by the measurements, and ``choices`` records
which way each selection went, so a test can flip a measurement and see the sentence's verdict flip.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...results import json_safe

AGREES, PARTLY, DEPENDS, DIFFERS, UNTESTED = "agrees", "partly", "depends", "differs", "untested"
VERDICTS = (AGREES, PARTLY, DEPENDS, DIFFERS, UNTESTED)


@dataclass
class Table:
    """A small table for repro.md: the source's figure beside ours, one row per case."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass(frozen=True)
class Finding:
    """A claim's summary sentence. ``choices``: each measured outcome the sentence depends on (a bool, or
    the name of the branch taken); ``numbers``: the figures it quotes."""

    text: str
    choices: dict[str, Any] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.text.strip():
            raise ValueError("a finding needs its sentence")


def either(flag, yes: str, no: str) -> str:
    """The clause that matches a measured outcome; both are written, the measurement picks one."""
    return yes if flag else no


@dataclass
class Claim:
    """One reproduced claim. ``source``/``measured`` hold the key figures (JSON-safe)."""

    id: int
    claim: str
    source: Any
    measured: Any
    verdict: str
    reason: (
        str  # the source's statements as graded: which hold, which do not, what would test the rest (or the condition)
    )
    detail: str
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # PNG file names, relative to the output dir
    finding: Finding | None = None  # the summary sentence; the reason stands in where a claim has none

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        if not self.reason.strip():
            raise ValueError(f"claim {self.id}: a {self.verdict!r} verdict needs its reason")

    @property
    def summary(self) -> str:
        return self.finding.text if self.finding is not None else self.reason

    def to_json(self) -> dict:
        """``reason``: the summary sentence (what readers and the W&B table quote); ``checked``: the source's
        statements as graded; ``finding``: which way each measured choice went."""
        return {
            "id": self.id,
            "claim": self.claim,
            "source": json_safe(self.source, digits=6),
            "measured": json_safe(self.measured, digits=6),
            "verdict": self.verdict,
            "reason": self.summary,
            "checked": self.reason,
            "finding": json_safe(
                {"choices": self.finding.choices, "numbers": self.finding.numbers} if self.finding else {}, digits=6
            ),
            "detail": self.detail,
        }


def within(source: float, measured: float, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    """True when |measured - source| <= max(abs_tol, rel_tol * |source|); NaN never agrees."""
    if not (math.isfinite(source) and math.isfinite(measured)):
        return source == measured
    return abs(measured - source) <= max(abs_tol, rel_tol * abs(source))


def compare(source: Iterable[float], measured: Iterable[float], abs_tol: float = 0.0, rel_tol: float = 0.0):
    """Element-wise check of two equally long sequences -> (all agree, max |diff|, max relative diff)."""
    source, measured = list(source), list(measured)
    if len(source) != len(measured):
        raise ValueError(f"{len(source)} source figures but {len(measured)} measured")
    diffs = [abs(m - s) for s, m in zip(source, measured)]
    rels = [d / abs(s) if s else (0.0 if d == 0 else math.inf) for s, d in zip(source, diffs)]
    ok = all(within(s, m, abs_tol, rel_tol) for s, m in zip(source, measured))
    return ok, max(diffs, default=0.0), max(rels, default=0.0)


def same_printed(source: Iterable[float], measured: Iterable[float], decimals: int) -> bool:
    """True when every measured value, printed with the source's number of decimals, reads the same."""
    return all(f"{s:.{decimals}f}" == f"{m:.{decimals}f}" for s, m in zip(source, measured, strict=True))


def _join(names) -> str:
    return "; ".join(names)


def sort_parts(main: dict[str, bool | str], details: dict[str, bool | str] | None = None) -> dict:
    """The parts by outcome: held and failed main statements, failed details, and the untested ones (main and
    detail) with what would test them."""
    details = details or {}
    return {
        "held": [k for k, v in main.items() if not isinstance(v, str) and v],
        "failed": [k for k, v in main.items() if not isinstance(v, str) and not v],
        "failed_details": [k for k, v in details.items() if not isinstance(v, str) and not v],
        "untested_main": {k: v for k, v in main.items() if isinstance(v, str)},
        "untested": {k: v for k, v in {**main, **details}.items() if isinstance(v, str)},
    }


def verdict_of(parts: dict) -> str:
    """A failing main part -> differs; else an untested main part -> untested; else a failing detail -> partly; else agrees."""
    return (
        DIFFERS
        if parts["failed"]
        else UNTESTED
        if parts["untested_main"]
        else PARTLY
        if parts["failed_details"]
        else AGREES
    )


def grade(main: dict[str, bool | str], details: dict[str, bool | str] | None = None) -> tuple[str, str]:
    """(verdict, reason) of a claim from its parts. A part's value is True (holds), False (fails) or a
    string (untested here: the string says what would test it). ``main``: the statements the claim
    stands on; ``details``: figures or side remarks that can be wrong while the main claim holds.

    A failing main part -> differs; else an untested main part -> untested; else a failing detail ->
    partly; else agrees (an untested detail is named in the reason, it does not change the verdict)."""
    parts = sort_parts(main, details)
    fail, held, bad_detail = parts["failed"], parts["held"], parts["failed_details"]
    untested = "; ".join(f"{k} ({v})" for k, v in parts["untested"].items())
    verdict = verdict_of(parts)
    also = (f" Holds: {_join(held)}." if held else "") + (f" Does not hold: {_join(bad_detail)}." if bad_detail else "")
    if verdict == DIFFERS:
        return DIFFERS, f"Does not hold: {_join(fail + bad_detail)}." + (f" Holds: {_join(held)}." if held else "") + (
            f" Not tested: {untested}." if untested else ""
        )
    if verdict == UNTESTED:
        return UNTESTED, f"Not tested here: {untested}.{also}"
    if verdict == PARTLY:
        return PARTLY, f"Holds: {_join(held)}. Does not hold: {_join(bad_detail)}." + (
            f" Not tested: {untested}." if untested else ""
        )
    return AGREES, f"Holds: {_join(held)}." + (f" Not tested: {untested}." if untested else "")


def depends(statement: str, holds_when: str, fails_when: str) -> tuple[str, str]:
    """(depends, reason): ``statement`` holds under one measured condition and not under another."""
    return DEPENDS, f"{statement} {holds_when}; not {fails_when}."


def fmt(x, digits: int = 4) -> str:
    """A number for a table cell: fixed for ordinary sizes, scientific for tiny or huge ones."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return "-" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) < 10 ** -(digits - 1) or abs(x) >= 1e6):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"
