"""A study as runs: its multirun (``attnlab sweep``, resumable) and, before the compute, its plan (``attnlab plan``)."""
