"""A study's report from its data: the tables as rows of text, then one Jinja2 template per output
(templates/ablation.md.j2, templates/index.html.j2) that lays out the answer, the attention-free
level, the figure, the main table and the detail below; summary.json carries the same data for code."""

from __future__ import annotations

import re
from pathlib import Path

from attnlab.attention.stats import table_stats
from attnlab.data.tasks import QUERY_CLASSES
from attnlab.util import significance
from attnlab.writing.pages import TEMPLATES, k_of_n_text, label, mean_ci, p_text, plain, short, signed_ci, where

MAIN_METRICS = ("val/loss", "val/acc", "val/copy/acc", "val/bigram/loss", "heads/repeat_acc", "heads/in_context_score")
MAIN_METRICS += ("heads/induction_control_max", "heads/induction_max", "mem/kv_cache_bytes_per_token")
# Throughput and peak memory measure the machine the runs shared (other jobs, threads), not the model.
MACHINE_METRICS = {"perf/tokens_per_s": 1.0, "mem/peak_bytes": 1 / 2**20}
LAYER = re.compile(r"^(attn|heads)/L(\d+)/(.+)$")
LAYER_STATS = [*table_stats(QUERY_CLASSES), "previous_token_max", "sink_max", "induction_max"]
LAYER_STATS += ["induction_knockout_all_heads"]
# the figure of a study's question, where it has its own: the onsets, the LR grid, the d_k curve, the sink
FIGURES = ("onset.png", "lr_sensitivity.png", "val_loss_vs_dk.png", "sink_formation.png")


def table(columns: list[str], rows: list[list[str]], title: str | None = None) -> dict:
    return {"title": title, "columns": columns, "rows": rows}


def varies(cells, key: str) -> bool:
    return len({round(m, 12) for c in cells if (m := c.mean(key)) is not None}) > 1


def main_table(cells, axes: list[str], level: float | None, learned=None) -> dict:
    """Per cell the run-level metrics some run logged, each mean [95 % interval: t, or a percentile bootstrap
    for a bounded metric]; a metric whose value is the same in every cell is left out (it says nothing about
    the axes). ``learned``: a learned or onset study's ``(question, k of n per cell)``, shown first, beside
    any mean: its runs are bimodal, and the mean alone hides how many learned."""
    keys = [
        k for k in MAIN_METRICS if k == "val/loss" and any(c.mean(k) is not None for c in cells) or varies(cells, k)
    ]
    rows = [
        [*(c.axes[a] for a in axes), f"{c.n_ok}" + (f", FAILED {c.n_failed}" if c.n_failed else "")]
        + ([learned_of(c, learned)] if learned else [])
        + [mean_ci(c.mean(k), c.interval(k)) for k in keys]
        for c in cells
    ]
    if level is not None and "val/loss" in keys:
        rows.append(
            [
                "attention-free (bigram)",
                *[""] * (len(axes) - 1),
                "-",
                *(f"{level:.3f}" if k == "val/loss" else "-" for k in keys),
            ]
        )
    learned_column = ["learned (k of n)"] if learned else []
    if learned and level is not None and "val/loss" in keys:
        rows[-1].insert(len(axes) + 1, "-")
    return table([*map(short, axes), "seeds", *learned_column, *map(label, keys)], rows)


def learned_of(cell, question) -> str:
    """k of n: the cell's runs that learned (an onset not censored, or the first metric at question.learned)."""
    if question.outcome == "onset":
        values = cell.samples.get("onset/censored")
        k = None if values is None else int((values == 0).sum())
    else:
        values = cell.samples.get(question.metrics[0])
        k = None if values is None or question.learned is None else int((values >= question.learned).sum())
    return "-" if k is None else f"{k} of {len(values)}"


