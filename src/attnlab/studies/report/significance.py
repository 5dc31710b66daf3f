"""Re-exports for callers outside the reports (the claims of attnlab.studies.repro); the statistics are
attnlab.studies.stats, the formatting attnlab.studies.report.numbers."""

from ..stats import ALPHA, holm
from .numbers import k_of_n_text
from .numbers import p_text as _p


def _p_clause(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


__all__ = ["ALPHA", "_p", "_p_clause", "holm", "k_of_n_text"]
