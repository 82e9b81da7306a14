"""Rollout analyses (E.2 revisits, E.4 insight evolution, Table 5 categories, E.5 reliance) and their CLI.

The rollouts are real `save_phase` files of hand-made attempts; every expected number is computed by hand in the
comments (model-free analyses) or independently with the model's forward pass (reliance).
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from rltldr_jax.agent.collector import PhaseResult
from rltldr_jax.agent.episode import Attempt, StepRecord, task_text
from rltldr_jax.agent.insight import WriterOutput
from rltldr_jax.agent.rollout_files import load_rollouts, save_phase
from rltldr_jax.analysis import rollouts as ro
from rltldr_jax.envs.base import Task, Verdict
from rltldr_jax.tokenization import Insight, Step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, F = True, False  # success, failure
W, N = True, False  # with / without insights in context


def _read_csv(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def _csv_dicts(path) -> list[dict[str, str]]:
    header, *rows = _read_csv(path)
    return [dict(zip(header, row, strict=True)) for row in rows]


# Insights written after failures (content words after stop-word removal in the comments).
I1 = "Use the uppercase Orange enum value."  # {use, uppercase, orange, enum, value}
I2 = "Use the uppercase orange color enum."  # {use, uppercase, orange, color, enum}
I3 = "Remove the route_type filter to see all trails."  # {remove, route_type, filter, see, trails}
I4 = "Mark the article as read."  # {mark, article, read}
I5 = "Mark the article as read before finishing."  # {mark, article, read, finishing}
I6 = "Pass the access token as the first positional argument."  # {pass, access, token, first, positional, argument}
I7 = "Pass the access token as the first positional argument, not as a keyword argument."  # I6 + {keyword}
I_EXTRA = "Call complete_task without passing an answer parameter."
I_UNSAVED = "The list sorting preference needs to be saved to the database."
I_OTHER1 = "You need to confirm the brand ownership before adding items to cart."
I_OTHER2 = "Use cash instead of checking as the account type."


def _task(name: str) -> Task:
    return Task(f"sapi/{name}", f"Do task {name}.", "sapi", "train", {"n": name})


def _attempt(
    task: Task, index: int, success: bool, insights=(), steps: tuple[StepRecord, ...] | None = None
) -> Attempt:
    if steps is None:
        steps = (StepRecord((1, 2, 3), (False,) * 3, (-0.5,) * 3, "x = 1", "ok", 0),)
    report = "" if success else "FAILED: assert x == 1"
    return Attempt(task, index, tuple(insights), steps, "completed", Verdict(success, report, int(success), 1))


def _phase(spec) -> PhaseResult:
    """spec: [(task name, [(success, with_insights, written insight or None), ...])] → a PhaseResult."""
    attempts, writer_outputs = [], []
    for name, runs in spec:
        task, written = _task(name), []
        for index, (success, with_insights, insight) in enumerate(runs, 1):
            shown = [Insight(t, a) for a, t in written] if with_insights else []
            if with_insights and not shown:
                shown = [Insight("An earlier hint.", 1)]
            attempts.append(_attempt(task, index, success, shown))
            if insight is not None:
                writer_outputs.append((task.task_id, index, WriterOutput(insight, {"hint": insight}, None, 0, 0)))
                written.append((index, insight))
    return PhaseResult(tuple(attempts), tuple(writer_outputs))


# Phases 0..3 (halves: 0-1 | 2-3). Success without insight per visit in the comments.
PHASES = {
    0: [
        ("A", [(F, N, I1), (F, W, I2), (S, W, None)]),  # plain [F] → 0.0
        ("B", [(F, N, I4), (S, N, None)]),  # plain [F, S] → 0.5
        ("C", [(F, N, I_UNSAVED), (F, N, None)]),  # never revisited, 1st half: 0.0
    ],
    1: [
        ("A", [(S, N, None), (F, N, I3)]),  # plain [S, F] → 0.5
        ("D", [(S, N, None), (F, N, I_EXTRA), (F, N, None), (F, N, None)]),  # never revisited, 1st half: 0.25
        ("G", [(F, N, I6)]),  # plain [F] → 0.0
    ],
    2: [
        ("B", [(S, N, None), (F, W, I5), (F, W, I5)]),  # plain [S] → 1.0
        ("E", [(S, N, None), (F, W, I_OTHER2)]),  # never revisited, 2nd half: 1.0
        ("G", [(F, W, I7)]),  # no attempt without insight → G is revisited but unpaired
    ],
    3: [
        ("A", [(S, N, None), (S, N, None)]),  # plain [S, S] → 1.0
        ("F", [(F, N, I_OTHER1), (S, N, None)]),  # never revisited, 2nd half: 0.5
        ("H", [(S, W, None)]),  # never revisited, no attempt without insight → left out
    ],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    for phase, spec in PHASES.items():
        save_phase(run / "rollouts" / f"phase_{phase:05d}.jsonl", phase, _phase(spec))
    return run


@pytest.fixture(scope="module")
def records(run_dir):
    return load_rollouts(run_dir)


def test_load_rollouts_rebuilds_the_saved_attempts(run_dir, records):
    assert len(records) == sum(len(runs) for spec in PHASES.values() for _, runs in spec)
    assert len(records) == 25 and [r.phase for r in records] == sorted(r.phase for r in records)
    a0 = [r for r in records if r.task_id == "sapi/A" and r.phase == 0]
    assert [r.attempt.index for r in a0] == [1, 2, 3] and [r.written_insight for r in a0] == [I1, I2, None]
    assert a0[2].attempt.insights == (Insight(I1, 1), Insight(I2, 2)) and a0[2].success
    assert a0[0].attempt.task == _task("A") and a0[0].attempt.steps[0].action_ids == (1, 2, 3)
    assert load_rollouts(run_dir / "rollouts")[5] == records[5]  # the rollouts directory itself works too
    assert ro.phase_split(records) == 2.0  # (0 + 3 + 1) / 2: phases 0, 1 | 2, 3


def test_load_rollouts_errors_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"rollout\.save_rollouts=True"):
        load_rollouts(tmp_path)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "phase_00000.jsonl").write_text('{"phase": 0}\n')
    with pytest.raises(ValueError, match=r"phase_00000\.jsonl:1 is not a rollout record"):
        load_rollouts(tmp_path)


def test_content_words_and_jaccard():
    assert ro.content_words(I1) == {"use", "uppercase", "orange", "enum", "value"}
    assert ro.content_words(I3) == {"remove", "route_type", "filter", "see", "trails"}
    assert ro.content_words("It is not the one you don't want.") == {"one", "want"}
    assert ro.jaccard_dissimilarity(I1, I2) == pytest.approx(1 - 4 / 6)  # 4 shared of 6 words
    assert ro.jaccard_dissimilarity(I4, I5) == pytest.approx(1 - 3 / 4)
    assert ro.jaccard_dissimilarity(I6, I7) == pytest.approx(1 - 6 / 7)
    assert ro.jaccard_dissimilarity(I1, I3) == 1.0 and ro.jaccard_dissimilarity(I5, I5) == 0.0
    assert ro.jaccard_dissimilarity("the of", "and a") == 0.0  # no content word on either side


def test_insight_evolution(records):
    res = ro.insight_evolution(records)
    by = {t.task_id: t for t in res.tasks}
    assert set(by) == {"sapi/A", "sapi/B", "sapi/G"}  # tasks with written insights in >= 2 phases
    a, b, g = by["sapi/A"], by["sapi/B"], by["sapi/G"]
    # A: first visit phase 0 {I1, I2}, last visit with insights phase 1 {I3} (phase 3 wrote none).
    assert (a.first_phase, a.last_phase, a.n_first, a.n_last) == (0, 1, 2, 1)
    assert a.within == pytest.approx(1 / 3) and a.n_within_pairs == 1
    assert a.across == 1.0 and a.n_across_pairs == 2
    # B: {I4} then {I5, I5}: the only within pair is identical.
    assert (b.within, b.n_within_pairs, b.n_across_pairs) == (0.0, 1, 2) and b.across == pytest.approx(0.25)
    assert math.isnan(g.within) and g.across == pytest.approx(1 / 7)
    assert (res.n_tasks, res.n_within) == (3, 2)
    assert res.mean_within == pytest.approx((1 / 3 + 0.0) / 2)
    assert res.mean_across == pytest.approx((1.0 + 0.25 + 1 / 7) / 3)


def _exact_sign_flip_p(d) -> float:
    """Independent reference: enumerate all sign assignments."""
    d = np.asarray(d, float)
    obs = abs(d.sum())
    sums = [abs(np.dot(s, d)) for s in itertools.product((-1.0, 1.0), repeat=len(d))]
    return float(np.mean([s >= obs - 1e-12 for s in sums]))


def test_paired_permutation_pvalue():
    # 5 differences of ±1 with sum 3: |sum| >= 3 for 1 + 5 + 5 + 1 = 12 of the 32 sign assignments.
    p, how = ro.paired_permutation_pvalue([1, 1, 1, 1, -1])
    assert p == pytest.approx(12 / 32) and "exact" in how
    assert ro.paired_permutation_pvalue([1.0, 0.5])[0] == pytest.approx(2 / 4)  # sums ±1.5, ±0.5
    assert ro.paired_permutation_pvalue([0.0, 1.0, 0.5, 0.0])[0] == pytest.approx(2 / 4)  # zeros dropped
    assert ro.paired_permutation_pvalue([0.0, 0.0]) == (1.0, "all paired differences are zero")
    assert math.isnan(ro.paired_permutation_pvalue([])[0])
    d = np.random.default_rng(3).normal(0.3, 1.0, 10)
    assert ro.paired_permutation_pvalue(d)[0] == pytest.approx(_exact_sign_flip_p(d), abs=1e-9)
    d = np.random.default_rng(4).normal(0.2, 1.0, 13)
    p, how = ro.paired_permutation_pvalue(d, max_resamples=4000)  # 2^13 > 4000: Monte Carlo
    assert "Monte Carlo" in how and p == pytest.approx(_exact_sign_flip_p(d), abs=0.03)


def test_revisited_tasks(records):
    res = ro.revisited_tasks(records)
    by = {t.task_id: t for t in res.tasks}
    assert set(by) == {"sapi/A", "sapi/B"} and res.unpaired_revisited == 1  # G: no plain attempt in phase 2
    assert (by["sapi/A"].first_phase, by["sapi/A"].last_phase, by["sapi/A"].first_rate, by["sapi/A"].last_rate) == (
        0,
        3,
        0.0,
        1.0,
    )
    assert (by["sapi/B"].first_rate, by["sapi/B"].last_rate, by["sapi/B"].n_first, by["sapi/B"].n_last) == (
        0.5,
        1.0,
        2,
        1,
    )
    assert res.n == 2 and res.mean_first == pytest.approx(0.25) and res.mean_last == pytest.approx(1.0)
    assert res.change == pytest.approx(0.75) and res.p_value == pytest.approx(0.5)  # differences 1.0, 0.5
    # Never revisited: C 0.0, D 0.25 (first half) vs E 1.0, F 0.5 (second half); H has no plain attempt.
    assert (res.never_n_first, res.never_n_second) == (2, 2)
    assert res.never_first == pytest.approx(0.125) and res.never_second == pytest.approx(0.75)
    assert res.never_change == pytest.approx(0.625) and res.split == 2.0


def test_insight_categories(records):
    assert (
        ro.classify_insight("Use uppercase PM instead of lowercase pm when setting the alarm.")
        == "Wrong capitalization"
    )
    assert (
        ro.classify_insight("Use uppercase PM when setting the alarm.") == "Wrong capitalization"
    )  # 1:1 tie → earlier
    assert ro.classify_insight(I_OTHER1) == "Other" and ro.classify_insight(I7) == "Argument position"
    assert ro.category_scores(I_EXTRA)["Extra parameter"] == 3  # "without passing", "answer parameter", "parameter"
    res = ro.insight_categories(records)
    # 12 written insights: I1, I2 | I3 | I4, I5, I5 | I6, I7 | extra | unsaved | other ×2
    expected = {
        "Wrong capitalization": 2,
        "Unrecorded action": 3,
        "Extra parameter": 1,
        "Unsaved setting": 1,
        "Over-filtering": 1,
        "Argument position": 2,
        "Other": 2,
    }
    assert res.n == 12 and res.counts == expected
    assert res.shares == pytest.approx({k: v / 12 for k, v in expected.items()}) and sum(
        res.shares.values()
    ) == pytest.approx(1)
    unique = ro.insight_categories(records, unique=True)  # B's I5 written twice in phase 2 counts once
    assert unique.n == 11 and unique.counts["Unrecorded action"] == 2


def test_writers(records, tmp_path):
    paths = ro.write_evolution(ro.insight_evolution(records), tmp_path)
    paths += ro.write_revisits(ro.revisited_tasks(records), tmp_path)
    paths += ro.write_categories(ro.insight_categories(records), tmp_path)
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        f"{n}{s}"
        for n, x in (("evolution", "tasks"), ("revisits", "tasks"), ("categories", "insights"))
        for s in (".csv", f"_{x}.csv", ".png")
    )
    for p in paths:
        if p.endswith(".png"):
            assert pathlib.Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(p) > 5000
    summary = dict(_read_csv(tmp_path / "revisits.csv"))
    assert float(summary["change"]) == pytest.approx(0.75) and float(summary["p_value"]) == pytest.approx(0.5)
    shares = {row[0]: float(row[2]) for row in _read_csv(tmp_path / "categories.csv")[1:]}
    assert shares["Unrecorded action"] == pytest.approx(0.25)


# ----------------------------------------------------------------------------------------------------
# Reliance (model-based)
# ----------------------------------------------------------------------------------------------------


def _step(tok, think: str, action: str, *, forced_close: bool = False, obs: str | None = "ok") -> StepRecord:
    think_ids = tok.encode(think)
    close = [tok.think_end_id, *tok.encode("\n\n")]
    action_ids = tok.encode(f"```python\n{action}\n```") + [tok.im_end_id]
    ids = (*think_ids, *close, *action_ids)
    forced = (False,) * len(think_ids) + (forced_close,) * len(close) + (False,) * len(action_ids)
    return StepRecord(ids, forced, (-1.0,) * len(ids), action, obs, 0)


@pytest.fixture(scope="module")
def reliance_run(tmp_path_factory, tokenizer):
    """Phase 0: R1 fails, then succeeds with its insight (2 steps, one forced `</think>`), then succeeds without.
    Phase 1: R2 succeeds with two insights (1 step), then fails with them. Scored: R1#2 and R2#2."""
    tok = tokenizer
    r1, r2 = _task("R1"), _task("R2")
    h1, h2, h3 = Insight(I1, 1), Insight(I3, 1), Insight(I4, 2)
    two = (
        _step(tok, "Check the docs.", "print(apis)", forced_close=True),
        _step(tok, "Done.", "apis.done()", obs=None),
    )
    phase0 = PhaseResult(
        (_attempt(r1, 1, F, (), two), _attempt(r1, 2, S, (h1,), two), _attempt(r1, 3, S, (), two)),
        ((r1.task_id, 1, WriterOutput(I1, {}, None, 0, 0)),),
    )
    one = (_step(tok, "Go.", "apis.go()", obs=None),)
    phase1 = PhaseResult((_attempt(r2, 2, S, (h2, h3), one), _attempt(r2, 3, F, (h2, h3), one)), ())
    run = tmp_path_factory.mktemp("reliance_run")
    save_phase(run / "rollouts" / "phase_00000.jsonl", 0, phase0)
    save_phase(run / "rollouts" / "phase_00001.jsonl", 1, phase1)
    return run


