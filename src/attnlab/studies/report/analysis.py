"""A study's answer as data: its cells, the contrasts its question declares, each with Welch's test,
the Holm-corrected p over its family, the smallest difference its seeds could detect, and whether the
reference arm was below the attention-free level (else the question is untested at that budget).

The question comes from the study's experiment file (``question:``, read by ``question_of``): the
axis compared, its reference level, the metrics, the axis across which the effect itself is compared
(an interaction), and the difference the study is meant to resolve. A study without one compares every
level of each axis with the axis's reference level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnlab.config.study import load_study, study_names
from attnlab.studies.report.aggregate import RENAMED_KEYS, sort_key
from attnlab.studies.report.data import axes_of
from attnlab.util import significance
from attnlab.writing.pages import sig, where

SCALING_AXIS = "model.attention.scaling"
REFERENCES = ("none", "false", "False", "0", "baseline")


@dataclass
class Cell:
    """One setting of the axes: its finished and failed run counts and, per metric, the seeds' values
    (or only their mean, std and count, for a study whose per-seed values were never kept)."""

    axes: dict[str, str]
    n_ok: int
    n_failed: int = 0
    errors: str = ""
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    summaries: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    seeds: list = field(default_factory=list)

    def stats(self, key: str) -> tuple[float, float, int] | None:
        if key in self.samples:
            a = self.samples[key]
            return (float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a)) if len(a) else None
        return self.summaries.get(key)

    def mean(self, key: str) -> float | None:
        s = self.stats(key)
        return None if s is None else s[0]

    def values(self, key: str) -> list[float]:
        return list(self.samples.get(key, []))

    def interval(self, key: str) -> tuple[float, float] | None:
        """The mean's 95 % interval: a percentile bootstrap for a metric bounded by definition (it stays in
        the bounds a t interval can leave on a bimodal accuracy), else the t interval."""
        s = self.stats(key)
        if s is None or s[2] < 2:
            return None
        if bounded(key) and key in self.samples:
            return significance.percentile_interval(self.samples[key])
        return significance.t_interval_from_stats(*s)

    @property
    def label(self) -> str:
        return where(self.axes)


# metrics in [0, 1] by definition (an accuracy, a probability, a normalised entropy, a share of weight)
BOUNDED = ("acc", "max_prob", "max_prob_max", "entropy_norm", "onset/censored")


def bounded(metric: str) -> bool:
    last = metric.rsplit("/", 1)[-1]
    return metric in BOUNDED or last in BOUNDED or last.startswith("sink_mass")


def cells_from_runs(frame: pd.DataFrame, axes: list[str] | None = None, sort: bool = True) -> list[Cell]:
    axes = axes_of(frame) if axes is None else axes
    metrics = [c for c in frame.columns[list(frame.columns).index("run") + 1 :] if c in frame]
    out = []
    groups = frame.groupby(axes, sort=False, dropna=False) if axes else [((), frame)]
    for key, rows in groups:
        key = key if isinstance(key, tuple) else (key,)
        ok = rows[rows["status"] == "ok"]
        failed = rows[rows["status"] != "ok"]
        samples = {m: ok[m].dropna().to_numpy(float) for m in metrics if ok[m].notna().any()}
        out.append(
            Cell(
                dict(zip(axes, map(str, key))),
                len(ok),
                len(failed),
                " | ".join(sorted(set(failed["error"].fillna("?")))),
                samples,
                seeds=list(ok["seed"]),
            )
        )
    return sorted(out, key=lambda c: [sort_key(c.axes[a]) for a in axes]) if sort else out


def cells_from_summaries(table: pd.DataFrame) -> tuple[list[str], list[Cell]]:
    """Cells from ablation.csv's mean, std and seed count, for a study whose per-seed values were not kept."""
    table = table.rename(columns=RENAMED_KEYS)
    axes = list(table.columns[: list(table.columns).index("n_ok")])
    keys = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    cells = []
    for _, row in table.iterrows():
        n = int(float(row["n_ok"] or 0))
        summaries = {
            k: (float(row[f"{k}_mean"]), float(row[f"{k}_std"] or 0), n) for k in keys if row[f"{k}_mean"] != ""
        }
        cells.append(Cell({a: row[a] for a in axes}, n, int(float(row["n_failed"] or 0)), row["errors"], {}, summaries))
    return axes, cells


# ---------------------------------------------------------------- the question
@dataclass
class SweepQuestion:
    """The study's declared question (config.study.Question) as one sweep's axes can answer it: which
    axis is compared with which level, on which metrics, with which test."""

    ask: str
    metrics: list[str]
    compare: list[tuple[str, str]]  # (axis, reference level)
    across: str | None = None  # the axis across which the compared effect itself is tested
    difference: float | None = None  # the difference the study is meant to resolve, in the metric's unit
    declared: bool = True
    learned: float | None = None  # the answer accuracy the reference arm must reach before arms are compared
    outcome: str = "continuous"  # what a run's result is, which decides its test (significance.OUTCOMES)


