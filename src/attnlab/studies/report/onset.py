"""A study whose outcome is learned-or-not (``question.outcome: learned``) or when (``onset``): per arm, k of n
runs learned, and for an onset study the Kaplan-Meier curve of the step they learned at; each arm against the
reference by Fisher's exact test on k of n and, for onsets, the log-rank test, Holm over the arms.

A mean and a t interval describe neither: a run either forms the mechanism or stays on the task's floor, and
a run stopped at its budget unlearned has an onset later than the budget, not at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from attnlab.studies.report.analysis import SweepQuestion, reference_level
from attnlab.studies.report.plots import colours, legend_outside, save  # plots sets the Agg backend
from attnlab.studies.report.render import table as md_table
from attnlab.util import significance
from attnlab.writing.pages import p_text, short, where

ONSET, CENSORED = "onset/step", "onset/censored"
FIGURE = "onset.png"


@dataclass
class Arm:
    """One cell's runs: whether each learned and, for onsets, the step (or the step it was censored at)."""

    axes: dict[str, str]
    learned: np.ndarray  # bool per run
    steps: np.ndarray | None = None  # onset or censoring step per run (onset studies)

    @property
    def k(self) -> int:
        return int(self.learned.sum())

    @property
    def n(self) -> int:
        return len(self.learned)

    @property
    def wilson(self) -> tuple[float, float]:
        return significance.wilson(self.k, self.n)

    @cached_property  # read by the table, the summary, the figure and the caps
    def survival(self) -> significance.Survival | None:
        return None if self.steps is None else significance.kaplan_meier(self.steps, ~self.learned)

    @property
    def restricted_mean(self) -> float | None:
        """The mean step at which runs learned, an unlearned run counting at its cap: the restricted mean onset
        where every run has the same cap; a later or absent onset makes it larger."""
        return None if self.steps is None else float(np.mean(self.steps))


@dataclass
class OnsetComparison:
    axis: str
    level: str
    reference: str
    at: dict[str, str]
    ref: Arm
    arm: Arm
    fisher: significance.Proportions
    p_logrank: float | None = None
    p_holm: float | None = None  # the deciding test's (log-rank for onsets, Fisher for learned), Holm over the arms
    onset: bool = True
    family: int = 1  # comparisons Holm corrects over with this one
    power: float | None = None  # a tie's: the log-rank's power at these runs against the difference they show

    @property
    def p(self) -> float | None:
        if self.onset:
            return None if self.p_logrank is None or math.isnan(self.p_logrank) else self.p_logrank
        return self.fisher.p

    @property
    def test_name(self) -> str:
        return "log-rank" if self.onset else "Fisher"

    @property
    def untested_because(self) -> str | None:
        if self.ref.k == 0:
            return "the reference arm learned in no run"
        if self.p is None:
            return "neither arm learned"
        if not self.onset and self.fisher.p_min >= significance.ALPHA:
            return f"{self.ref.n} and {self.arm.n} runs cannot reach p < {significance.ALPHA} by Fisher's test"
        p_min = significance.logrank_p_min(self.ref.n, self.arm.n) if self.onset else self.fisher.p_min
        if p_min * self.family >= significance.ALPHA:
            return (
                f"not resolved: {self.ref.n} and {self.arm.n} runs cannot reach p < {significance.ALPHA} after Holm "
                f"over {self.family} comparisons ({significance.exact_seeds_for(self.family)} an arm can)"
            )
        if self.power is not None and self.power < significance.POWER:
            return (
                f"not resolved: the log-rank's power against the difference these runs show is {self.power:.2f} "
                f"at {min(self.ref.n, self.arm.n)} an arm"
            )
        return None

    @property
    def verdict(self) -> str:
        """earlier | later (beyond seed noise after Holm) | none | untested."""
        if self.untested_because is not None:
            return "untested"
        if self.p_holm is None or self.p_holm >= significance.ALPHA:
            return "none"
        if self.onset:
            return "later" if self.arm.restricted_mean > self.ref.restricted_mean else "earlier"
        return "fewer" if self.arm.k / self.arm.n < self.ref.k / self.ref.n else "more"

    @property
    def where(self) -> str:
        return where(self.at)


def arms_of(frame: pd.DataFrame, axes: list[str], question: SweepQuestion) -> list[Arm]:
    """Each cell's finished runs as an arm: learned where the run's onset was not censored (onset studies) or
    its final ``metrics[0]`` reached ``question.learned``."""
    ok = frame[frame["status"] == "ok"]
    out = []
    for key, rows in ok.groupby(axes, sort=False) if axes else [((), ok)]:
        key = key if isinstance(key, tuple) else (key,)
        if question.outcome == "onset":
            rows = rows[rows[ONSET].notna() & rows[CENSORED].notna()] if ONSET in rows else rows.iloc[0:0]
            learned = rows[CENSORED].to_numpy(float) == 0 if len(rows) else np.zeros(0, bool)
            steps = rows[ONSET].to_numpy(float) if len(rows) else np.zeros(0)
        else:
            values = rows[question.metrics[0]].dropna().to_numpy(float)
            learned, steps = values >= question.learned, None
        if len(learned):
            out.append(Arm(dict(zip(axes, map(str, key))), np.asarray(learned, bool), steps))
    return out


