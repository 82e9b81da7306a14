"""InsightSchedule: hand-worked attempt sequences for every policy, the n_fb cap, phase reset, checkpoints."""

from __future__ import annotations

import json

import pytest

from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.config.base import get_config
from rltldr_jax.settings import build, settings_of
from rltldr_jax.tokenization import Insight


def _texts(schedule: InsightSchedule, task: str = "t") -> list[tuple[str, int]]:
    return [(i.text, i.attempt) for i in schedule.insights_for(task)]


def test_threshold_hand_worked():
    s = InsightSchedule("threshold", threshold=0.5)
    assert s.insights_for("t") == []  # nothing recorded
    s.record("t", True, None, 1)  # 1/1 = 1.0 > 0.5; and no insight yet
    assert s.insights_for("t") == [] and s.success_rate("t") == 1.0
    s.record("t", False, "Sort the notes.", 2)  # 1/2 = 0.5 <= 0.5, one insight
    assert s.success_rate("t") == 0.5
    assert _texts(s) == [("Sort the notes.", 2)]
    assert all(isinstance(i, Insight) for i in s.insights_for("t"))
    s.record("t", True, None, 3)  # 2/3 > 0.5: no insertion although insights exist
    assert s.insights_for("t") == []
    s.record("t", False, "Paginate.", 4)  # 2/4 = 0.5: both, oldest first
    assert _texts(s) == [("Sort the notes.", 2), ("Paginate.", 4)]
    assert s.insights_for("other") == []  # per task


def test_threshold_needs_an_insight_and_respects_other_thresholds():
    s = InsightSchedule("threshold", threshold=0.1)
    s.record("t", False, None, 1)  # 0 successes, but no insight (e.g. a parse failure)
    assert s.insights_for("t") == []
    s.record("t", False, "Use cash.", 2)
    assert _texts(s) == [("Use cash.", 2)]
    for n in range(3, 11):  # 1 success in 10 = 0.1 <= 0.1
        s.record("t", n == 3, None, n)
    assert _texts(s) == [("Use cash.", 2)]
    s.record("t", True, None, 11)  # 2/11 > 0.1
    assert s.insights_for("t") == []


def test_first_k_hand_worked():
    s = InsightSchedule("first_k", first_k=10, first_k_max_successes=3)
    s.record("t", False, "A.", 1)
    assert _texts(s) == [("A.", 1)]
    for n in (2, 3, 4):  # 3 successes among the first 4: still <= 3
        s.record("t", True, None, n)
    assert _texts(s) == [("A.", 1)]  # success rate 0.75 would stop `threshold`, not this rule
    s.record("t", True, None, 5)  # 4 successes among the first 10: stop
    assert s.insights_for("t") == []
    for n in range(6, 11):
        s.record("t", False, f"I{n}.", n)
    assert s.insights_for("t") == []  # the first 10 had 4 successes: decided for the phase


def test_first_k_ignores_attempts_after_the_window():
    s = InsightSchedule("first_k", first_k=4, first_k_max_successes=1)
    s.record("t", True, None, 1)
    s.record("t", False, "A.", 2)
    s.record("t", False, None, 3)
    s.record("t", False, None, 4)
    for n in range(5, 9):  # successes after attempt 4 do not count
        s.record("t", True, None, n)
    assert _texts(s) == [("A.", 2)]
    # Out-of-order arrival (concurrent chains): attempt numbers, not arrival order, define the window.
    s2 = InsightSchedule("first_k", first_k=2, first_k_max_successes=0)
    s2.record("t", True, None, 3)
    s2.record("t", False, "B.", 1)
    assert _texts(s2) == [("B.", 1)]
    s2.record("t", True, None, 2)
    assert s2.insights_for("t") == []


def test_never_and_always():
    never, always = InsightSchedule("never"), InsightSchedule("always")
    for s in (never, always):
        s.record("t", True, None, 1)
        s.record("t", True, None, 2)
        s.record("t", False, "X.", 3)
    assert never.insights_for("t") == []
    assert _texts(always) == [("X.", 3)]  # success rate 2/3, inserted anyway
    assert not always.should_insert("u")


def test_cap_keeps_the_most_recent_oldest_first():
    s = InsightSchedule("always", max_insights=2)
    for n in (1, 2, 3, 4):
        s.record("t", False, f"I{n}.", n)
    assert _texts(s) == [("I3.", 3), ("I4.", 4)]
    # Insights that arrive after their result, out of order, are still ordered by attempt number.
    s2 = InsightSchedule("always", max_insights=3)
    for n in (1, 2, 3, 4):
        s2.record("t", False, None, n)
    for n in (4, 1, 3, 2):
        s2.add_insight("t", f"I{n}.", n)
    assert _texts(s2) == [("I2.", 2), ("I3.", 3), ("I4.", 4)]


def test_phase_reset():
    s = InsightSchedule("threshold")
    s.record("t", False, "Old.", 1)
    assert _texts(s) == [("Old.", 1)]
    s.reset()
    assert s.insights_for("t") == [] and s.success_rate("t") is None and s.num_attempts("t") == 0
    s.record("t", False, None, 1)  # attempt numbers restart with the phase
    assert s.insights_for("t") == []  # the old phase's insight is gone


def test_record_numbers_and_errors():
    s = InsightSchedule("always")
    assert s.record("t", False, "A.") == 1 and s.record("t", False) == 2
    with pytest.raises(ValueError, match="already recorded"):
        s.record("t", True, None, 2)
    with pytest.raises(ValueError, match="already has an insight"):
        s.add_insight("t", "again", 1)
    with pytest.raises(ValueError, match="1-based"):
        s.record("t", True, None, 0)
    s.record("t", False, "   ", 3)  # blank insight texts are ignored
    assert _texts(s) == [("A.", 1)]
    with pytest.raises(ValueError, match="unknown insight schedule"):
        InsightSchedule("sometimes")


def test_state_restore_roundtrip_through_json():
    s = InsightSchedule("threshold", max_insights=3)
    s.record("a", False, "A1.", 1)
    s.record("a", True, None, 2)
    s.record("b", True, None, 1)
    state = json.loads(json.dumps(s.state()))
    r = InsightSchedule("threshold", max_insights=3)
    r.restore(state)
    assert r.state() == s.state()
    assert _texts(r, "a") == _texts(s, "a") == [("A1.", 1)]
    assert r.success_rate("b") == 1.0
    assert r.record("a", False) == 3  # continues numbering after the restored attempts


def test_built_from_the_insight_settings():
    config = get_config()
    s = build(InsightSchedule, settings_of(config).insight)
    assert (s.policy, s.threshold, s.first_k, s.first_k_max_successes, s.max_insights) == ("threshold", 0.5, 10, 3, 16)
    config.insight.schedule, config.insight.max_insights = "first_k", 1
    s = build(InsightSchedule, settings_of(config).insight)
    assert s.policy == "first_k" and s.max_insights == 1
