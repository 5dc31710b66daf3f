"""The GPT model; it calls attnlab.attention and knows no backend."""

from .gpt import GPT, AttentionConfig, GPTConfig

__all__ = ["GPT", "GPTConfig", "AttentionConfig"]
