"""Callbacks that measure what attention does inside the model and what it costs."""

from .attention_maps import AttentionMaps
from .attention_stats import AttentionStats
from .gradients import QKGradNorms
from .guard import NonFiniteError, NonFiniteGuard
from .memory import PeakMemoryMonitor

__all__ = ["AttentionMaps", "AttentionStats", "NonFiniteError", "NonFiniteGuard", "PeakMemoryMonitor", "QKGradNorms"]
