"""attnlab: ablation studies of attention in a small GPT."""

__version__ = "0.1.0"
