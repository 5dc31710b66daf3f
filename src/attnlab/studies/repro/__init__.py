"""Reproduce and check every claim of the two source articles (sources.ARTICLES: A and B, cited by title).

``python -m attnlab.studies.repro --mode fast|full`` writes reports/repro/{repro.json, repro.md, *.png}
(fast: reports/repro/fast/). One module per theme: numerics (1-3, 9, 10), equivalence (4, 5), masks
(7, 11), memory (6, 14, 15), streaming (16), judge and training (8, 12, 13); verdict holds the checks and
the verdict rule, report renders repro.json through templates/.
"""

from .verdict import Check, Claim, Table

__all__ = ["Check", "Claim", "Table"]
