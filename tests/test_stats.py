"""attnlab.util.significance against scipy's own results and textbook values."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from attnlab.util import significance


def test_welch_is_scipys_and_from_stats_agrees():
    rng = np.random.default_rng(0)
    ref, lvl = rng.normal(1.0, 0.1, 3), rng.normal(1.3, 0.3, 4)
    c = significance.welch(ref, lvl)
    res = sps.ttest_ind(lvl, ref, equal_var=False)
    assert c.p == pytest.approx(res.pvalue) and c.df == pytest.approx(res.df)
    assert c.diff == pytest.approx(lvl.mean() - ref.mean())
    assert c.lo < c.diff < c.hi
    s = significance.welch_from_stats(ref.mean(), ref.std(ddof=1), 3, lvl.mean(), lvl.std(ddof=1), 4)
    for field in ("diff", "lo", "hi", "p", "df", "detectable"):
        assert getattr(s, field) == pytest.approx(getattr(c, field), rel=1e-9)


def test_welch_needs_two_values_a_side():
    assert significance.welch([1.0], [1.0, 2.0]) is None
    assert significance.welch_from_stats(1.0, 0.1, 1, 1.0, 0.1, 3) is None


def test_detectable_difference_shrinks_with_seeds_and_matches_power():
    d3 = significance.detectable_difference(0.1, 3, 0.1, 3)
    d10 = significance.detectable_difference(0.1, 10, 0.1, 10)
    assert d10 < d3
    # a true difference of that size is found about 80 % of the time (simulated, n = 10 a side)
    rng = np.random.default_rng(1)
    hits = sum(
        sps.ttest_ind(rng.normal(d10, 0.1, 10), rng.normal(0, 0.1, 10), equal_var=False).pvalue < 0.05
        for _ in range(2000)
    )
    assert 0.74 < hits / 2000 < 0.86


def test_t_interval():
    x = [0.1, 0.3, 0.2, 0.4]
    mean, lo, hi = significance.t_interval(x)
    assert (lo, hi) == pytest.approx(sps.ttest_1samp(x, 0).confidence_interval())
    assert significance.t_interval([2.0]) == (2.0, 2.0, 2.0)
    assert significance.t_interval_from_stats(mean, float(np.std(x, ddof=1)), 4) == pytest.approx((lo, hi))


def test_wilson_known_value():
    lo, hi = significance.wilson(3, 3)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(0.4385, abs=1e-4)
    assert significance.wilson(0, 0) == (0.0, 1.0)


def test_holm_step_down():
    adj = significance.holm([0.01, 0.04, None, 0.03])
    assert adj[2] is None  # untestable: no p of its own, but one of the family's four
    assert adj[0] == pytest.approx(0.04) and adj[3] == pytest.approx(0.09) and adj[1] == pytest.approx(0.09)
    assert all(math.isfinite(p) and p <= 1 for p in adj if p is not None)


def test_seeds_needed_is_the_first_count_whose_detectable_difference_reaches_the_target():
    for std_ref, std_level, target in [(0.1, 0.1, 0.1), (0.05, 0.2, 0.15), (0.3, 0.01, 0.5)]:
        n = significance.seeds_needed(std_ref, std_level, target)
        assert n is not None and n >= 2
        assert significance.detectable_difference(std_ref, n, std_level, n) <= target
        if n > 2:
            assert significance.detectable_difference(std_ref, n - 1, std_level, n - 1) > target
    # twice the spread needs about four times the seeds (the normal approximation's n ~ std^2)
    small, large = significance.seeds_needed(0.05, 0.05, 0.05), significance.seeds_needed(0.1, 0.1, 0.05)
    assert 3.3 < large / small < 4.7
    assert significance.seeds_needed(float("nan"), 0.1, 0.1) is None
    assert significance.seeds_needed(1.0, 1.0, 1e-3) > 10**6  # no cap: the count is reported, however large


def test_a_contrast_carries_its_sides_spread_for_the_seeds_it_would_need():
    rng = np.random.default_rng(0)
    ref, lvl = rng.normal(0, 0.1, 4), rng.normal(0.05, 0.2, 4)
    c = significance.welch(ref, lvl)
    assert c.std_ref == pytest.approx(np.std(ref, ddof=1)) and c.std_level == pytest.approx(np.std(lvl, ddof=1))
    assert c.seeds_needed(0.1) == significance.seeds_needed(c.std_ref, c.std_level, 0.1)


def test_welch_power_is_the_rate_at_which_simulated_welch_tests_find_the_difference():
    """The noncentral t's power against the share of 4,000 simulated experiments whose Welch p is below 0.05."""
    rng = np.random.default_rng(0)
    for diff, sd_ref, sd_level, n in [(1.0, 1.0, 1.0, 10), (0.3, 0.2, 0.4, 8)]:
        ref = rng.normal(0.0, sd_ref, size=(4000, n))
        level = rng.normal(diff, sd_level, size=(4000, n))
        found = (sps.ttest_ind(level, ref, axis=1, equal_var=False).pvalue < 0.05).mean()
        assert significance.welch_power(diff, sd_ref, n, sd_level, n) == pytest.approx(found, abs=0.03)
    n = significance.seeds_needed(0.2, 0.3, 0.25)
    assert (
        significance.welch_power(0.25, 0.2, n, 0.3, n) >= 0.8 > significance.welch_power(0.25, 0.2, n - 1, 0.3, n - 1)
    )
    d = significance.detectable_difference(0.2, 5, 0.3, 7)
    assert significance.welch_power(d, 0.2, 5, 0.3, 7) == pytest.approx(0.8, abs=1e-6)


@pytest.mark.parametrize("df", [1.0, 2.0, 3.5])
def test_power_far_out_in_the_tail_is_finite_and_rises_with_the_effect(df):
    """One side at a ceiling (accuracy 1.0 in every seed) leaves Welch one degree of freedom and a tiny
    standard error: the power and the detectable difference must still be numbers."""
    powers = [significance.t_power(nc, df) for nc in (2.0, 12.1, 30.1, 60.0)]
    assert all(math.isfinite(p) for p in powers) and powers == sorted(powers) and powers[-1] > 0.99
    ref, lvl = [1.0, 1.0], [0.9995, 1.0]
    c = significance.welch(ref, lvl)
    assert math.isfinite(c.detectable) and 0 < c.detectable < 0.05
