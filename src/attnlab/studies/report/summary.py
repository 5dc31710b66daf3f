"""A report's data for code: ablation.csv (per cell every metric's mean, std and interval) and summary.json
(the question, each contrast and effect with its test, per-cell intervals, per-seed values, head types,
phase-change steps and the LR-sensitivity arms), from the same analysis as the pages."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnlab.studies.report import analysis, lr, render
from attnlab.util import significance
from attnlab.writing.pages import TEMPLATES


def cells_csv(cells, axes: list[str]) -> str:
    """ablation.csv: per cell the seed counts and every metric's mean, sample std and 95 % t interval."""
    keys = list(dict.fromkeys(k for c in cells for k in c.samples))
    rows = []
    for c in cells:
        row = {**c.axes, "n_ok": c.n_ok, "n_failed": c.n_failed, "errors": c.errors}
        for k in keys:
            s, ci = c.stats(k), c.interval(k)
            row.update(
                {
                    f"{k}_mean": s and s[0],
                    f"{k}_std": s and s[1],
                    f"{k}_ci95_lo": ci and ci[0],
                    f"{k}_ci95_hi": ci and ci[1],
                }
            )
        rows.append(row)
    return pd.DataFrame(rows).to_csv(index=False)


def _contrast(c) -> dict:
    t = c.test
    return {
        "axis": c.axis,
        "level": c.level,
        "reference": c.reference,
        "where": c.where,
        "where_axes": c.at,
        "diff": c.diff,
        "ci95": [t.lo, t.hi] if t else None,
        "n": list(c.n),
        "df": t.df if t else None,
        "test": c.test_name,
        "p": c.p,
        "p_welch": t.p if t else None,
        "p_exact_min": c.exact.p_min if c.exact else None,
        "p_holm": c.p_holm,
        "detectable": c.detectable,
        "seeds_needed": c.seeds_needed,
        "below_attention_free": c.below,
        "beyond_noise": c.verdict in ("higher", "lower"),
        "verdict": c.verdict,
        "untested_because": c.untested_because,
    }


def summary_json(view: dict, frame, cells, effects, arms, out: Path) -> dict:
    """summary.json's data entries (its keys as other code reads them), from the same analysis as the pages."""
    families, axes = view["families"], view["axes"]
    ok = frame[frame["status"] == "ok"] if frame is not None else None
    data = {
        "runs": view["runs"],
        "cells": len(cells),
        "failed": sum(c.n_failed for c in cells),
        "seeds_per_cell": view["seeds"],
        # a budget's runs are written inside their study's dir; a report dir of its own stands under reports/
        "out": f"reports/{view['study']}/{out.name}" if out.parent.name == view["study"] else f"reports/{out.name}",
        "question": {**vars(view["question"])},
        "headline": " ".join(TEMPLATES.get_template("headline.j2").render(**view).split()),
        "contrasts": {m: [_contrast(c) for c in f] for m, f in families.items()},
        "learning": view["learning"]["summary"] if view.get("learning") else None,
        "interactions": [
            {
                "metric": x.metric,
                "across": x.across,
                "first": x.first,
                "last": x.last,
                "at": x.at,
                "diff": x.test and x.test.diff,
                "ci95": x.test and [x.test.lo, x.test.hi],
                "p": x.test and x.test.p,
                "p_holm": x.p_holm,
                "detectable": x.test and x.test.detectable,
                "verdict": x.verdict,
            }
            for x in view["interactions"]
        ],
        "scaled_vs_unscaled": [
            {**_contrast(c), "scaling": c.level}
            for c in families.get("val/loss", [])
            if c.axis == analysis.SCALING_AXIS
        ],
        "pooled_effects": [
            {
                "axis": e["axis"],
                "level": e["level"],
                "reference": e["reference"],
                "diff": e["diff"],
                "strata": e["strata"],
                "df": e["test"] and e["test"].df,
                "p": e["test"] and e["test"].p,
                "p_holm": e["p_holm"],
                "beyond_noise": e["p_holm"] is not None and e["p_holm"] < significance.ALPHA,
                "ci95": e["test"] and [e["test"].lo, e["test"].hi],
            }
            for e in effects
        ],
        "cells_ci95": [
            {
                "axes": c.axes,
                "n": c.n_ok,
                "metrics": {
                    k: {"mean": c.mean(k), "std": c.stats(k)[1], "ci95": c.interval(k)}
                    for k in render.MAIN_METRICS
                    if c.stats(k)
                },
            }
            for c in cells
        ],
    }
    if ok is not None:
        metrics = [
            m
            for m in frame.columns[list(frame.columns).index("run") + 1 :]
            if not m.startswith(("head_type/", "phase/"))
        ]
        groups = ok.groupby(axes, sort=False) if axes else [((), ok)]
        data["per_seed"], data["head_types"], data["phase_change_steps"] = [], [], []
        for key, rows in groups:
            cell = dict(zip(axes, map(str, key if isinstance(key, tuple) else (key,))))
            data["per_seed"].append(
                {
                    "axes": cell,
                    "runs": [
                        {"seed": r["seed"], "dir": r["run"], "metrics": {m: r[m] for m in metrics if pd.notna(r[m])}}
                        for _, r in rows.iterrows()
                    ],
                }
            )
            kinds = [c for c in frame.columns if c.startswith("head_type/")]
            layers = 1 + max((int(c.split("/")[1][1:]) for c in kinds), default=-1)
            typed = rows.dropna(subset=kinds, how="all") if kinds else rows.iloc[0:0]
            data["head_types"].append(
                {
                    "axes": cell,
                    "layers": [
                        {
                            c.rsplit("/", 1)[1]: [int(v) for v in typed[c].fillna(0)]
                            for c in kinds
                            if c.startswith(f"head_type/L{i}/") and typed[c].fillna(0).any()
                        }
                        for i in range(layers)
                    ],
                }
            )
            if "phase/measured" in rows:
                steps = rows[rows["phase/measured"] == 1]["phase/step"]
                data["phase_change_steps"].append(
                    {"axes": cell, "steps": [None if pd.isna(s) else int(s) for s in steps]}
                )
        data.pop("per_seed_note", None)
    else:
        data["per_seed_note"] = (
            "Per-seed values were not kept for this study: ablation.csv holds each cell's mean, sample std and seed count."
        )
    if arms:
        data["lr_sensitivity"] = {
            "arms": [
                {
                    "size": a.size_label,
                    "arm": a.label,
                    "params_non_embedding": a.params,
                    "initial_loss": a.initial,
                    "seeds": len(a.seeds),
                    "sensitivity_per_seed": a.per_seed(),
                    "upper_sensitivity_per_seed": a.per_seed(upper=True),
                    "best_lr": a.best_lr,
                    "critical_lr": a.critical_lr(view["unigram"]),
                    "loss": {f"{lr_:g}": a.mean_loss(lr_) for lr_ in a.lrs},
                    "max_logit": {f"{lr_:g}": a.logits.get(lr_) for lr_ in a.lrs},
                }
                for a in arms
            ],
            "critical_fraction": lr.CRITICAL_FRACTION,
            "against_source": [
                {"statement": r["statement"], "verdict": r["verdict"], "why": r["why"], "measured": r["measured"]}
                for r in view["source"]
            ],
        }
    return data


def json_default(value):
    if value is pd.NA:  # a run without a seed id
        return None
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(type(value))
