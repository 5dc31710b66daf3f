"""The ablation table as Markdown, CSV and HTML."""

from __future__ import annotations

import csv
import html
import io

from ...attention.stats import table_stats
from ...data.tasks import QUERY_CLASSES
from .aggregate import RUN_METRICS, Cell

LABELS = {
    "val/loss": "val loss",
    "val/acc": "val acc",
    "perf/tokens_per_s": "tokens/s",
    "mem/peak_bytes": "peak MiB",
    "val/copy/acc": "copy acc",
    "val/bigram/loss": "bigram loss",
    "mem/kv_cache_bytes_per_token": "KV cache B/token",
    "heads/induction_max": "induction (best head)",
}
# a task's metric-mask columns (data=bigram_backcopy), shown when the runs logged them
TASK_METRICS = ("val/copy/acc", "val/bigram/loss")
# shown when their value differs between cells (a study of n_kv_head, say)
COST_METRICS = ("mem/kv_cache_bytes_per_token",)
# Head-analysis columns, shown when the runs logged them (the task studies)
HEAD_METRICS = {
    "heads/repeat_acc": "repeat acc (probe)",
    "heads/in_context_score": "in-context score",
    "heads/induction_control_max": "induction control (best head)",
}
# per layer, the best head's score for each mechanism (the induction circuit's previous-token head in
# layer 0, a sink head) and the knockout of all of a layer's induction edges
HEAD_LAYER_STATS = {
    "previous_token (best head)": "heads/L{i}/previous_token_max",
    "sink (best head)": "heads/L{i}/sink_max",
    "induction (best head)": "heads/L{i}/induction_max",
    "induction_knockout_all_heads": "heads/L{i}/induction_knockout_all_heads",
}
# shown when some run logged them: the escape slot's mass, and the extreme-token metrics of a task
# with query classes (the sinks testbed)
ATTN_LAYER_STATS = {s: f"attn/L{{i}}/{s}" for s in table_stats(QUERY_CLASSES)}  # from the metric registry


def _present(cells: list[Cell], keys) -> list[str]:
    """The keys (metric names or per-layer templates) that some cell has a value for."""
    return [k for k in keys if any(c.mean(k.format(i=0)) is not None for c in cells)]


def _varying(cells: list[Cell], keys) -> list[str]:
    """The metrics whose mean differs between cells."""
    return [k for k in keys if len({c.mean(k) for c in cells} - {None}) > 1]


def run_metrics(cells: list[Cell]) -> list[str]:
    """The run-level columns: the standard ones, then those some run logged or that vary."""
    return [
        *RUN_METRICS,
        *_present(cells, TASK_METRICS),
        *_present(cells, HEAD_METRICS),
        *_varying(cells, COST_METRICS),
    ]


def _layer_columns(cells: list[Cell]) -> dict[str, str]:
    """Per-layer columns: the attention statistics, then the head scores, those that some run logged."""
    return {name: t for name, t in {**ATTN_LAYER_STATS, **HEAD_LAYER_STATS}.items() if _present(cells, [t])}


def html_table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = []
    for r in body:
        cls = ' class="failed"' if any("FAILED" in c for c in r) else ""
        trs.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(trs)}</tbody></table>"


def csv_keys(cells: list[Cell], layers: int) -> list[str]:
    """The metrics the machine-readable outputs carry: run metrics, head metrics and per-layer columns that some run logged."""
    keys = run_metrics(cells)
    return keys + [t.format(i=i) for t in _layer_columns(cells).values() for i in range(layers)]


def csv_text(cells: list[Cell], axes: list[str], layers: int) -> str:
    """Machine-readable: every metric as mean and std columns, one row per cell."""
    keys = csv_keys(cells, layers)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(axes + ["n_ok", "n_failed", "errors"] + [f"{k}_{x}" for k in keys for x in ("mean", "std")])
    for cell in cells:
        errors = " | ".join(sorted({r.results.get("error") or "?" for r in cell.failed}))
        row = [cell.axes[a] for a in axes] + [len(cell.ok_runs), len(cell.failed), errors]
        for k in keys:
            row += [cell.mean(k), cell.std(k)]
        writer.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def read_csv(text: str) -> tuple[list[str], list[list]]:
    """csv_text's output back as (header, rows): a column whose cells all read as numbers holds
    floats, any other column strings (an axis such as init_std mixes 0.02 and fan_in; W&B wants one
    type per column); empty cells are None."""

    def number(cell: str) -> float | None:
        try:
            return float(cell)
        except ValueError:
            return None

    header, *body = list(csv.reader(io.StringIO(text)))
    numeric = [all(c == "" or number(c) is not None for c in column) for column in zip(*body)] if body else []
    return header, [
        [None if c == "" else number(c) if is_num else c for c, is_num in zip(row, numeric)] for row in body
    ]


def read_raw(text: str) -> tuple[list[str], list[list[str]]]:
    """csv_text's output back as (header, rows) of strings, exactly as written."""
    header, *body = list(csv.reader(io.StringIO(text)))
    return header, body
