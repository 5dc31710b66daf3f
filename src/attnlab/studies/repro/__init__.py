"""Reproduce and check every claim of the two source articles (sources.ARTICLES: A and B, cited by title).

``python -m attnlab.studies.repro --mode fast|full`` writes reports/repro/{repro.md, repro.json, *.png}.
One module per theme: numerics (1-3, 9, 10), equivalence (4, 5), masks (7, 11), memory (6, 14, 15),
jacobian and training (8, 10, 12, 13); verdict holds the shared result shape, report renders it.
"""

from .memory import cpu_peak_bytes
from .report import readme_section
from .verdict import Claim, Finding, Table

__all__ = ["Claim", "Finding", "Table", "cpu_peak_bytes", "readme_section"]
