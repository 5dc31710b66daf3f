"""Each outcome kind's statistics on simulated data with a known answer: bimodal learned-or-not
splits, skewed ratios, values at a ceiling, zero spread, censored onsets. Every number is checked
against a value worked out by hand or an independent computation, not against the code itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnlab.util import significance as sig


# ---------------------------------------------------------------- Holm
def test_holm_counts_an_untestable_comparison_in_the_family():
    """Two real p-values and one untestable comparison: the smallest is multiplied by 3, not 2."""
    adjusted = sig.holm([0.01, None, 0.04])
    assert adjusted[0] == pytest.approx(0.03)
    assert adjusted[1] is None
    assert adjusted[2] == pytest.approx(0.08)  # second smallest times 2, as Holm steps down
    assert sig.holm([0.01, math.nan])[0] == pytest.approx(0.02)


# ---------------------------------------------------------------- continuous: exact permutation
def test_two_seeds_a_side_cannot_reach_five_percent_by_an_exact_test():
    """Complete separation at 2 vs 2: one arrangement in C(4, 2) = 6 each way, p = 2/6."""
    res = sig.permutation([1.0, 1.0], [0.21, 0.23])
    assert res.enumerated
    assert res.p == pytest.approx(1 / 3)
    assert res.p_min == pytest.approx(1 / 3)
    assert not res.reachable()


def test_five_seeds_a_side_separated_give_two_in_252():
    rng = np.random.default_rng(1)
    escape = rng.lognormal(-3, 1.0, 5)  # skewed, every value below every softmax value
    softmax = 1 + rng.lognormal(-1, 1.0, 5)
    res = sig.permutation(softmax, escape)
    assert res.p == pytest.approx(2 / 252)
    assert res.reachable()


def test_the_exact_test_matches_a_hand_enumeration():
    ref, lvl = [0.0, 1.0, 3.0], [2.0, 4.0, 5.0]
    pooled = ref + lvl
    observed = np.mean(lvl) - np.mean(ref)
    import itertools

    diffs = []
    for chosen in itertools.combinations(range(6), 3):
        a = [pooled[i] for i in chosen]
        b = [pooled[i] for i in range(6) if i not in chosen]
        diffs.append(np.mean(a) - np.mean(b))
    diffs = np.array(diffs)
    one_sided = min((diffs >= observed - 1e-12).mean(), (diffs <= observed + 1e-12).mean())
    assert sig.permutation(ref, lvl).p == pytest.approx(min(1.0, 2 * one_sided))


@pytest.mark.parametrize(
    ("ref", "lvl", "shown", "decides"),
    [
        ([1.0, 1.0, 1.0], [0.2, 0.25, 0.3], True, True),  # a side at a ceiling with no spread
        ([0.1] * 8, [0.2 + 0.01 * i for i in range(8)], True, True),  # zero spread at 8 seeds
        ([0.1, 0.12, 0.13], [0.2, 0.22, 0.25], True, True),  # 3 a side: it decides, and reads not resolved
        ([0.1, 0.12, 0.13, 0.11], [0.2, 0.22, 0.25, 0.21], True, True),  # 4 a side: 2/70 can
        ([0.1 + 0.01 * i for i in range(6)], [0.2 + 0.01 * i for i in range(6)], False, False),  # Welch's ground
    ],
)
def test_the_deciding_test_follows_the_seeds_and_their_spread(ref, lvl, shown, decides):
    assert sig.exact_shown(ref, lvl) is shown
    assert sig.exact_decides(ref, lvl) is decides


# ---------------------------------------------------------------- spread for planning
def test_the_sd_upper_bound_at_one_and_two_degrees_of_freedom():
    assert sig.sd_upper(1.0, 2) == pytest.approx(15.95, rel=1e-3)
    assert sig.sd_upper(1.0, 3) == pytest.approx(4.415, abs=1e-3)
    assert sig.sd_upper(1.0, 1000) == pytest.approx(1.039, abs=0.002)


def test_zero_spread_is_planned_at_the_metrics_resolution_not_at_zero():
    assert sig.planning_sd(0.0, 2, resolution=1 / 6144) == pytest.approx(1 / 6144)
    # Browne's 80 % bound at one degree of freedom: sqrt(1 / chi2.ppf(0.2, 1)) = 3.94 times the sample sd
    assert sig.planning_sd(0.01, 2, resolution=1 / 6144) == pytest.approx(0.0394, rel=2e-3)


# ---------------------------------------------------------------- learned: k of n
def test_two_of_two_against_none_of_two_is_a_third():
    res = sig.proportions(2, 2, 0, 2)
    assert res.p == pytest.approx(1 / 3)
    assert res.p_min == pytest.approx(1 / 3)
    # 0 of 2 learned still allows a learning probability of 0.66 (Wilson, 95 %)
    assert res.ci_level[0] == 0.0 and res.ci_level[1] == pytest.approx(0.658, abs=1e-3)


def test_fishers_power_is_exact():
    """At 5 a side with certain learning against never, only 5/5 vs 0/5 is a table at all: power 1."""
    assert sig.fisher_power(1.0, 0.0, 5, 5) == pytest.approx(1.0)
    assert sig.fisher_power(1.0, 0.0, 2, 2) == pytest.approx(0.0)  # p = 1/3 is all 2 vs 2 can give
    # p 0.5 against 0.5: the test's size, at most alpha
    assert sig.fisher_power(0.5, 0.5, 10, 10) <= 0.05
    # a brute-force simulation agrees with the exact sum
    rng = np.random.default_rng(0)
    k1, k2 = rng.binomial(8, 0.9, 4000), rng.binomial(8, 0.3, 4000)
    simulated = np.mean([sig.fisher_p(int(a), 8, int(b), 8) < 0.05 for a, b in zip(k1, k2)])
    assert sig.fisher_power(0.9, 0.3, 8, 8) == pytest.approx(simulated, abs=0.03)


def test_seeds_needed_for_k_of_n():
    assert sig.fisher_seeds_needed(1.0, 0.0) == 4  # 4 vs 0 of 4: p = 2/70 < 0.05
    assert sig.fisher_seeds_needed(0.5, 0.5) is None


# ---------------------------------------------------------------- onset: censored times
def test_kaplan_meier_on_a_hand_worked_example():
    """Onsets 250, 500, 500 and one censored at 1000: S drops to 3/4 at 250, to 1/4 at 500."""
    km = sig.kaplan_meier([250, 500, 500, 1000], [False, False, False, True])
    assert km.times == (250.0, 500.0, 1000.0)
    assert km.survival == pytest.approx((0.75, 0.25, 0.25))  # the censored run ends the curve, no drop
    assert km.median == 500.0
    assert km.events == 3 and km.cap == 1000.0


def test_an_arm_that_never_learned_has_no_median():
    km = sig.kaplan_meier([6000] * 5, [True] * 5)
    assert km.median is None and km.events == 0


def test_logrank_separates_early_learners_from_never():
    early = ([250, 250, 500, 250, 500], [False] * 5)
    never = ([6000] * 5, [True] * 5)
    p = sig.logrank_p(*early, *never)
    assert p < 0.01
    assert math.isnan(sig.logrank_p(*never, *never))
    # against itself: no difference
    assert sig.logrank_p(*early, *early) == pytest.approx(1.0)


def test_logrank_power_by_simulation_rises_with_seeds():
    early = ([250, 250, 500, 250, 500], [False] * 5)
    never = ([6000] * 5, [True] * 5)
    assert sig.logrank_power(*early, *never, n=2) < sig.logrank_power(*early, *never, n=5)
    assert sig.logrank_power(*early, *never, n=5) > 0.95


def test_the_median_interval_covers_a_known_median():
    """Exponential onsets with median 1000 censored at 3000: the interval holds 1000 in most draws."""
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(100):
        t = rng.exponential(1000 / math.log(2), 40)
        c = t > 3000
        km = sig.kaplan_meier(np.minimum(t, 3000), c)
        covered += km.median_lo is not None and km.median_hi is not None and km.median_lo <= 1000 <= km.median_hi
    assert covered >= 85


# ---------------------------------------------------------------- skewed ratios
def test_ten_ratios_all_above_one_pass_the_sign_test():
    rng = np.random.default_rng(0)
    r = 1 + rng.lognormal(-3, 1.0, 10)  # every ratio above 1, one far out
    r[0] = 2.5
    res = sig.ratios(r)
    assert res.above == 10
    assert res.p_sign == pytest.approx(2 / 1024)
    assert res.p_wilcoxon == pytest.approx(stats.wilcoxon(np.log(r)).pvalue)
    assert res.lo > 1.0 and res.lo <= res.median <= res.hi
    assert res.median == pytest.approx(np.median(r))


def test_ratios_around_one_are_no_difference():
    rng = np.random.default_rng(2)
    res = sig.ratios(np.exp(rng.normal(0, 0.1, 10)))
    assert res.p_sign > 0.05 and res.lo < 1 < res.hi