def question_of(study: str, axes: list[str]) -> SweepQuestion:
    """The question the study's experiment declares (config.study), when its axis is one of the study's
    axes; else every level of each axis against the axis's reference."""
    declared = load_study(study).question if study in study_names() else None
    if declared is not None and declared.axis in axes:
        return SweepQuestion(
            declared.ask,
            list(declared.metrics),
            [(declared.axis, declared.reference or "")],
            declared.across if declared.across in axes else None,
            declared.difference,
            learned=declared.learned,
            outcome=declared.outcome,
        )
    compared = [SCALING_AXIS] if SCALING_AXIS in axes else axes
    return SweepQuestion("", ["val/loss"], [(a, "") for a in compared], declared=False)


def reference_level(levels: list[str], declared: str = "") -> str:
    if declared in levels:
        return declared
    return next((r for r in REFERENCES if r in levels), levels[0])


# ---------------------------------------------------------------- contrasts
@dataclass
class Comparison:
    metric: str
    axis: str
    level: str
    reference: str
    at: dict[str, str]  # the other axes' values
    test: significance.Contrast | None
    ref_mean: float
    level_mean: float
    ref_interval: tuple[float, float] | None
    level_interval: tuple[float, float] | None
    n: tuple[int, int]
    below: float | None = None  # how far the reference arm ends below the attention-free level
    unlearned: bool = False  # the reference arm's answer accuracy is below the question's ``learned``
    p_holm: float | None = None  # the deciding test's p, Holm-corrected over the family
    seeds_needed: int | None = None  # seeds a side to detect the question's difference at this spread
    exact: significance.Exact | None = None  # the permutation test, where shown (few seeds or no spread)
    exact_decides: bool = False  # it decides the verdict (significance.exact_decides), else Welch's t does
    family: int = 1  # comparisons Holm corrects over with this one
    target: float | None = None  # the declared difference a tie must be able to detect to read "no difference"

    @property
    def diff(self) -> float:
        return self.level_mean - self.ref_mean

    @property
    def p(self) -> float | None:
        """The deciding test's p: the exact test's where it decides, else Welch's."""
        if self.exact is not None and self.exact_decides:
            return self.exact.p
        return self.test.p if self.test else None

    @property
    def test_name(self) -> str:
        return "exact" if self.exact is not None and self.exact_decides else "Welch" if self.test else "-"

    @property
    def unanswerable_because(self) -> str | None:
        """Why no number of seeds answers the comparison at this budget (its reference arm does not use its
        attention), or None."""
        if self.below is not None and self.below <= 0:
            return "the reference arm is not below the attention-free level"
        if self.unlearned:
            return "the reference arm has not learned the task"
        return None

    @property
    def untested_because(self) -> str | None:
        """Why the comparison cannot be answered here, or None."""
        if self.unanswerable_because is not None:
            return self.unanswerable_because
        if self.p is None:
            return "under two seeds a side"
        if self.exact is not None and self.exact_decides and not self.exact.reachable():
            return f"{self.n[0]} and {self.n[1]} seeds cannot reach p < {significance.ALPHA} by an exact test"
        if self.exact is not None and self.exact_decides and not self.exact.reachable(significance.ALPHA / self.family):
            return (
                f"not resolved: {self.n[0]} and {self.n[1]} seeds cannot reach p < {significance.ALPHA} after Holm over "
                f"{self.family} comparisons by an exact test ({significance.exact_seeds_for(self.family)} a side can)"
            )
        tie = self.p_holm is not None and self.p_holm >= significance.ALPHA
        if tie and self.target and (self.detectable is None or self.detectable > self.target):
            shown = "no bound on" if self.detectable is None else f"{sig(self.detectable)} or more,"
            return f"not resolved: these seeds detect {shown} short of the {sig(self.target)} asked"
        return None

    @property
    def detectable(self) -> float | None:
        """The smallest difference these seeds detect (Welch, 80 % power); None where a side has no spread:
        a sample sd of 0 is not a known 0."""
        if self.test is None or self.test.std_ref == 0 or self.test.std_level == 0:
            return None
        return self.test.detectable

    @property
    def detects_target(self) -> bool:
        """Whether these seeds can see the declared difference: the deciding exact test can reach the level
        after Holm over the family, and the smallest difference detectable at 80 % power is at most it."""
        if not self.target or self.detectable is None or self.detectable > self.target:
            return False
        return not (
            self.exact is not None and self.exact_decides and not self.exact.reachable(significance.ALPHA / self.family)
        )

    @property
    def verdict(self) -> str:
        """higher | lower (beyond seed noise after Holm, by the deciding test) | none | untested (see
        ``untested_because``: no test these seeds can pass, or a reference arm that does not do the task)."""
        if self.untested_because is not None:
            return "untested"
        if self.p_holm is not None and self.p_holm < significance.ALPHA:
            return "higher" if self.diff > 0 else "lower"
        return "none"

    @property
    def where(self) -> str:
        return where(self.at)


