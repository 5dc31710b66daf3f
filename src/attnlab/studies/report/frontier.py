"""Quality per byte of KV cache (experiment=kv_frontier): each arm's final val loss against the bytes its
cache holds per token of context, and the arms on the Pareto frontier -> frontier.md, frontier.png and
summary.json's ``frontier``.

Read from runs.csv alone: the question's axis (``variant``) and reference arm (multi-head), ``val/loss``,
and the two values the memory callback logs from ``GPTConfig.kv_cache_bytes``:
``mem/kv_cache_bytes_per_token`` at the context ``mem/kv_cache_context`` (the runs' block size, the one
context the report states). A cache of one sequence holds bytes_per_token x T there; sequences per GiB is
2^30 over that (the cache alone, weights and activations aside).

The frontier. Arm b dominates arm a when b's cache holds no more bytes per token (bytes_b <= bytes_a)
and b's mean val loss is lower beyond seed noise: Welch's two-sided test of the pair, Holm-corrected
over every pair of arms, p < 0.05 with b's mean below a's. An arm no other arm dominates is on the
frontier. So a cheaper arm whose loss is higher, or not resolvably lower, leaves the costlier one on
it, and an arm with under two finished seeds can neither dominate nor be dominated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker as ticker
import numpy as np

from attnlab.studies.report import analysis
from attnlab.studies.report.data import axes_of
from attnlab.studies.report.plots import save
from attnlab.util import significance
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import TEMPLATES

STUDIES = ("kv_frontier",)
LOSS, BYTES, CONTEXT = "val/loss", "mem/kv_cache_bytes_per_token", "mem/kv_cache_context"
GIB = 2**30


@dataclass
class Arm:
    name: str
    seeds: int
    loss: tuple[float, float, float]  # mean and its 95 % t interval
    bytes_per_token: float  # at the stated context
    context: int
    vs_reference: significance.Contrast | None = None  # this arm minus the reference arm
    p_holm: float | None = None  # over the arms against the reference
    dominated_by: list[str] = field(default_factory=list)

    @property
    def bytes_per_sequence(self) -> float:
        return self.bytes_per_token * self.context

    @property
    def sequences_per_gib(self) -> float:
        return GIB / self.bytes_per_sequence

    @property
    def on_frontier(self) -> bool:
        return not self.dominated_by


def _one(values, what: str) -> float:
    distinct = sorted(set(values))
    if len(distinct) != 1:
        raise SystemExit(f"attnlab: error: runs.csv: {what} takes {len(distinct)} values {distinct}; expected one")
    return float(distinct[0])


def arms(frame, study: str) -> tuple[list[Arm], str]:
    """The arms of the question's axis, each against the reference and against each other; returns them
    (the reference first, then by bytes) and the reference's name."""
    axes = axes_of(frame)
    question = analysis.question_of(study, axes)
    axis, declared = question.compare[0]
    for column in (axis, LOSS, BYTES, CONTEXT):
        if column not in frame:
            raise SystemExit(
                f"attnlab: error: runs.csv has no {column!r} column; the frontier reads {axis}, {LOSS}, {BYTES}, "
                f"{CONTEXT} (the memory callback logs the last two)"
            )
    for other in axes:
        if other != axis and frame[other].nunique() > 1:
            raise SystemExit(
                f"attnlab: error: runs.csv: {other} takes {frame[other].nunique()} values; expected one beside {axis}"
            )
    cells = analysis.cells_from_runs(frame, [axis], sort=False)
    cells = [c for c in cells if len(c.values(LOSS))]
    ok = frame[frame["status"] == "ok"]
    context = int(_one(ok[CONTEXT].dropna(), CONTEXT))
    reference = analysis.reference_level([c.axes[axis] for c in cells], declared)
    out = [
        Arm(
            c.axes[axis],
            len(c.values(LOSS)),
            significance.t_interval(c.values(LOSS)),
            _one(c.values(BYTES), f"{BYTES} of {axis}={c.axes[axis]}"),
            context,
        )
        for c in cells
    ]
    losses = {c.axes[axis]: c.values(LOSS) for c in cells}
    if reference in losses:
        rest = [a for a in out if a.name != reference]
        for a in rest:
            a.vs_reference = significance.welch(losses[reference], losses[a.name])
        for a, p in zip(rest, significance.holm([a.vs_reference and a.vs_reference.p for a in rest])):
            a.p_holm = p
    pairs = [(a, b, significance.welch(losses[a.name], losses[b.name])) for a, b in combinations(out, 2)]
    for (a, b, test), p in zip(pairs, significance.holm([t and t.p for _, _, t in pairs])):
        if p is None or p >= significance.ALPHA:  # no test (under two seeds a side, no spread) or within noise
            continue
        better, worse = (b, a) if test.diff < 0 else (a, b)  # test.diff: b's mean minus a's
        if better.bytes_per_token <= worse.bytes_per_token:
            worse.dominated_by.append(better.name)
    out.sort(key=lambda a: (a.name != reference, a.bytes_per_token, a.name))
    return out, reference


