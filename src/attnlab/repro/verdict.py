"""Claims, tables and verdicts: the common shape every reproduction returns.

A verdict is binary on purpose ("agrees" | "differs"); how much and why goes in ``detail``.
Numbers are compared with explicit tolerances, chosen per claim from the precision the
source prints (a figure printed to 3 decimals agrees within half a unit of the last digit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..results import json_safe

AGREES, DIFFERS = "agrees", "differs"


@dataclass
class Table:
    """A small table for repro.md: the source's figure beside ours, one row per case."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Claim:
    """One reproduced claim. ``source``/``measured`` hold the key figures (JSON-safe)."""

    id: int
    claim: str
    source: Any
    measured: Any
    verdict: str
    detail: str
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # PNG file names, relative to the output dir

    def __post_init__(self):
        if self.verdict not in (AGREES, DIFFERS):
            raise ValueError(f"verdict must be {AGREES!r} or {DIFFERS!r}, got {self.verdict!r}")

    def to_json(self) -> dict:
        return {
            "id": self.id, "claim": self.claim, "source": json_safe(self.source, digits=6),
            "measured": json_safe(self.measured, digits=6), "verdict": self.verdict, "detail": self.detail,
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


def verdict(ok: bool) -> str:
    return AGREES if ok else DIFFERS


def combine(parts: dict[str, bool]) -> tuple[str, str]:
    """A claim made of several statements agrees only if every part does; names the failing parts."""
    failing = [name for name, ok in parts.items() if not ok]
    return verdict(not failing), ("All parts hold" if not failing else "Failing: " + "; ".join(failing))


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
