"""Callbacks that measure what attention does inside the model and what it costs."""

from attnlab.callbacks.attention_maps import AttentionMaps
from attnlab.callbacks.attention_stats import AttentionStats
from attnlab.callbacks.gradients import QKGradNorms
from attnlab.callbacks.guard import NonFiniteError, NonFiniteGuard
from attnlab.callbacks.peak_memory import PeakMemoryMonitor

__all__ = ["AttentionMaps", "AttentionStats", "NonFiniteError", "NonFiniteGuard", "PeakMemoryMonitor", "QKGradNorms"]
