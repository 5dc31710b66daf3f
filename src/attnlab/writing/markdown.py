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


def splice(text: str, name: str, block: str, where: str = "the page") -> str:
    """``text`` with what lies between ``<!-- name:start -->`` and ``<!-- name:end -->`` replaced by ``block``:
    a rendered block inside a hand-written page, so a test can compare it with a fresh render."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{where}: the markers {start} and {end} are missing")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}{end}{tail}"
