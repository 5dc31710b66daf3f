"""What every reproduction returns: the checks it made and the verdict they give, as data.

A ``Check`` is one statement of the source held against a measurement: its id (a short slug that tests
and code key on), its name (the statement, in this repository's words), the measured value, the source's figure or the threshold it is held to, and
whether it passed (None: not tested here, ``needs`` says what would test it). The verdict is a
function of the checks alone, so a test can flip a measurement and see it turn; ``RULES`` is the one table
of what each verdict requires, which ``verdict_of`` applies and repro.md and docs/inference.md render.

An interval that straddles its threshold, or a single seed, is an untested check, never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from attnlab.util.files import json_safe
from attnlab.writing.markdown import markdown_table
from attnlab.writing.pages import AGREES, DEPENDS, DIFFERS, PARTLY, UNTESTED

MAIN, DETAIL, MECHANISM = "main", "detail", "mechanism"
ROLES = (MAIN, DETAIL, MECHANISM)
KEPT_DIGITS = 6  # significant digits repro.json keeps; a claim's checks read its measurements at this precision


@dataclass
class Table:
    """A small table for repro.md: the source's figure beside ours, one row per case."""

    title: str
    columns: list[str]  # or one string, the names separated by " | "
    rows: list[list[Any]]
    note: str = ""

    def __post_init__(self):
        if isinstance(self.columns, str):
            self.columns = self.columns.split(" | ")


@dataclass
class Check:
    id: str  # a short slug of the statement, stable when its wording changes; one per statement and claim
    name: str
    measured: Any
    reference: Any
    passed: bool | None
    role: str = MAIN
    condition: str = ""
    needs: str = ""

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"check role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.passed is None and not self.needs:
            raise ValueError(f"check {self.name!r}: an untested check says what would test it (needs)")
        self.passed = None if self.passed is None else bool(self.passed)


# The verdict rules, first match wins; a check's role (main, detail, mechanism) is set where the claim is.
RULES = (
    (DIFFERS, "a main check fails (a statement checked under several conditions: it fails under every one decided)"),
    (
        UNTESTED,
        "no main check fails, but one could not be decided here: one seed, an interval across its threshold, "
        "seeds that cannot reach the test's level, a mechanism that did not form",
    ),
    (DEPENDS, "a main statement checked under several conditions holds under some and fails under others"),
    (PARTLY, "every main check holds, but a detail (a printed figure, a magnitude, a side remark) fails"),
    (AGREES, "every main and detail check holds"),
)
MECHANISM_RULE = (
    "A failing mechanism check (the reason the source gives) can only lower a verdict: agrees becomes partly, "
    "since the outcome holds but not for the stated reason; partly, depends, differs and untested stay."
)


def verdict_of(checks: list[Check]) -> str:
    """The first of RULES the checks meet, then MECHANISM_RULE."""
    verdict = _main_verdict(checks)
    if verdict == AGREES and any(c.passed is False for c in checks if c.role == MECHANISM):
        return PARTLY
    return verdict


def rules_markdown() -> str:
    """RULES and MECHANISM_RULE as the block repro.md and docs/inference.md print."""
    table = markdown_table(["verdict", "when (the first row that applies)"], [[f"**{v}**", w] for v, w in RULES])
    return f"{table}\n\n{MECHANISM_RULE}\n"


def _main_verdict(checks: list[Check]) -> str:
    main = [c for c in checks if c.role == MAIN]
    plain = [c.passed for c in main if not c.condition]
    conditional = [c.passed for c in main if c.condition]
    if False in plain:
        return DIFFERS
    if None in plain:
        return UNTESTED
    if True in conditional and False in conditional:
        return DEPENDS
    if False in conditional:
        return DIFFERS
    if conditional and True not in conditional:
        return UNTESTED
    if any(c.passed is False for c in checks if c.role == DETAIL):
        return PARTLY
    return AGREES


@dataclass
class Claim:
    """One reproduced claim: the statement, where the source's figures are (``source``), the
    measurement the checks read (``measured``), the checks, tables and figures (PNG names)."""

    id: int
    claim: str
    source: Any
    measured: Any
    checks: list[Check]
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    method: str = ""  # how the claim was re-run, in one or two fixed sentences

    @property
    def verdict(self) -> str:
        return verdict_of(self.checks)

    def to_json(self) -> dict:
        return json_safe(
            {
                "id": self.id,
                "claim": self.claim,
                "verdict": self.verdict,
                "method": self.method,
                "checks": [asdict(c) for c in self.checks],
                "tables": [asdict(t) for t in self.tables],
                "figures": self.figures,
                "source": self.source,
                "measured": self.measured,
            },
            digits=KEPT_DIGITS,
        )


def within(source: float, measured: float, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    """True when |measured - source| <= max(abs_tol, rel_tol * |source|); NaN never agrees."""
    if not (math.isfinite(source) and math.isfinite(measured)):
        return source == measured
    return abs(measured - source) <= max(abs_tol, rel_tol * abs(source))


def max_diff(source: Iterable[float], measured: Iterable[float]) -> float:
    """The largest |measured - source| of two equally long sequences."""
    source, measured = list(source), list(measured)
    if len(source) != len(measured):
        raise ValueError(f"{len(source)} source figures but {len(measured)} measured")
    return max((abs(m - s) for s, m in zip(source, measured)), default=0.0)


def printed(
    check_id: str, name: str, source: list[float], measured: list[float], decimals: int, role: str = MAIN
) -> Check:
    """The check that the source's printed figures are what its code prints, read at the source's precision."""
    passed = same_printed(source, measured, decimals)
    return Check(check_id, name, max_diff(source, measured), 0.5 * 10**-decimals, passed, role)


def same_printed(source: Iterable[float], measured: Iterable[float], decimals: int) -> bool:
    """True when every measured value, printed with the source's number of decimals, reads the same."""
    return all(f"{s:.{decimals}f}" == f"{m:.{decimals}f}" for s, m in zip(source, measured, strict=True))
