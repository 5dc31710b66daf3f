"""The GPT model; it calls attnlab.attention and knows no backend."""

from attnlab.model.gpt import GPT, AttentionConfig, GPTConfig

__all__ = ["GPT", "GPTConfig", "AttentionConfig"]
