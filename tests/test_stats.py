"""The replication's statistics (replication/stats.py): hand-computed values and scipy as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from rltldr_jax.replication.stats import bootstrap_band, paired_bootstrap, tost, unpaired_bootstrap, welch

A = [0.30, 0.25, 0.40, 0.35, 0.20]
B = [0.10, 0.05, 0.15, 0.00, 0.10]


def test_welch_matches_scipy_and_the_hand_formula():
    w = welch(A, B)
    ref = sps.ttest_ind(A, B, equal_var=False)
    assert w.t == pytest.approx(ref.statistic) and w.p == pytest.approx(ref.pvalue)
    # se^2 = var(A)/5 + var(B)/5 = 0.00625/5 + 0.00325/5
    assert w.diff == pytest.approx(0.22) and w.se == pytest.approx(math.sqrt(0.0095 / 5))
    assert math.isnan(welch([0.1], B).p) and math.isnan(welch([0.1, 0.1], [0.2, 0.2]).p)  # too few / no variance


def test_tost_equivalence_within_the_margin():
    many = A * 4  # 20 seeds
    same = tost(many, [x + 0.01 for x in many], margin=0.10)
    assert same.diff == pytest.approx(-0.01) and same.p < 0.001  # 1 point apart, ±10 allowed: equivalent
    assert tost(A, [x + 0.01 for x in A], margin=0.10).p > 0.05  # the same gap on 5 seeds: not shown
    far = tost(A, B, margin=0.10)
    assert far.p > 0.5  # 22 points apart: not equivalent
    # By hand: the two one-sided Welch tests at diff ± margin.
    w = welch(A, B)
    assert far.p_lower == pytest.approx(sps.t.sf((w.diff + 0.10) / w.se, w.df))
    assert far.p_upper == pytest.approx(sps.t.cdf((w.diff - 0.10) / w.se, w.df))
    with pytest.raises(ValueError, match="margin must be > 0"):
        tost(A, B, margin=0.0)


def test_paired_bootstrap_pairs_by_seed():
    a = {0: 0.3, 1: 0.5, 2: 0.4, 7: 0.9}
    b = {0: 0.1, 1: 0.2, 2: 0.2, 3: 0.0}  # seed 7 and seed 3 have no pair
    interval = paired_bootstrap(a, b, resamples=2000, seed=1)
    assert interval.n == 3 and interval.paired and interval.diff == pytest.approx((0.2 + 0.3 + 0.2) / 3)
    assert 0.2 - 1e-12 <= interval.low <= interval.diff <= interval.high <= 0.3 + 1e-12 and interval.excludes_zero()
    assert paired_bootstrap(a, b, resamples=2000, seed=1) == interval  # seeded: reproducible to the digit
    constant = paired_bootstrap({s: 0.5 for s in range(5)}, {s: 0.25 for s in range(5)})
    assert constant.low == constant.high == constant.diff == 0.25
    assert math.isnan(paired_bootstrap({0: 0.1}, {0: 0.0}).low)


def test_unpaired_bootstrap_covers_the_difference():
    interval = unpaired_bootstrap(A, B, seed=3)
    assert interval.diff == pytest.approx(np.mean(A) - np.mean(B)) and not interval.paired
    assert interval.low < interval.diff < interval.high and interval.excludes_zero()
    overlap = unpaired_bootstrap(A, A[::-1], seed=3)
    assert overlap.diff == pytest.approx(0.0) and not overlap.excludes_zero()


def test_bootstrap_band_resamples_whole_seeds():
    # two seeds: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so the 95 % band is [0, 1] where
    # the seeds differ by 1, and a point where they agree has no width
    low, high = bootstrap_band(np.array([[0.0, 0.3, 0.0], [1.0, 0.3, 0.5]]))
    assert low.tolist() == [0.0, 0.3, 0.0] and high.tolist() == [1.0, 0.3, 0.5]
    # one set of seeds per resample for every point: two points equal in every seed have the same band
    ys = np.array([[0.1, 0.1], [0.4, 0.4], [0.2, 0.2], [0.9, 0.9]])
    low, high = bootstrap_band(ys, seed=5)
    assert low[0] == low[1] and high[0] == high[1] and low[0] < ys.mean() < high[0]
    assert all(math.isnan(x) for x in np.concatenate(bootstrap_band(np.array([[0.2, 0.3]]))))  # one seed: none
    with pytest.raises(ValueError, match=r"\[seeds, points\]"):
        bootstrap_band(np.array([0.1, 0.2]))