def comparisons_table(family) -> dict:
    rows = [
        [
            f"{short(c.axis)}: {c.level} vs {c.reference}",
            c.where,
            f"{c.n[0]}, {c.n[1]}",
            mean_ci(c.ref_mean, c.ref_interval),
            mean_ci(c.level_mean, c.level_interval),
            signed_ci(c.diff, *(c.test.lo, c.test.hi) if c.test_name == "Welch" else (None, None)),
            c.test_name,
            p_text(c.test.p if c.test else None),
            p_text(c.exact.p if c.exact else None),
            p_text(c.p_holm),
            plain(c.detectable) if c.detectable is not None else "-",
            c.verdict if c.untested_because is None else f"untested: {c.untested_because}",
        ]
        for c in family
    ]
    header = ["comparison", "where", "seeds", "reference", "level", "difference [95 % CI]", "deciding test"]
    header += ["p (Welch)", "p (exact)", "p (Holm)", "detectable (80 % power)", "verdict"]
    return table(header, rows, label(family[0].metric))


def pooled_table(effects: list[dict]) -> dict:
    rows = [
        [
            short(e["axis"]),
            f"{e['level']} vs {e['reference']}",
            str(e["strata"]),
            signed_ci(e["diff"], *(e["test"].lo, e["test"].hi) if e["test"] else (None, None)),
            p_text(e["test"].p if e["test"] else None),
            p_text(e["p_holm"]),
            "untested"
            if e["test"] is None
            else "none"
            if e["p_holm"] >= significance.ALPHA
            else ("higher" if e["diff"] > 0 else "lower"),
        ]
        for e in effects
    ]
    return table(
        ["axis", "level vs reference", "strata", "pooled difference [95 % CI]", "p", "p (Holm)", "verdict"], rows
    )


def layer_tables(cells, axes: list[str]) -> list[dict]:
    """One table per per-layer statistic, a column per layer (with one layer: one table, a column per statistic)."""
    found: dict[str, dict[int, str]] = {}
    for key in dict.fromkeys(k for c in cells for k in (*c.samples, *c.summaries)):
        if (m := LAYER.match(key)) and m.group(3) in LAYER_STATS:
            found.setdefault(m.group(3), {})[int(m.group(2))] = key
    found = {s: found[s] for s in LAYER_STATS if s in found}
    rows = lambda keys: [
        [*(c.axes[a] for a in axes), *(mean_ci(c.mean(k), c.interval(k)) for k in keys)] for c in cells
    ]  # noqa: E731
    if not found:
        return []
    layers = 1 + max(i for keys in found.values() for i in keys)
    if layers == 1:
        return [table([*map(short, axes), *found], rows([keys[0] for keys in found.values()]))]
    return [
        table(
            [*map(short, axes), *(f"L{i}" for i in range(layers))],
            rows([keys.get(i, "-") for i in range(layers)]),
            stat,
        )
        for stat, keys in found.items()
    ]


def machine_table(cells, axes: list[str]) -> dict | None:
    keys = [k for k in MACHINE_METRICS if any(c.mean(k) is not None for c in cells)]
    if not keys:
        return None
    rows = [
        [
            *(c.axes[a] for a in axes),
            str(c.n_ok),
            *(mean_ci(c.mean(k), c.interval(k), MACHINE_METRICS[k]) for k in keys),
        ]
        for c in cells
    ]
    return table([*map(short, axes), "seeds", *map(label, keys)], rows)


def per_seed_table(frame, axes: list[str], keys: list[str]) -> dict:
    keys = [k for k in keys if k in frame]
    rows = [
        [*(str(r[a]) for a in axes), str(r["seed"]), str(r["run"]), r["status"], *(plain(r[k], 4) for k in keys)]
        for _, r in frame.iterrows()
    ]
    return table([*map(short, axes), "seed", "run", "status", *map(label, keys)], rows)