def compare(ref: Cell, lvl: Cell, metric: str):
    """Welch's test of two cells: from the seeds' values where kept, else from the cells' mean, std and count."""
    if metric in ref.samples and metric in lvl.samples:
        return significance.welch(ref.samples[metric], lvl.samples[metric])
    a, b = ref.stats(metric), lvl.stats(metric)
    return significance.welch_from_stats(*a, *b) if a and b else None


def compare_exactly(ref: Cell, lvl: Cell, metric: str) -> tuple[significance.Exact | None, bool]:
    """The permutation test of two cells where it is shown (few seeds or no spread, the seeds' values kept),
    and whether it decides (``significance.exact_decides``)."""
    if metric not in ref.samples or metric not in lvl.samples:
        return None, False
    a, b = ref.samples[metric], lvl.samples[metric]
    if not significance.exact_shown(a, b):
        return None, False
    return significance.permutation(a, b), significance.exact_decides(a, b)


def contrasts(
    cells: list[Cell],
    axes: list[str],
    question: SweepQuestion,
    metric: str,
    grid: list[Cell] | None = None,
    level: float | None = None,
) -> list[Comparison]:
    """Each compared level against the reference at every setting of the other axes; Holm over the family.
    With the ``grid`` of run cells, each reference arm is also checked against the attention-free ``level``
    and the question's ``learned`` (``reference_gap``, ``reference_learned``): the budget rule every reader shares."""
    by_key = {tuple(c.axes[a] for a in axes): c for c in cells}
    out = []
    for axis, declared in question.compare:
        i = axes.index(axis)
        levels = list(dict.fromkeys(c.axes[axis] for c in cells))
        if len(levels) < 2:
            continue
        ref = reference_level(levels, declared)
        for cell in cells:
            key = tuple(cell.axes[a] for a in axes)
            twin = by_key.get(key[:i] + (ref,) + key[i + 1 :])
            if cell.axes[axis] == ref or twin is None or twin.stats(metric) is None or cell.stats(metric) is None:
                continue
            out.append(
                Comparison(
                    metric,
                    axis,
                    cell.axes[axis],
                    ref,
                    {a: cell.axes[a] for a in axes if a != axis},
                    compare(twin, cell, metric),
                    twin.mean(metric),
                    cell.mean(metric),
                    twin.interval(metric),
                    cell.interval(metric),
                    (twin.stats(metric)[2], cell.stats(metric)[2]),
                )
            )
            out[-1].exact, out[-1].exact_decides = compare_exactly(twin, cell, metric)
    for c, p in zip(out, significance.holm([c.p for c in out])):
        c.p_holm, c.family = p, len(out)
        if question.difference and metric == question.metrics[0]:
            c.target = question.difference
            if c.test and (needed := seeds_to_detect(c.test, question.difference)) is not None:
                # at EXACT_UP_TO seeds or fewer the exact test decides: no fewer than it needs after Holm
                c.seeds_needed = max(needed, significance.exact_seeds_for(len(out)))
    if grid is not None:
        reference_gap(out, grid, level)
        reference_learned(out, grid, question.learned)
    return out


def seeds_to_detect(test: significance.Contrast, difference: float) -> int | None:
    """Seeds a side at which Welch's test finds ``difference`` with 80 % power, were each cell's sd its upper
    80 % confidence bound (a sample sd from two or three seeds can be a sixteenth of the true one); None
    where a side shows no spread, since nothing bounds it from these seeds."""
    if test.std_ref == 0 or test.std_level == 0:
        return None
    upper = [significance.planning_sd(s, n) for s, n in ((test.std_ref, test.n_ref), (test.std_level, test.n_level))]
    return significance.seeds_needed(*upper, difference)