def compare(arms: list[Arm], axes: list[str], question: SweepQuestion) -> list[OnsetComparison]:
    """Each arm against the reference arm that differs from it on the compared axis alone; Holm over them."""
    if not question.compare:
        return []
    axis, declared = question.compare[0]
    levels = list(dict.fromkeys(a.axes[axis] for a in arms))
    if len(levels) < 2:
        return []
    ref_level = reference_level(levels, declared)
    by_key = {tuple(a.axes[x] for x in axes): a for a in arms}
    onset = question.outcome == "onset"
    out = []
    for arm in arms:
        if arm.axes[axis] == ref_level:
            continue
        key = tuple(ref_level if x == axis else arm.axes[x] for x in axes)
        if (ref := by_key.get(key)) is None:
            continue
        fisher = significance.proportions(ref.k, ref.n, arm.k, arm.n)
        p_logrank = significance.logrank_p(ref.steps, ~ref.learned, arm.steps, ~arm.learned) if onset else None
        at = {x: arm.axes[x] for x in axes if x != axis and len({a.axes[x] for a in arms}) > 1}
        out.append(OnsetComparison(axis, arm.axes[axis], ref_level, at, ref, arm, fisher, p_logrank, onset=onset))
    for c, p in zip(out, significance.holm([c.p for c in out])):
        c.p_holm, c.family = p, len(out)
        if onset and c.p is not None and (p is None or p >= significance.ALPHA):  # a tie: could these runs see one?
            c.power = significance.logrank_power(
                c.ref.steps,
                ~c.ref.learned,
                c.arm.steps,
                ~c.arm.learned,
                min(c.ref.n, c.arm.n),
                significance.ALPHA / len(out),
            )
    return out


BYTES = "mem/kv_cache_bytes_per_token"


def cache_bytes(frame: pd.DataFrame, axis: str) -> dict[str, float]:
    """Each arm's KV cache bytes per token, as its runs logged them (one value an arm), where logged."""
    if BYTES not in frame:
        return {}
    ok = frame[(frame["status"] == "ok") & frame[BYTES].notna()]
    return {str(k): float(rows[BYTES].iloc[0]) for k, rows in ok.groupby(axis, sort=False)}


def frontier(arms: list[Arm], axis: str, nbytes: dict[str, float]) -> list[str] | None:
    """The arms no other arm dominates: b dominates a when its cache holds no more bytes a token and it
    learns earlier beyond seed noise (the log-rank test of the pair, Holm over every pair of arms). None
    where the runs an arm has cannot reach alpha after Holm over the pairs: not resolved."""
    known = [a for a in arms if a.axes[axis] in nbytes and a.steps is not None]
    pairs = [(a, b) for i, a in enumerate(known) for b in known[i + 1 :]]
    if pairs and min(significance.logrank_p_min(a.n, b.n) for a, b in pairs) * len(pairs) >= significance.ALPHA:
        return None
    p = [significance.logrank_p(a.steps, ~a.learned, b.steps, ~b.learned) for a, b in pairs]
    dominated = set()
    for (a, b), p_holm in zip(pairs, significance.holm(p)):
        if p_holm is None or p_holm >= significance.ALPHA:
            continue
        better, worse = (a, b) if a.restricted_mean < b.restricted_mean else (b, a)
        if nbytes[better.axes[axis]] <= nbytes[worse.axes[axis]]:
            dominated.add(worse.axes[axis])
    return [a.axes[axis] for a in known if a.axes[axis] not in dominated]


