"""LightningDataModules: real text, and generated attention tasks."""

from attnlab.data.text import CharTokenizer, TextDataModule

__all__ = ["CharTokenizer", "TextDataModule"]