@dataclass
class Interaction:
    """The compared effect at the last level of ``across`` minus the effect at its first, the others fixed."""

    metric: str
    across: str
    first: str
    last: str
    at: dict[str, str]
    test: significance.Contrast | None
    below: float | None = None  # the smaller of its two reference arms' distances below the attention-free level
    p_holm: float | None = None

    @property
    def untested_because(self) -> str | None:
        """Why the interaction answers nothing here: a reference arm that does not use its attention, or cells
        of so few seeds that its Welch-type test cannot decide (there is no exact test of it here)."""
        if self.below is not None and self.below <= 0:
            return "a reference arm is not below the attention-free level"
        if self.test is None:
            return "under two seeds a cell"
        if min(self.test.n_ref, self.test.n_level) <= significance.EXACT_UP_TO:
            return (
                f"not resolved: a Welch-type test does not decide at {significance.EXACT_UP_TO} seeds a cell or fewer, "
                "and an interaction has no exact test here"
            )
        return None

    @property
    def verdict(self) -> str:
        if self.untested_because is not None:
            return "untested"
        return ("larger" if self.test.diff > 0 else "smaller") if (self.p_holm or 1) < significance.ALPHA else "none"


def interactions(cells: list[Cell], axes: list[str], family: list[Comparison], across: str) -> list[Interaction]:
    family = [c for c in family if across in c.at]
    levels = list(dict.fromkeys(c.at[across] for c in family))  # the cells' order: numeric, or by model size
    by_key = {tuple(c.axes[a] for a in axes): c for c in cells}
    if len(levels) < 2:
        return []
    out = []
    for last in (c for c in family if c.at[across] == levels[-1]):
        first = next((c for c in family if c.at == {**last.at, across: levels[0]} and c.level == last.level), None)
        if first is None:
            continue
        parts = []
        for comparison, sign in ((last, 1), (first, -1)):
            for level, s in ((comparison.level, sign), (comparison.reference, -sign)):
                values = {**comparison.at, comparison.axis: level}
                parts.append((*by_key[tuple(values[a] for a in axes)].stats(last.metric), s))
        rest = {k: v for k, v in last.at.items() if k != across}
        gaps = [g for g in (first.below, last.below) if g is not None]
        test = significance.interaction(parts)
        out.append(Interaction(last.metric, across, levels[0], levels[-1], rest, test, min(gaps) if gaps else None))
    for x, p in zip(out, significance.holm([x.test.p if x.test else None for x in out])):
        x.p_holm = p
    return out


def pooled(cells: list[Cell], axes: list[str], metric: str) -> list[dict]:
    """Each axis's levels against its reference, the difference averaged over every setting of the other
    axes (a contrast of cell means with Welch-Satterthwaite df), Holm-corrected over all of them."""
    if len(axes) < 2:
        return []
    by_key = {tuple(c.axes[a] for a in axes): c for c in cells}
    out = []
    for i, axis in enumerate(axes):
        levels = list(dict.fromkeys(c.axes[axis] for c in cells))
        ref = reference_level(levels)
        strata = sorted({tuple(c.axes[a] for a in axes if a != axis) for c in cells})
        for level in (lv for lv in levels if lv != ref):
            parts = []
            for stratum in strata:
                pair = [by_key.get(stratum[:i] + (lv,) + stratum[i:]) for lv in (level, ref)]
                if any(c is None or c.stats(metric) is None for c in pair):
                    break
                parts += [(*pair[0].stats(metric), 1), (*pair[1].stats(metric), -1)]
            else:
                k = len(strata)
                test = significance.interaction([(m / k, s / k, n, sign) for m, s, n, sign in parts])
                diff = sum(sign * m for m, _, _, sign in parts) / k
                out.append({"axis": axis, "level": level, "reference": ref, "strata": k, "diff": diff, "test": test})
    for e, p in zip(out, significance.holm([e["test"].p if e["test"] else None for e in out])):
        e["p_holm"] = p
    return out


def reference_learned(family: list[Comparison], grid: list[Cell], learned: float | None) -> None:
    """Mark each comparison whose reference arm answers fewer than ``learned`` of the queries (val/acc): its
    arms are compared before the model does what the study is about."""
    if learned is None:
        return
    for c in family:
        arm = {**c.at, c.axis: c.reference}
        accs = [g.mean("val/acc") for g in grid if all(g.axes.get(k, v) == v for k, v in arm.items())]
        c.unlearned = not any(a is not None and a >= learned for a in accs)


def reference_gap(family: list[Comparison], grid: list[Cell], level: float | None) -> None:
    """Set each comparison's ``below``: the attention-free level minus the reference arm's best val loss (over
    the grid cells that share the arm's axes, e.g. every learning rate of an LR-sensitivity arm)."""
    if level is None:
        return
    for c in family:
        arm = {**c.at, c.axis: c.reference}
        losses = [
            m
            for g in grid
            if all(g.axes.get(k, v) == v for k, v in arm.items()) and (m := g.mean("val/loss")) is not None
        ]
        c.below = level - min(losses) if losses else None
