"""LightningDataModules: real text, and generated attention tasks."""

from .text import CharTokenizer, TextDataModule

__all__ = ["CharTokenizer", "TextDataModule"]
