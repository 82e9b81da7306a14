"""Deconfounded metrics (App. D) on hand-built attempt records with known answers."""

import math

import numpy as np
import pytest

from rltldr_jax.metrics import (
    AttemptRecord,
    insight_advantage,
    insight_pass_at_k_curve,
    insight_too_easy_ratio,
    insight_too_hard_ratio,
    macro_pass_at_1,
    macro_pass_at_all,
    macro_pass_at_k,
    pass_at_k,
    summarize,
)


def _task(task_id, outcomes, insight_from=2):
    """Attempts 1..n with the given successes; attempts >= insight_from had insights in context."""
    return [
        AttemptRecord(task_id, k, bool(s), had_insights=k >= insight_from, env_steps=3, tokens=100)
        for k, s in enumerate(outcomes, start=1)
    ]


# A: F F T T (insights from attempt 2)      B: F F (no insights at all)
# C: F F F (insights from 2)                D: F T (insight at 2)
RECORDS = _task("A", [0, 0, 1, 1]) + _task("B", [0, 0], insight_from=99) + _task("C", [0, 0, 0]) + _task("D", [0, 1])


def test_macro_pass_at_1():
    # per task: A 2/4, B 0, C 0, D 1/2 -> mean 0.25 (a micro average would give 3/11)
    assert macro_pass_at_1(RECORDS) == pytest.approx(0.25)
    # without insights: A 0/1, B 0/2, C 0/1, D 0/1 -> 0
    assert macro_pass_at_1(RECORDS, insights=False) == 0.0
    # with insights: A 2/3, C 0/2, D 1/1 -> 5/9
    assert macro_pass_at_1(RECORDS, insights=True) == pytest.approx(5 / 9)
    # macro, not micro: one task with many attempts does not dominate
    many = _task("E", [1] * 20, insight_from=99) + _task("F", [0], insight_from=99)
    assert macro_pass_at_1(many) == pytest.approx(0.5)


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 − C(2,2)/C(4,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n − c < k
    assert pass_at_k(200, 1, 100) == pytest.approx(1 - math.comb(199, 100) / math.comb(200, 100))
    for bad in [(3, 4, 1), (3, 1, 4), (3, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_macro_pass_at_k_and_all():
    # k=2: A 1−C(2,2)/C(4,2)=5/6, B 0, C 0, D 1−C(1,2)/C(2,2)=1 -> (5/6 + 1)/4
    assert macro_pass_at_k(RECORDS, 2) == pytest.approx((5 / 6 + 1) / 4)
    # k=3: only A (4 attempts, 1) and C (3 attempts, 0) qualify
    assert macro_pass_at_k(RECORDS, 3) == pytest.approx(0.5)
    assert math.isnan(macro_pass_at_k(RECORDS, 8))
    assert macro_pass_at_all(RECORDS) == pytest.approx(0.5)  # A and D solved at least once


def test_insight_advantage_uses_tasks_with_both_kinds():
    # A: 2/3 − 0/1; C: 0/2 − 0/1; D: 1/1 − 0/1; B has no insight attempts -> mean(2/3, 0, 1)
    assert insight_advantage(RECORDS) == pytest.approx((2 / 3 + 0 + 1) / 3)


def test_too_easy_and_too_hard_ratios():
    # Tasks with insight attempts: A (some succeed), C (none), D (all) -> easy 1/3, hard 1/3
    assert insight_too_easy_ratio(RECORDS) == pytest.approx(1 / 3)
    assert insight_too_hard_ratio(RECORDS) == pytest.approx(1 / 3)
    assert math.isnan(insight_too_easy_ratio(_task("B", [0, 0], insight_from=99)))


def test_insight_pass_at_k_curve():
    # max_k=2 over A, B, C, D: solved within 2 attempts -> D only at k=2
    np.testing.assert_allclose(insight_pass_at_k_curve(RECORDS, max_k=2), [0.0, 0.25])
    # max_k=3 over A (F F T) and C (F F F): attempts out of order must be sorted first
    shuffled = list(reversed(RECORDS))
    np.testing.assert_allclose(insight_pass_at_k_curve(shuffled, max_k=3), [0.0, 0.0, 0.5])
    assert np.isnan(insight_pass_at_k_curve(RECORDS, max_k=5)).all()


def test_summarize():
    s = summarize(RECORDS, pass_k=2)
    assert s["pass@1/all"] == pytest.approx(0.25)
    assert s["pass@1/no_insight"] == 0.0
    assert s["pass@2/all"] == pytest.approx((5 / 6 + 1) / 4)
    assert s["counts/tasks"] == 4 and s["counts/attempts"] == 11
    assert s["counts/env_steps"] == 33 and s["counts/tokens"] == 1100
    assert s["insight/attempt_fraction"] == pytest.approx(6 / 11)


def test_summaries_do_not_depend_on_the_order_attempts_finished():
    """Attempt chains finish in whatever order the engine serves them: the summary is the same, bit for bit, in any
    order (a float mean over tasks in arrival order differed in its last digit between two runs of one seed)."""
    rng = np.random.default_rng(0)
    records = [
        r for t in range(40) for r in _task(f"t{t}", rng.integers(0, 2, 1 + t % 7).tolist(), insight_from=1 + t % 3)
    ]
    first = summarize(records, pass_k=2)
    orders = [rng.permutation(len(records)) for _ in range(20)]
    assert all(summarize([records[i] for i in order], pass_k=2) == first for order in orders)
