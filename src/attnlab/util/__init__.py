"""Shared by every layer: the errors that end a run in one line, and peak tensor memory of a piece of work."""
