"""ablation.csv read back for W&B and the claims (attnlab.studies.repro): a column whose cells all read as
numbers holds floats, any other strings (an axis such as init_std mixes 0.02 and fan_in; W&B wants one type
per column); empty cells are None."""

from __future__ import annotations

import io

import pandas as pd


def read_csv(text: str) -> tuple[list[str], list[list]]:
    frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    columns = {}
    for name, column in frame.items():
        numbers = pd.to_numeric(column.where(column != ""), errors="coerce")
        numeric = not (numbers.isna() & (column != "")).any()
        columns[name] = [None if c == "" else float(n) if numeric else c for c, n in zip(column, numbers)]
    return list(frame.columns), [list(row) for row in zip(*columns.values())] if columns else []
