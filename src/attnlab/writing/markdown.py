"""Markdown tables for every report (sweep tables, repro claims, head types): one writer, so cells
are escaped and columns aligned the same way everywhere. Imports nothing heavy: the head analysis
writes its table at the end of training."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence, rows: Iterable[Sequence], align: str = "") -> str:
    """A GitHub Markdown table. Cells are ``str()``-ed (floats too: format them first) and a ``|``
    inside a cell is escaped. ``align``: one letter per column, ``l`` or ``r`` (default ``l``)."""

    def line(cells: Sequence) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "".join("---:|" if align[i : i + 1] == "r" else "---|" for i in range(len(header)))
    return "\n".join([line(header), rule, *(line(row) for row in rows)])
