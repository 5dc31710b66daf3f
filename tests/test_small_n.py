"""Exact at small n: the tests that decide hold their level at the seeds the studies have (simulated under
the null), a family the seeds cannot resolve after Holm reads "not resolved", and a tie the seeds could
not have seen reads "not resolved", never "no difference"."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from attnlab.studies.report import analysis
from attnlab.studies.report.analysis import Cell, SweepQuestion
from attnlab.studies.report.onset import Arm, frontier
from attnlab.util import significance as sig


def onsets(rng, n: int, scale: float = 1500.0, every: int = 250, cap: int = 6000):
    """n runs' onset steps (evaluated every ``every`` steps, censored at ``cap``) and their censoring."""
    t = np.ceil(rng.exponential(scale, n) / every) * every
    return np.minimum(t, cap), t > cap


def test_the_permutation_log_rank_holds_its_level_at_5_v_5_where_the_chi_square_limit_does_not():
    rng = np.random.default_rng(1)
    exact, limit = [], []
    for _ in range(2000):  # both arms from one distribution: every rejection is a false positive
        (ta, ca), (tb, cb) = onsets(rng, 5), onsets(rng, 5)
        exact.append(sig.logrank_p(ta, ca, tb, cb))
        both_censored = ca.all() and cb.all()
        limit.append(1.0 if both_censored else stats.logrank(sig.censored(tb, cb), sig.censored(ta, ca)).pvalue)
    exact, limit = np.nan_to_num(exact, nan=1.0), np.asarray(limit)
    assert (exact < sig.ALPHA).mean() <= sig.ALPHA
    assert (limit < sig.ALPHA).mean() > sig.ALPHA  # the asymptotic p the exact one replaces: above its level


def test_the_permutation_log_rank_is_exact_and_reaches_its_smallest_p():
    early, never = ([250.0] * 5, [False] * 5), ([6000.0] * 5, [True] * 5)
    assert sig.logrank_p(*early, *never) == pytest.approx(2 / 252) == sig.logrank_p_min(5, 5)
    # 10 a side: every one of C(20, 10) arrangements enumerated, the p one of their fractions
    p = sig.logrank_p(list(range(250, 2750, 250)), [False] * 10, list(range(1500, 4000, 250)), [False] * 10)
    assert 0 < p < sig.ALPHA and round(p * 184_756) == pytest.approx(p * 184_756, abs=1e-6)


@pytest.mark.parametrize("ratio", [4.0, 11.5])
def test_the_deciding_test_holds_its_level_at_3_v_3_with_unequal_spread(ratio):
    """The exact test decides at five seeds a side or fewer, where Welch's t at unequal spreads does not
    hold Holm's small thresholds; its rejection rate stays at or below them."""
    rng = np.random.default_rng(2)
    alpha = sig.ALPHA / 8  # Holm's first threshold over dk_scaling's 8 comparisons
    decided = []
    for _ in range(1000):
        ref, level = rng.normal(0, 1, 3), rng.normal(0, ratio, 3)
        assert sig.exact_decides(ref, level)
        decided.append(sig.permutation(ref, level).p)
    assert (np.asarray(decided) < alpha).mean() <= alpha


def test_seeds_an_exact_test_needs_after_holm():
    assert [sig.exact_seeds_for(m) for m in (1, 2, 6, 8, 21)] == [4, 5, 5, 6, 6]
    assert 2 / 924 < sig.ALPHA / 21 < 2 / 252  # 6 a side reaches Holm's first step over 21 pairs, 5 does not


def cell(level: str, values) -> Cell:
    return Cell(
        {"scaling": level}, len(values), 0, "", {"val/loss": np.asarray(values, float)}, seeds=list(range(len(values)))
    )


def question(difference: float | None) -> SweepQuestion:
    return SweepQuestion(ask="", compare=[("scaling", "none")], metrics=["val/loss"], difference=difference)


def test_a_tie_the_seeds_could_not_see_is_not_resolved():
    noisy = [cell("none", [2.0, 2.3, 1.7, 2.1, 1.9, 2.2]), cell("inv_sqrt_d", [2.1, 1.8, 2.2, 2.0, 2.4, 1.9])]
    (c,) = analysis.contrasts(noisy, ["scaling"], question(0.02), "val/loss")
    assert c.test_name == "Welch" and c.p_holm > sig.ALPHA and c.detectable > 0.02
    assert c.verdict == "untested" and c.untested_because.startswith("not resolved: these seeds detect")
    (wide,) = analysis.contrasts(noisy, ["scaling"], question(2.0), "val/loss")
    assert wide.verdict == "none"  # the seeds detect 2.0 easily: a tie is an answer


def test_three_seeds_a_side_cannot_resolve_a_family_by_the_exact_test():
    cells = [cell("none", [2.0, 2.01, 2.02]), cell("inv_sqrt_d", [2.5, 2.51, 2.52])]
    (c,) = analysis.contrasts(cells, ["scaling"], question(0.05), "val/loss")
    assert c.test_name == "exact" and c.verdict == "untested"  # Welch would call this (p < 1e-5)
    assert c.seeds_needed >= sig.exact_seeds_for(1)


def test_a_frontier_over_21_pairs_at_5_runs_an_arm_is_not_resolved():
    arms = [Arm({"variant": f"v{i}"}, np.ones(5, bool), np.full(5, 250.0 * (i + 1))) for i in range(7)]
    nbytes = {f"v{i}": float(100 * (7 - i)) for i in range(7)}
    assert frontier(arms, "variant", nbytes) is None
    wider = [Arm(a.axes, np.ones(6, bool), np.full(6, a.steps[0])) for a in arms]
    assert frontier(wider, "variant", nbytes) is not None