def head_types_table(frame, axes: list[str]) -> dict | None:
    """Per cell and layer, the mean number of heads of each type per seed (with the seeds that have one where
    not all do), from the final head analysis (attnlab.analysis.heads.head_type)."""
    columns = [c for c in frame.columns if c.startswith("head_type/")]
    if not columns:
        return None
    layers = 1 + max(int(c.split("/")[1][1:]) for c in columns)
    rows = []
    for key, group in frame.groupby(axes, sort=False) if axes else [((), frame)]:
        group = group.dropna(subset=columns, how="all")
        if group.empty:
            continue
        cells, some = [], []
        for i in range(layers):
            parts = []
            for col in (c for c in columns if c.startswith(f"head_type/L{i}/")):
                counts = group[col].fillna(0)
                if counts.sum():
                    having = int((counts > 0).sum())
                    kind = col.rsplit("/", 1)[1]
                    parts.append(
                        f"{kind} {counts.mean():.3g}"
                        + (f" ({having}/{len(counts)} seeds)" if having < len(counts) else "")
                    )
                    if having < len(counts):
                        some.append(f"L{i} {kind}: {k_of_n_text(having, len(counts))}")
            cells.append(", ".join(parts) or "-")
        key = key if isinstance(key, tuple) else (key,)
        rows.append([where(dict(zip(axes, key))), *cells, "; ".join(some) or "-"])
    return table(["cell", *(f"L{i}" for i in range(layers)), "types in some seeds only"], rows) if rows else None


def phase_table(frame, axes: list[str]) -> dict | None:
    if "phase/measured" not in frame or frame["phase/step"].isna().all():
        return None
    rows = []
    for key, group in frame[frame["phase/measured"] == 1].groupby(axes, sort=False) if axes else [((), frame)]:
        reached = sorted(group["phase/step"].dropna())
        key = key if isinstance(key, tuple) else (key,)
        span = [f"{reached[len(reached) // 2]:g}", f"{reached[0]:g}-{reached[-1]:g}"] if reached else ["-", "-"]
        rows.append([where(dict(zip(axes, key))), k_of_n_text(len(reached), len(group)), *span])
    return table(["cell", "seeds that reach it", "step: median", "step: range"], rows)


def lr_tables(arms, context_free: float | None) -> list[dict]:
    """Per arm: sensitivities [95 % t interval], best and critical rate; per size: the largest logit per layer."""
    top = max(max(a.lrs) for a in arms)
    rows = []
    for a in arms:
        full, upper = a.per_seed(), a.per_seed(upper=True)
        critical = a.critical_lr(context_free)
        rows.append(
            [
                f"{a.size_label or '-'} ({a.params / 1e6:.2g}M)" if a.params else a.size_label or "-",
                a.label,
                *(
                    mean_ci(*significance.t_interval(v)[:1], significance.t_interval(v)[1:] if len(v) > 1 else None)
                    for v in (full, upper)
                ),
                str(len(full)),
                f"{a.best_lr:g}",
                f"{a.mean_loss(a.best_lr):.3f}",
                f"{critical:g}" if critical is not None else f"> {max(a.lrs):g}",
                f"{a.mean_loss(max(a.lrs)):.3f}",
                str(sum(a.failed.values())),
            ]
        )
    header = ["size (non-embedding parameters)", "arm", "LR sensitivity [95 % CI]", "above the best rate [95 % CI]"]
    header += ["seeds", "best lr", "best loss", "critical lr", f"loss at lr {top:g}", "failed runs"]
    out = [table(header, rows, "per arm")]
    for size in dict.fromkeys(a.size_label for a in arms):
        group = [a for a in arms if a.size_label == size]
        lrs = sorted({lr for a in group for lr in a.lrs})
        logits = [
            [f"{lr:g}", *(" / ".join(plain(v, 1) for v in a.logits.get(lr) or []) or "-" for a in group)] for lr in lrs
        ]
        out.append(
            table(["lr", *(a.label for a in group)], logits, f"largest attention logit per layer, {size or 'all'}")
        )
    return out


def figures(out: Path, metric: str = "val/loss") -> list[Path]:
    """The report's figures, the question's first: the study's own plot, else its primary ``metric`` against
    an axis, else the val loss against one."""
    pngs = sorted(out.glob("*.png"))
    lead = [p for name in FIGURES for p in pngs if p.name == name]
    for name in dict.fromkeys([metric, "val/loss"]):
        lead += [p for p in pngs if p.name.startswith(f"{name.replace('/', '_')}_vs_")]
    return list(dict.fromkeys([*lead, *pngs]))


def render(view: dict) -> dict[str, str]:
    pages = {name: TEMPLATES.get_template(f"{name}.j2").render(**view) for name in ("ablation.md", "index.html")}
    pages["ablation.md"] = re.sub(r"\n{3,}", "\n\n", pages["ablation.md"]).strip() + "\n"
    return pages