def _reference_reliance(model, builder, attempt: Attempt) -> tuple[float, int]:
    """Σ log π(action | with insights) − Σ log π(action | without), over the non-forced tokens of every step,
    from the model's hidden states, its output head and a full log-softmax (not the code under test, which uses
    the chunked `sequence_logprobs`); and the number of those tokens."""
    graphdef, state = nnx.split(model)
    hidden = jax.jit(lambda st, ids: nnx.merge(graphdef, st).hidden_states(ids)[0][0])  # [256] ids → [256, d]
    total, count = 0.0, 0
    for k, step in enumerate(attempt.steps):
        earlier = [Step(s.action_ids, s.observation, s.forced) for s in attempt.steps[:k]]
        current = Step(step.action_ids, None, step.forced)
        for sign, insights in ((1.0, attempt.insights), (-1.0, ())):
            ctx = builder.build(task_text(attempt.task), insights, earlier, current)
            pos = np.flatnonzero(ctx.action_mask)  # token t is predicted at position t - 1
            assert len(pos) == sum(not f for f in step.forced) and ctx.ids[pos[-1]] == builder.tokenizer.im_end_id
            h = hidden(state, np.pad(ctx.ids, (0, 256 - len(ctx)))[None])  # causal: the padding changes nothing
            logp = np.asarray(jax.nn.log_softmax(model.logits(h[None, pos - 1])[0], axis=-1), np.float64)  # [n, V]
            total += sign * logp[np.arange(len(pos)), ctx.ids[pos]].sum()
        count += len(pos)
    return total, count


