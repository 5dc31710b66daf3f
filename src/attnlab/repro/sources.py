"""The two source articles and where in them each claim is made.

Both are Chinese blog articles. The report names them by title and translation once, then by the
short label, so each claim can be traced to a section without another document.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Article:
    label: str  # the short name the report uses
    title: str  # the original title
    english: str  # its translation
    note: str = ""


ARTICLES = {
    "A": Article("A", "《Attention 的数学推导》", "The mathematics of attention", "chapter 10 of a series"),
    "B": Article(
        "B",
        "《从零推导 Self-Attention：为什么是 QKV，为什么要除以 √d》",
        "Deriving self-attention from scratch: why Q, K and V, and why divide by √d",
    ),
}

# claim id -> where it is made: (article label, section) pairs. Section names follow the article's own
# headings (A: sections, numbered experiments and self-test questions; B: sections).
WHERE: dict[int, tuple[tuple[str, str], ...]] = {
    1: (("A", "experiment 1"),),
    2: (("A", "§3.1, saturation table"),),
    3: (("A", "experiment 1, second table"),),
    4: (("A", "experiment 2"),),
    5: (("A", "experiment 3"),),
    6: (("A", "question 4"),),
    7: (("A", "§3.3 and question 3"), ("B", "§3")),
    8: (("A", "§3.1 and question 1"), ("B", "§2")),
    9: (("B", "§2"),),
    10: (("B", "§2"),),
    11: (("B", "§3"),),
    12: (("B", "§4, head table"),),
    13: (("B", "§4"),),
    14: (("B", "§5"),),
    15: (("B", "§5"),),
    16: (("B", "§4, on streaming inference"),),
}


def where(claim_id: int) -> str:
    """'A, experiment 1' or 'A, §3.3 and question 3; B, §3'; '' for a claim not listed."""
    return "; ".join(f"{label}, {section}" for label, section in WHERE.get(claim_id, ()))
