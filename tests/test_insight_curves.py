"""Insight exploration curves (Fig. 11/12): the Pass@k maths of each mode on hand-built records, and an end-to-end
run of all three modes on the tiny policy (random weights, rule-based insights)."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from helpers import tiny_settings

from rltldr_jax.agent.eval_set import eval_tasks
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.analysis import insight_curves as ic
from rltldr_jax.envs import make_env
from rltldr_jax.metrics import AttemptRecord
from rltldr_jax.settings import replace

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(outcomes: dict[str, list[bool]], seed: int = 0) -> list[AttemptRecord]:
    """AttemptRecords of {task: [success of attempt 1, 2, ...]}, in a shuffled order."""
    recs = [AttemptRecord(t, i + 1, ok, had_insights=i > 0) for t, oks in outcomes.items() for i, ok in enumerate(oks)]
    random.Random(seed).shuffle(recs)
    return recs


# Task a: first success at attempt 2; b: never; c: successes at 1 and 4; d: only 2 attempts (left out at max_k=4).
OUTCOMES = {"a": [False, True, False, False], "b": [False] * 4, "c": [True, False, False, True], "d": [True, True]}


def test_chain_modes_count_a_task_from_its_first_success():
    for mode in ("latest", "sequential"):
        curve, n = ic.curve_from_records(_records(OUTCOMES), mode, max_k=4)
        # solved within the first k: a = [0,1,1,1], b = [0,0,0,0], c = [1,1,1,1]; d has < 4 attempts.
        assert n == 3
        np.testing.assert_allclose(curve, [1 / 3, 2 / 3, 2 / 3, 2 / 3])
    curve, n = ic.curve_from_records(_records(OUTCOMES), "sequential", max_k=2)
    assert n == 4  # d counts at max_k = 2: solved at k = 1
    np.testing.assert_allclose(curve, [2 / 4, 3 / 4])


def test_iid_uses_the_unbiased_estimator_over_all_samples():
    curve, n = ic.curve_from_records(_records(OUTCOMES), "iid", max_k=4)
    # N = 4: a (c=1) Pass@k = k/4; b = 0; c (c=2) Pass@1 = 1/2, Pass@2 = 1 - C(2,2)/C(4,2) = 5/6, Pass@3 = Pass@4 = 1.
    assert n == 3
    np.testing.assert_allclose(curve, [(0.25 + 0.5) / 3, (0.5 + 5 / 6) / 3, (0.75 + 1) / 3, 2 / 3])
    # N = 6 > max_k: one success at attempt 6 gives Pass@k = k/6 for iid, while no chain solves it within 4 attempts.
    six = _records({"e": [False] * 5 + [True]})
    np.testing.assert_allclose(ic.curve_from_records(six, "iid", max_k=4)[0], [1 / 6, 2 / 6, 3 / 6, 4 / 6])
    np.testing.assert_allclose(ic.curve_from_records(six, "sequential", max_k=4)[0], [0, 0, 0, 0])
    empty, n_empty = ic.curve_from_records(six, "latest", max_k=7)
    assert n_empty == 0 and empty.shape == (7,) and np.isnan(empty).all()


def test_modes_schedules_and_errors():
    assert ic.parse_modes("sequential, iid,iid") == ("sequential", "iid")
    with pytest.raises(ValueError, match="unknown mode.*'grpo'.*choose from iid, latest, sequential"):
        ic.parse_modes("iid,grpo")
    with pytest.raises(ValueError, match="no mode given"):
        ic.parse_modes(",")
    assert [ic.expected_insights(m, k, 16) for m in ic.MODES for k in (1, 2, 5)] == [0, 0, 0, 0, 1, 1, 0, 1, 4]
    assert ic.expected_insights("sequential", 20, 16) == 16
    # The schedules insert after every failure regardless of the success rate: after a success too.
    for mode, want in (("iid", []), ("latest", ["h2"]), ("sequential", ["h1", "h2"])):
        s = ic.schedule_for(mode, 16)
        s.record("t", False, "h1")
        s.record("t", True)
        s.record("t", False, "h2")
        s.record("t", True)
        assert s.success_rate("t") == 0.5 and [i.text for i in s.insights_for("t")] == want


def _config():
    return tiny_settings(
        {
            "rollout.max_steps": 1,
            "rollout.max_think_tokens": 4,
            "rollout.max_action_tokens": 8,
            "eval.num_tasks": 2,
            "insight.max_insights": 16,
        }
    )


def test_curve_tasks_select_like_eval_tasks():
    c = _config()  # the eval split only: generating SAPI's 16k train tasks takes ~7 s
    picked = ic.curve_tasks(c, split="eval")
    assert len(picked) == 2 and [t.task_id for t in picked] == [t.task_id for t in eval_tasks(c)]
    more = ic.curve_tasks(c, split="eval", num_tasks=3)  # the same seeded order, one more task
    assert len(more) == 3 and more[:2] == picked
    c = replace(c, {"env.train_split": "eval"})
    assert ic.curve_tasks(c) == picked  # the default split is env.train_split
    ids = [t.task_id for t in more]
    assert sorted(t.task_id for t in ic.curve_tasks(c, num_tasks=0, task_ids=ids[::-1])) == sorted(ids)
    assert len(ic.curve_tasks(c, num_tasks=2, task_ids=ids)) == 2
    with pytest.raises(ValueError, match="1 task id"):
        ic.curve_tasks(c, task_ids=[ids[0], "no-such-task"])


@pytest.fixture(scope="module")
def curves(tiny_policy, builder, tmp_path_factory):
    """All three modes on 2 tasks, max_k = 3, with the session's tiny engine; the written files' directory."""
    _, engine = tiny_policy
    c = _config()
    tasks = ic.curve_tasks(c, split="eval")
    writer = InsightWriter.of(c, builder.tokenizer, engine)
    seen: list[str] = []
    results = ic.insight_curves(
        engine,
        builder,
        c,
        tasks=tasks,
        make_env=lambda: make_env("sapi", step_timeout_s=5.0),
        writer=writer,
        max_k=3,
        on_mode=lambda r: seen.append(r.mode),
    )
    out = tmp_path_factory.mktemp("curves")
    paths = ic.write_curves(results, out)
    return results, seen, out, paths


def test_insights_in_context_per_mode(curves):
    results, seen, _, _ = curves
    assert seen == ["iid", "latest", "sequential"] and list(results) == seen
    for mode, r in results.items():
        groups = r.phase.groups()
        assert r.n_tasks == 2 and len(groups) == 2 and len(r.phase.attempts) == 6
        for group in groups.values():
            assert [a.index for a in group] == [1, 2, 3]
            assert not any(a.success for a in group)  # a random policy fails: every insight slot is filled
            counts = [len(a.insights) for a in group]
            assert counts == {"iid": [0, 0, 0], "latest": [0, 1, 1], "sequential": [0, 1, 2]}[mode]
            assert counts == [ic.expected_insights(mode, k, 16) for k in (1, 2, 3)]
            for a in group:  # the insight texts are those of the earlier failures: the latest one, or all
                earlier = [rule_insight(e.verdict.report) for e in group[: a.index - 1]]
                want = {"iid": [], "latest": earlier[-1:], "sequential": earlier}[mode]
                assert [i.text for i in a.insights] == want
        np.testing.assert_allclose(
            r.mean_insights, {"iid": [0, 0, 0], "latest": [0, 1, 1], "sequential": [0, 1, 2]}[mode]
        )
        assert len(r.phase.writer_outputs) == (0 if mode == "iid" else 6)
    # Same phase tag in every mode: attempt 1 (no insight anywhere) is the same sample (common random numbers).
    firsts = {m: {t: g[0].steps[0].action_ids for t, g in r.phase.groups().items()} for m, r in results.items()}
    assert firsts["iid"] == firsts["latest"] == firsts["sequential"]


def test_curves_and_written_files(curves):
    results, _, out, paths = curves
    assert sorted(os.path.basename(p) for p in paths) == [
        "insight_curves.csv",
        "insight_curves.png",
        "insight_curves_attempts.csv",
    ]
    for mode in ("latest", "sequential"):
        assert np.all(np.diff(results[mode].pass_at_k) >= 0)
    for r in results.values():
        np.testing.assert_array_equal(r.pass_at_k, [0.0, 0.0, 0.0])  # nothing solved by random weights
    with open(os.path.join(out, "insight_curves.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["mode", "k", "pass_at_k", "n_tasks", "mean_insights"]
    assert [(r["mode"], int(r["k"])) for r in rows] == [(m, k) for m in ic.MODES for k in (1, 2, 3)]
    assert all(float(r["pass_at_k"]) == 0.0 and int(r["n_tasks"]) == 2 for r in rows)
    assert [float(r["mean_insights"]) for r in rows] == [0, 0, 0, 0, 1, 1, 0, 1, 2]
    with open(os.path.join(out, "insight_curves_attempts.csv"), newline="") as f:
        attempts = list(csv.DictReader(f))
    assert len(attempts) == 18 and sum(int(a["n_insights"]) for a in attempts) == 2 * (0 + 2 + 3)
    with open(os.path.join(out, "insight_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_a_bad_mode():
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "launch", "insight_curves.py"),
            "--config=configs/sapi.py:tiny",
            "--modes=iid,grpo",
        ],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "unknown mode(s) 'grpo'; choose from iid, latest, sequential" in proc.stderr