@pytest.fixture(scope="module")
def reliance_result(reliance_run, builder, tiny_policy):
    from rltldr_jax.analysis.reliance import insight_reliance

    return insight_reliance(load_rollouts(reliance_run), tiny_policy[0], builder, batch_size=2)


def test_insight_reliance_matches_independent_logprobs(reliance_run, reliance_result, builder, tiny_policy, tmp_path):
    from rltldr_jax.analysis.reliance import insight_reliance, write_reliance

    model, _ = tiny_policy
    records = load_rollouts(reliance_run)
    res = reliance_result
    assert [(a.task_id, a.phase, a.attempt, a.n_insights) for a in res.attempts] == [
        ("sapi/R1", 0, 2, 1),
        ("sapi/R2", 1, 2, 2),
    ]
    expected = []
    for a in res.attempts:
        rec = next(r for r in records if (r.task_id, r.phase, r.attempt.index) == (a.task_id, a.phase, a.attempt))
        diff, n = _reference_reliance(model, builder, rec.attempt)
        assert a.n_tokens == n and a.logp_with - a.logp_without == pytest.approx(diff, abs=2e-3)
        assert a.reliance == pytest.approx(diff / n, abs=1e-4) and a.reliance != 0.0
        expected.append(diff / n)
    assert res.split == 1.0 and (res.n_first, res.n_second) == (1, 1)
    assert res.first_half == pytest.approx(expected[0], abs=1e-4) and res.second_half == pytest.approx(
        expected[1], abs=1e-4
    )
    assert [(p, n) for p, _, n in res.per_phase] == [(0, 1), (1, 1)]
    # A policy per phase: none for phase 0 (skipped), the same model for phase 1 (same value).
    per_phase = insight_reliance(records, lambda phase: None if phase == 0 else model, builder, batch_size=2)
    assert per_phase.skipped_phases == (0,) and math.isnan(per_phase.first_half)
    assert per_phase.second_half == pytest.approx(res.second_half, abs=1e-6) and len(per_phase.attempts) == 1
    # Failed attempts and attempts without insights are never scored.
    no_insight = [r for r in records if not (r.success and r.with_insights)]
    empty = insight_reliance(no_insight, model, builder)
    assert empty.attempts == () and math.isnan(empty.first_half) and math.isnan(empty.second_half)
    paths = write_reliance(res, tmp_path)
    summary = dict(_read_csv(tmp_path / "reliance.csv"))
    assert float(summary["second_half"]) == pytest.approx(expected[1], abs=1e-4) and summary["n_first_half"] == "1"
    assert len(paths) == 3 and pathlib.Path(paths[-1]).read_bytes()[:4] == b"\x89PNG"


