"""What the repository says is about the tool, not about how it was built: no page, report, comment
or test speaks of work items, work periods, numbered passes or which machines were borrowed. The
project's history lives in git."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROCESS = re.compile(
    "|".join(
        [
            r"\bissues?\s+#?\d+",  # a work item by number
            r"\b(?:this|that|each|every|next|last|previous|earlier|one|two|three|four|five) stops?\b",
            r"\bstops? \d+\b",
            r"\bthe stop (?:before|after)\b",  # a work period
            r"\b(?:first|second|third|fourth|fifth|sixth|this|that|next|previous|earlier) pass\b(?!(?:es)?\s*(?:through|over|of the))",
            r"\bpass \d+\b",
            r"\b(?:this|that|a|the|earlier|previous|next|helper) session\b",
            r"\b(?:was|were|is|are|been|not|never|no gpu was|the) lent\b",
            r"\blent (?:to|here|machine|gpu|h200)\b",
            r"\b(?:before|after|until) this change\b",
        ]
    ),
    re.IGNORECASE,
)
SCOPES = (
    "README.md",
    "Makefile",
    "docs/**/*.md",
    "reports/**/*.md",
    "reports/**/*.json",
    "reports/**/*.html",
    "src/**/*.py",
    "tests/**/*.py",
    "conf/**/*.yaml",
    "sweeps/**/*.yaml",
)


def files() -> list[Path]:
    found = {p for pattern in SCOPES for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(found - {Path(__file__).resolve()})


def process_words(text: str) -> list[str]:
    return [text[max(0, m.start() - 40) : m.end() + 30].replace("\n", " ") for m in PROCESS.finditer(text)]


def test_the_pattern_catches_process_words_and_spares_ordinary_ones():
    for said in (
        "as issue 24 asks",
        "measured this stop",
        "the stop before",
        "the fourth pass",
        "no GPU was lent",
        "in this session",
        "before this change",
        "two stops before",
        "stop 31",
    ):
        assert process_words(said), said
    for said in (
        'scope="session"',
        "start_new_session=True",
        "the run stops when the loss is non-finite",
        "a single pass over the data",
        "early stopping",
        "two passes of the forward",
        "issues a warning",
        "timer would stop before the GPU does",
    ):
        assert not process_words(said), said


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_how_the_work_was_organised(path):
    hits = process_words(path.read_text(encoding="utf-8", errors="replace"))
    assert not hits, f"{path.relative_to(ROOT)}: {hits}"
