"""The significance sections of a committed report, recomputed from its ablation.csv alone.

A study's runs (logs/) need not travel with its report, and re-running a study takes hours. Welch's
test needs only each cell's mean, sample std and seed count, which ablation.csv holds, so the Holm
correction and the pooled per-axis effects can be computed for a committed table without its runs:
each cell is stood in for by n values with exactly its mean and sample std (the test sees only those),
and the report's own functions (scaling_pairs, factor_effects, summary) do the rest. The stand-in
values are never written out: summary.json's per-seed values come from runs only (``make table``).

``python -m attnlab.report --restat reports/<study>`` rewrites that report's "Scaled vs unscaled" and
"Each axis pooled over the others" sections, the * marks of the main table and summary.json's
statistics.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..markdown import markdown_table
from ..results import atomic_write_text
from .aggregate import short
from .significance import (SCALING_AXIS, effects_summary, effects_table, factor_effects, marked_cells, pairs_table, scaling_pairs,
                           summary)
from .tables import read_csv

METRIC = "val/loss"
NOTE = ("Statistics recomputed by `python -m attnlab.report --restat` from ablation.csv's per-cell mean, sample std and seed "
        "count (the runs themselves are not in this checkout; Welch's test needs nothing else). Per-seed values were not "
        "recorded for this table.")


def standins(mean: float, std: float, n: int) -> list[float]:
    """n values whose mean and sample std are exactly ``mean`` and ``std`` (what Welch's test reads)."""
    if n < 2:
        return [mean] * n
    z = [i - (n - 1) / 2 for i in range(n)]
    scale = math.sqrt(sum(x * x for x in z) / (n - 1))
    return [mean + std * x / scale for x in z]


class StatCell:
    """A cell known only by its ablation.csv row: axes, and per metric n stand-in values."""

    def __init__(self, axes: dict[str, str], row: dict):
        self.axes, self.row = axes, row

    def values(self, key: str) -> list[float]:
        mean, std, n = self.row.get(f"{key}_mean"), self.row.get(f"{key}_std"), int(self.row.get("n_ok") or 0)
        return [] if mean is None else standins(mean, std or 0.0, n)

    @property
    def label(self) -> str:
        return ", ".join(f"{short(k)}={v}" for k, v in self.axes.items()) or "all"


def _axis_text(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def stat_cells(report: Path) -> tuple[list[StatCell], list[str]]:
    header, body = read_csv((Path(report) / "ablation.csv").read_text())
    axes = header[: header.index("n_ok")]
    cells = [StatCell({a: _axis_text(v) for a, v in zip(axes, row)}, dict(zip(header, row))) for row in body]
    return cells, axes


def _replace_section(md: str, title: str, body: list[str]) -> str:
    """Replace the '## title' section (up to the next '## ' or the plots) with ``body``, or insert it before the plots."""
    block = "\n".join([f"## {title}", "", *body, ""])
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |^!\[|\Z)", re.S | re.M)
    if pattern.search(md):
        return pattern.sub(lambda _: block + "\n", md, count=1)
    plots = re.search(r"^!\[", md, re.M)
    at = plots.start() if plots else len(md)
    return md[:at] + block + "\n" + md[at:]


def _marks(md: str, axes: list[str], marked: set[tuple]) -> str:
    """The main table's ' *' after a scaled cell's val loss, set from ``marked`` (significance.marked_cells)."""
    out = []
    for line in md.split("\n"):
        cols = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cols) > len(axes) + 1 and cols[len(axes)].startswith("ok"):
            key = tuple(sorted(zip(axes, cols[: len(axes)])))
            loss = cols[len(axes) + 1].removesuffix(" *")
            cols[len(axes) + 1] = loss + (" *" if key in marked else "")
            line = "| " + " | ".join(cols) + " |"
        out.append(line)
    return "\n".join(out)


def _label(axes: dict) -> str:
    return ", ".join(f"{short(k)}={v}" for k, v in axes.items()) or "all"


def _mechanism_sections(md: str, data: dict) -> str:
    """The head-type and phase-change tables from summary.json, with the seeds that form a type or reach the
    phase change as k of n and a Wilson interval (the same functions make table uses)."""
    from . import HEAD_TYPES_NOTE, head_type_seeds, head_type_text, phase_text

    types = [c for c in data.get("head_types", []) if any(c["layers"])]
    if types and "## Head types per layer" in md:
        layers = max(len(c["layers"]) for c in types)
        md = _replace_section(md, "Head types per layer", [HEAD_TYPES_NOTE, "", markdown_table(
            ["cell", *(f"L{i}" for i in range(layers)), "types in some seeds only"],
            [[_label(c["axes"]), *map(head_type_text, c["layers"]),
              "; ".join(f"L{i} {t}" for i, layer in enumerate(c["layers"]) if (t := head_type_seeds(layer))) or "-"] for c in types])])
    phases = [c for c in data.get("phase_change_steps", []) if c["steps"]]
    if "## Phase change" in md and phases:
        intro = md.split("## Phase change", 1)[1].strip().split("\n\n", 1)[0]
        md = _replace_section(md, "Phase change", [intro, "", markdown_table(
            ["cell", "seeds that reach it", "step: median", "step: range"], [[_label(c["axes"]), *phase_text(c["steps"])] for c in phases])])
    return md


def _rewrite_index(report: Path, md: str, pairs, effects) -> None:
    """index.html from the rewritten ablation.md's intro, main table and plots, with the new significance sections."""
    from . import index_html

    lines = md.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    main = [lines[start]] + lines[start + 2:end]  # the header and the rows, not the |---| line
    split = lambda line: [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]  # noqa: E731
    header, body = split(main[0]), [split(line) for line in main[1:]]
    plots = [report / m.group(1) for m in re.finditer(r"^!\[[^\]]*\]\(([^)]+\.png)\)", md, re.M) if (report / m.group(1)).is_file()]
    significance = (summary(pairs) + " " + NOTE, *pairs_table(pairs)) if pairs else None
    pooled = (effects_summary(effects, METRIC) + " " + NOTE, *effects_table(effects)) if effects else None
    atomic_write_text(report / "index.html", index_html(report.name, lines[2], header, body, {}, plots, significance, pooled))


def restat(report: Path) -> dict:
    """Recompute and rewrite the significance of a committed report; returns the new statistics."""
    report = Path(report)
    cells, axes = stat_cells(report)
    pairs = scaling_pairs(cells, axes, METRIC)
    effects = factor_effects(cells, axes, METRIC)
    md = (report / "ablation.md").read_text()
    if pairs:
        md = _replace_section(md, "Scaled vs unscaled", [summary(pairs) + " " + NOTE, "", markdown_table(*pairs_table(pairs))])
        md = _marks(md, axes, marked_cells(pairs))
    if effects:
        md = _replace_section(md, "Each axis pooled over the others", [effects_summary(effects, METRIC) + " " + NOTE, "",
                                                                        markdown_table(*effects_table(effects))])
    summary_path = report / "summary.json"
    data = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    md = _mechanism_sections(md, data)
    atomic_write_text(report / "ablation.md", md)
    _rewrite_index(report, md, pairs, effects)
    data["scaled_vs_unscaled"] = [{"where": p.where, "scaling": p.variant, "diff": p.diff, "n": [len(p.unscaled), len(p.scaled)],
                                   "welch_t": p.test.t if p.test else None, "df": p.test.df if p.test else None,
                                   "p": p.test.p if p.test else None, "p_holm": p.p_holm, "beyond_noise": p.significant} for p in pairs]
    data["pooled_effects"] = [{"axis": e.axis, "level": e.level, "reference": e.reference, "diff": e.diff, "strata": e.strata,
                               "welch_t": e.test.t if e.test else None, "df": e.test.df if e.test else None,
                               "p": e.test.p if e.test else None, "p_holm": e.p_holm, "beyond_noise": e.significant} for e in effects]
    data["statistics_note"] = NOTE
    atomic_write_text(summary_path, json.dumps(data, indent=2))
    return {"pairs": data["scaled_vs_unscaled"], "pooled_effects": data["pooled_effects"], "scaling_axis": SCALING_AXIS in axes}