def plot(arms: list[Arm], axis: str, cap: float, path: Path, nbytes: dict[str, float], front: list[str]) -> Path | None:
    """Left: the fraction of each arm's runs that have learned, over steps (one minus its Kaplan-Meier curve).
    Right: the fraction learned within the budget (Wilson's 95 % interval) against the KV cache bytes per
    token, the arms on the frontier joined."""
    if not arms or arms[0].steps is None:
        return None
    fig, (ax, per_byte) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    for arm, colour in zip(arms, colours(len(arms))):
        name = arm.axes.get(axis, "")
        if name in nbytes:
            lo, hi = arm.wilson
            share = arm.k / arm.n
            per_byte.errorbar(nbytes[name], share, yerr=[[share - lo], [hi - share]], fmt="o", capsize=3, color=colour)
            per_byte.annotate(name, (nbytes[name], share), textcoords="offset points", xytext=(5, 4), fontsize=7)
        km = arm.survival
        steps = [0.0, *km.times, cap]
        learned = [0.0, *(1 - s for s in km.survival), 1 - (km.survival[-1] if km.survival else 1.0)]
        ax.step(steps, learned, where="post", color=colour, lw=1.6, label=f"{arm.axes.get(axis, '')} ({arm.k}/{arm.n})")
    ax.axvline(cap, color="k", lw=0.6, ls="--", label=f"budget {cap:.0f} steps")
    ax.set_xlim(0, cap * 1.02)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("training step")
    ax.set_ylabel("fraction of runs learned")
    ax.set_title(f"Onset by {short(axis)}: runs that reached the threshold (Kaplan-Meier)", fontsize=9)
    on = sorted((nbytes[n], next(a.k / a.n for a in arms if a.axes.get(axis) == n)) for n in front if n in nbytes)
    if on:
        per_byte.plot(*zip(*on), color="k", lw=0.8, label="frontier (log-rank, Holm)")
    per_byte.set_xscale("log")
    per_byte.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    per_byte.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    per_byte.set_xlabel("KV cache bytes per token")
    per_byte.set_ylabel(f"fraction learned within {cap:.0f} steps")
    per_byte.set_ylim(-0.03, 1.03)
    per_byte.grid(alpha=0.3)
    legend_outside(fig, title=f"{short(axis)} (learned/runs)")
    return save(fig, path)


def tally(arms: list[Arm], axis: str) -> list[tuple[str, int, int]]:
    """Per level of the compared axis, runs learned and runs, summed over the other axes' settings."""
    out: dict[str, list[int]] = {}
    for arm in arms:
        k_n = out.setdefault(arm.axes[axis], [0, 0])
        k_n[0] += arm.k
        k_n[1] += arm.n
    return [(level, k, n) for level, (k, n) in out.items()]


def table(family: list[OnsetComparison]) -> dict:
    """Per arm: k of n learned with Wilson's interval, the median onset with its interval, and the tests."""

    def median_text(arm: Arm) -> str:
        km = arm.survival
        if km is None:
            return "-"
        if km.median is None:
            return f"> {km.cap:.0f}"
        hi = f"{km.median_hi:.0f}" if km.median_hi is not None else f"> {km.cap:.0f}"
        lo = f"{km.median_lo:.0f}" if km.median_lo is not None else "-"
        return f"{km.median:.0f} [{lo}, {hi}]"

    def k_of_n(arm: Arm) -> str:
        lo, hi = arm.wilson
        return f"{arm.k} of {arm.n} [{lo:.2f}, {hi:.2f}]"

    rows = []
    if family:
        ref = family[0].ref
        rows.append([f"{ref.axes[family[0].axis]} (reference)", "", k_of_n(ref), median_text(ref), "", "", "", "", ""])
    for c in family:
        rows.append(
            [
                c.level,
                c.where if c.at else "",
                k_of_n(c.arm),
                median_text(c.arm),
                p_text(c.fisher.p),
                p_text(c.p_logrank) if c.onset else "-",
                c.test_name,
                p_text(c.p_holm),
                c.verdict if c.untested_because is None else f"untested: {c.untested_because}",
            ]
        )
    header = ["arm", "where", "learned (k of n) [95 % Wilson]", "median onset [95 % CI]", "Fisher p", "log-rank p"]
    return md_table([*header, "deciding test", "p (Holm)", "verdict"], rows)


def summary(
    family: list[OnsetComparison], arms: list[Arm], axis: str | None, nbytes: dict[str, float], front: list[str]
) -> dict:
    """summary.json's onset entries: each arm's counts, curve and cache bytes, each comparison's tests and
    verdict, and the arms on the frontier."""

    def arm_entry(arm: Arm) -> dict:
        km = arm.survival
        entry = {"axes": arm.axes, "k": arm.k, "n": arm.n, "wilson": list(arm.wilson)}
        entry["kv_bytes_per_token"] = nbytes.get(arm.axes.get(axis))
        if km is not None:
            entry |= {
                "steps": [float(s) for s in arm.steps],
                "learned": [bool(x) for x in arm.learned],
                "median": km.median,
                "median_ci": [km.median_lo, km.median_hi],
                "cap": km.cap,
            }
        return entry

    return {
        "axis": axis,
        "on_frontier": front,
        "arms": [arm_entry(a) for a in arms],
        "comparisons": [
            {
                "level": c.level,
                "reference": c.reference,
                "where": c.where,
                "k": [c.ref.k, c.arm.k],
                "n": [c.ref.n, c.arm.n],
                "p_fisher": c.fisher.p,
                "p_logrank": c.p_logrank,
                "test": c.test_name,
                "p_holm": c.p_holm,
                "verdict": c.verdict,
                "untested_because": c.untested_because,
            }
            for c in family
        ],
    }
