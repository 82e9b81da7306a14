"""The three numbers of an evaluation curve (replication/measures.py), hand-computed."""

from __future__ import annotations

import math

import pytest

from rltldr_jax.replication.measures import area_under_curve, eval_measures, selected_index

EVALS = [
    {"env_steps": 0, "eval/pass@1/all": 0.0, "eval_valid/pass@1/all": 0.1, "eval_tier2/pass@1/all": 0.0},
    {"env_steps": 100, "eval/pass@1/all": 0.4, "eval_valid/pass@1/all": 0.5, "eval_tier2/pass@1/all": 0.2},
    {"env_steps": 300, "eval/pass@1/all": 0.2, "eval_valid/pass@1/all": 0.5, "eval_tier2/pass@1/all": 0.3},
    {"env_steps": 400, "eval/pass@1/all": 0.1, "eval_valid/pass@1/all": math.nan, "eval_tier2/pass@1/all": 0.1},
]


def test_the_selected_evaluation_is_the_earliest_best_on_validation():
    assert selected_index(EVALS, "eval_valid/pass@1/all") == 1  # 0.5 at steps 100 and 300: the earlier; NaN never wins
    assert selected_index(EVALS, "eval_nope/pass@1/all") is None
    assert selected_index([], "eval_valid/pass@1/all") is None


def test_area_under_the_curve_is_the_time_average():
    # (100 * (0 + 0.4) / 2 + 200 * (0.4 + 0.2) / 2 + 100 * (0.2 + 0.1) / 2) / 400 = (20 + 60 + 15) / 400
    assert area_under_curve([0, 100, 300, 400], [0.0, 0.4, 0.2, 0.1]) == pytest.approx(95 / 400)
    assert area_under_curve([0, 100, 300], [0.1, 0.5, math.nan]) == pytest.approx(0.3)  # NaN points are skipped
    assert area_under_curve([50], [0.25]) == 0.25 and math.isnan(area_under_curve([1, 2], [math.nan, math.nan]))


def test_eval_measures_of_every_evaluation_metric():
    m = eval_measures(EVALS, select_on="eval_valid/pass@1/all")
    assert m["selected_index"] == 1
    assert m["final"]["eval/pass@1/all"] == 0.1 and m["final"]["eval_tier2/pass@1/all"] == 0.1
    assert m["selected"]["eval/pass@1/all"] == 0.4 and m["selected"]["eval_tier2/pass@1/all"] == 0.2
    # tier 2: (100 * 0.1 + 200 * 0.25 + 100 * 0.2) / 400
    assert m["auc"]["eval_tier2/pass@1/all"] == pytest.approx(80 / 400)
    assert m["auc"]["eval_valid/pass@1/all"] == pytest.approx((100 * 0.3 + 200 * 0.5) / 300)
    unselected = eval_measures(EVALS)
    assert unselected["selected"] == {} and unselected["selected_index"] is None
    assert eval_measures([]) == {"final": {}, "selected": {}, "auc": {}, "selected_index": None}