def primary_intervals(frame, study: str) -> tuple[str, dict[str, tuple[float, float, float]]]:
    """The question's primary metric (the first of question.metrics) per arm: mean and 95 % t interval."""
    question = analysis.question_of(study, axes_of(frame))
    metric, axis = question.metrics[0], question.compare[0][0]
    if metric not in frame:
        return metric, {}
    cells = analysis.cells_from_runs(frame, [axis], sort=False)
    return metric, {c.axes[axis]: significance.t_interval(v) for c in cells if len(v := c.values(metric))}


def plot(found: list[Arm], level: float | None, path: Path, metric: str = LOSS, primary: dict | None = None) -> Path:
    """Against KV bytes per token (log x, sequences per GiB on the top axis): the question's primary ``metric``
    per arm (``primary``: name -> mean and 95 % t interval) where it is not the val loss, then the val loss
    (95 % t interval) with the frontier arms joined and the attention-free level across where known."""
    panels = [metric, LOSS] if primary and metric != LOSS else [LOSS]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    context = found[0].context
    for ax, shown in zip(axes[0], panels):
        values = {a.name: a.loss for a in found} if shown == LOSS else primary
        for a in found:
            if a.name not in values:
                continue
            mean, lo, hi = values[a.name]
            colour = "C0" if a.on_frontier else "0.55"
            ax.errorbar(a.bytes_per_token, mean, yerr=[[mean - lo], [hi - mean]], fmt="o", capsize=3, color=colour)
            ax.annotate(a.name, (a.bytes_per_token, mean), textcoords="offset points", xytext=(5, 4), fontsize=7)
        if shown == LOSS:
            front = sorted((a.bytes_per_token, a.loss[0]) for a in found if a.on_frontier)
            ax.plot(*zip(*front), color="C0", lw=1, label="frontier (on val loss)")
            if level is not None:
                ax.axhline(level, color="k", ls="--", lw=0.9, label=f"attention-free (bigram) {level:.3f}")
            ax.legend(fontsize=7, frameon=False)
        ax.set_xscale("log")
        ax.set_xlabel(f"KV cache bytes per token at T = {context}")
        ax.set_ylabel(f"final {shown} (mean, 95 % t interval)")
        per_gib = lambda b: GIB / (np.maximum(b, 1e-9) * context)  # noqa: E731 - its own inverse; matplotlib probes 0
        top = ax.secondary_xaxis("top", functions=(per_gib, per_gib))
        top.set_xlabel(f"sequences of {context} tokens per GiB of cache", fontsize=8)
        some = ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")  # 2, 5, 20, 50, ...
        for axis in (ax.xaxis, top.xaxis):  # plain numbers, not powers of ten, on both log axes
            axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            axis.set_minor_formatter(some)
        ax.tick_params(axis="x", which="both", labelsize=7)
        top.tick_params(axis="x", which="both", labelsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def write(frame, study: str, level: float | None, out: Path, draw: bool = True) -> dict:
    """frontier.md (and frontier.png) in ``out``; returns summary.json's ``frontier`` entry. Data it
    cannot read ends the report with one line (SystemExit) before anything is written."""
    found, reference = arms(frame, study)
    ref = next((a for a in found if a.name == reference), None)
    untested = level is not None and ref is not None and ref.loss[0] >= level
    if draw:
        plot(found, level, out / "frontier.png", *primary_intervals(frame, study))
    page = TEMPLATES.get_template("frontier.md.j2").render(
        study=study,
        arms=found,
        reference=reference,
        ref=ref,
        context=found[0].context,
        frontier=sorted((a for a in found if a.on_frontier), key=lambda a: a.bytes_per_token),
        level=level,
        untested=untested,
        alpha=significance.ALPHA,
        figure=(out / "frontier.png").is_file(),
    )
    atomic_write_text(out / "frontier.md", re.sub(r"\n{3,}", "\n\n", page).strip() + "\n")
    entry = lambda v: None if v is None or not math.isfinite(v) else v  # noqa: E731
    return {
        "context": found[0].context,
        "reference": reference,
        "on_frontier": [a.name for a in found if a.on_frontier],
        "untested": untested,
        "arms": [
            {
                "arm": a.name,
                "seeds": a.seeds,
                "val_loss": {"mean": a.loss[0], "ci95": [a.loss[1], a.loss[2]]},
                "kv_bytes_per_token": a.bytes_per_token,
                "kv_bytes_per_sequence": a.bytes_per_sequence,
                "sequences_per_gib": a.sequences_per_gib,
                "vs_reference": None
                if a.vs_reference is None
                else {
                    "diff": a.vs_reference.diff,
                    "ci95": [a.vs_reference.lo, a.vs_reference.hi],
                    "p": entry(a.vs_reference.p),
                    "p_holm": a.p_holm,
                },
                "on_frontier": a.on_frontier,
                "dominated_by": a.dominated_by,
            }
            for a in found
        ],
    }