def test_cli(reliance_run, reliance_result, tmp_path, tiny_policy, builder):
    from rltldr_jax.models import save_pretrained

    def cli(*args):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        return subprocess.run(
            [sys.executable, os.path.join(REPO, "launch", "analyze_rollouts.py"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    # No rollouts: exit 2 with the fix.
    bad = cli(f"--run={tmp_path / 'nothing'}", "--analysis=revisits")
    assert bad.returncode == 2 and "rollout.save_rollouts=True" in bad.stderr
    # All four analyses; reliance with an HF directory of the tiny policy gives the in-process numbers.
    hf = tmp_path / "hf"
    save_pretrained(tiny_policy[0], hf)
    builder.tokenizer.save(str(hf))  # the CLI takes the HF directory's tokenizer.json (faster than building Qwen's)
    out = tmp_path / "out"
    done = cli(f"--run={reliance_run}", "--analysis=all", f"--checkpoint={hf}", f"--out={out}", "--batch_size=2")
    assert done.returncode == 0, done.stderr
    assert f"tokenizer {hf}, thinking=True" in done.stdout and "HF checkpoint" in done.stdout
    rows = _csv_dicts(out / "reliance_attempts.csv")
    assert [r["task_id"] for r in rows] == ["sapi/R1", "sapi/R2"]
    assert [float(r["reliance"]) for r in rows] == pytest.approx(
        [a.reliance for a in reliance_result.attempts], abs=1e-4
    )
    # The model-free ones: R1 and R2 are each visited once (never revisited; no evolution), one insight (I1).
    assert dict(_read_csv(out / "evolution.csv"))["n_tasks"] == "0"
    revisits = dict(_read_csv(out / "revisits.csv"))
    assert revisits["n"] == "0" and revisits["never_n_first_half"] == "1" and float(revisits["never_first_half"]) == 0.5
    shares = {row[0]: float(row[2]) for row in _read_csv(out / "categories.csv")[1:]}
    assert shares["Wrong capitalization"] == 1.0 and shares["Other"] == 0.0
    for name in ("evolution", "revisits", "categories", "reliance"):
        assert (out / f"{name}.png").stat().st_size > 5000


def test_reliance_with_training_checkpoints(reliance_run, reliance_result, builder, tiny_policy, tmp_path):
    """A run's checkpoints: the phase → checkpoint map of `per_phase_policy` and the recorded run config."""
    from rltldr_jax.analysis.reliance import (
        insight_reliance,
        per_phase_policy,
        recorded_run_config,
    )
    from rltldr_jax.checkpoint import Checkpointer

    model = tiny_policy[0]
    directory = str(tmp_path / "checkpoints")
    with Checkpointer(directory, keep=None, async_save=False) as ckpt:  # step 1 = the weights that sampled phase 1
        ckpt.save(
            1,
            params=nnx.state(model),
            opt_state=None,
            rng=None,
            model_config=model.config,
            meta={"config": {"tokenizer": "", "rollout": {"thinking": False}}},
        )
    assert recorded_run_config(directory)["rollout"] == {"thinking": False}
    assert recorded_run_config(str(tmp_path / "absent")) == {}
    policy = per_phase_policy(directory)
    assert policy(0) is None  # no checkpoint sampled phase 0
    res = insight_reliance(load_rollouts(reliance_run), policy, builder, batch_size=2)
    assert res.skipped_phases == (0,) and [(a.task_id, a.phase) for a in res.attempts] == [("sapi/R2", 1)]
    assert res.second_half == pytest.approx(reliance_result.second_half, abs=1e-6)
