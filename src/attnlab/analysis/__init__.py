"""Analyses of trained models: head types (previous-token, induction, sink, positional, ...)."""

from attnlab.analysis.heads import (
    SCORES,
    THRESHOLDS,
    TYPES,
    Probes,
    analyze_heads,
    build_probes,
    head_scores,
    head_type,
    induction_score,
    layer_probs,
    positional_score,
    previous_token_score,
    repeated_probe,
    sink_score,
)
from attnlab.analysis.outputs import HEADS_JSON, HEADS_MD, HEADS_PNG, plot_heads, write_outputs

__all__ = [
    "HEADS_JSON",
    "HEADS_MD",
    "HEADS_PNG",
    "SCORES",
    "THRESHOLDS",
    "TYPES",
    "Probes",
    "analyze_heads",
    "build_probes",
    "head_type",
    "head_scores",
    "induction_score",
    "layer_probs",
    "plot_heads",
    "positional_score",
    "previous_token_score",
    "repeated_probe",
    "sink_score",
    "write_outputs",
]
