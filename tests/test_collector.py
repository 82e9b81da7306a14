"""A collection phase with the real tiny engine, SAPI worlds and rule-based insights: groups, sequential insights."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_episode import ReplayEngine

from rltldr_jax.agent.collector import Collector
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.rollout_files import save_phase
from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.envs import make_env
from rltldr_jax.envs.sapi.env import SapiEnv
from rltldr_jax.envs.sapi.tasks import generate_tasks


def test_phase_groups_and_sequential_insights(tiny_policy, builder, tmp_path):
    _, engine = tiny_policy
    tasks = generate_tasks("train", seed=0, n=60)[:2]
    collector = Collector(
        engine,
        lambda: make_env("sapi", step_timeout_s=5.0),
        builder,
        EpisodeConfig(max_steps=2, max_think_tokens=3, max_action_tokens=3, max_context_tokens=4096),
        InsightSchedule("threshold", threshold=0.5),
        InsightWriter(builder.tokenizer, None, source="rule"),
        group_size=3,
    )
    result = collector.collect(tasks, phase=0)
    groups = result.groups()
    assert set(groups) == {t.task_id for t in tasks} and all(len(g) >= 3 for g in groups.values())
    for group in groups.values():
        assert [a.index for a in group] == list(range(1, len(group) + 1))
        for a in group:  # a random policy fails every attempt: attempt k sees the k-1 earlier insights, in order
            assert not a.success and a.end == "malformed"
            expected = [rule_insight(earlier.verdict.report) for earlier in group[: a.index - 1]]
            assert [i.text for i in a.insights] == expected and [i.attempt for i in a.insights] == list(
                range(1, a.index)
            )
    assert len(result.writer_outputs) == len(result.attempts) and result.parse_failures == 0
    save_phase(tmp_path / "phase0.jsonl", 0, result)
    lines = [json.loads(x) for x in (tmp_path / "phase0.jsonl").read_text().splitlines()]
    assert len(lines) == len(result.attempts) and all(line["writer_output"]["insight"] for line in lines)


def test_exact_group_size_makes_a_phase_deterministic(tiny_policy, builder):
    """Two collections of the same phase are equal, and so is a third collected from a running event loop (as in a
    notebook kernel: `blocking.run`)."""
    _, engine = tiny_policy
    tasks = generate_tasks("train", seed=0, n=60)[2:4]

    def phase():
        collector = Collector(
            engine,
            lambda: make_env("sapi", step_timeout_s=5.0),
            builder,
            EpisodeConfig(max_steps=2, max_think_tokens=3, max_action_tokens=3, max_context_tokens=4096, seed=7),
            InsightSchedule("threshold", threshold=0.5),
            InsightWriter(builder.tokenizer, None, source="rule"),
            group_size=2,
            exact_group_size=True,
        )
        return collector.collect(tasks, phase=3).groups()

    async def in_a_cell():  # a Jupyter or Colab cell: synchronous code called inside the kernel's running loop
        return phase()

    first, second = phase(), phase()
    third = asyncio.run(in_a_cell())  # (asyncio.run inside collect would refuse: a loop is running)
    assert {k: len(g) for k, g in first.items()} == {t.task_id: 2 for t in tasks}
    for task_id, group in first.items():
        for a, b, c in zip(group, second[task_id], third[task_id], strict=True):
            assert [s.action_ids for s in a.steps] == [s.action_ids for s in b.steps] == [s.action_ids for s in c.steps]
            assert [s.logprobs for s in a.steps] == [s.logprobs for s in b.steps] == [s.logprobs for s in c.steps]
            assert a.insights == b.insights == c.insights and a.verdict == b.verdict == c.verdict


class OneChainPerTask(Collector):
    """The collector with its independent-attempts path switched off: one sequential chain per task."""

    independent = False


def test_independent_attempts_run_at_once_and_equal_one_chain_per_task(tiny_policy, builder):
    _, engine = tiny_policy
    tasks = generate_tasks("train", seed=0, n=60)[4:7]
    made = []

    def env():
        made.append(make_env("sapi", step_timeout_s=5.0))
        return made[-1]

    def phase(cls, **kw):
        made.clear()
        collector = cls(
            engine,
            env,
            builder,
            EpisodeConfig(max_steps=2, max_think_tokens=3, max_action_tokens=3, max_context_tokens=4096, seed=3),
            InsightSchedule("never"),
            None,
            group_size=3,
            exact_group_size=True,
            **kw,
        )
        return collector, collector.collect(tasks, phase=2)

    collector, fast = phase(Collector, max_parallel_attempts=4)
    assert collector.independent and len(made) == 4  # 9 attempts over a pool of 4 environments, all closed after
    assert [(a.task.task_id, a.index) for a in fast.attempts] == [(t.task_id, i) for t in tasks for i in (1, 2, 3)]
    chained, slow = phase(OneChainPerTask)
    assert not chained.independent and len(made) == len(tasks)
    by_key = {(a.task.task_id, a.index): a for a in slow.attempts}
    for a in fast.attempts:  # attempt for attempt what one chain per task gives (a batch-invariant engine)
        b = by_key[(a.task.task_id, a.index)]
        assert [s.action_ids for s in a.steps] == [s.action_ids for s in b.steps]
        assert [s.logprobs for s in a.steps] == [s.logprobs for s in b.steps] and a.verdict == b.verdict
    with pytest.raises(ValueError, match="max_parallel_attempts must be >= 1"):
        phase(Collector, max_parallel_attempts=0)


def test_exact_group_size_rejects_concurrent_chains(tiny_policy, builder):
    with pytest.raises(ValueError, match="exact_group_size needs workers_per_task=1"):
        Collector(
            tiny_policy[1],
            lambda: make_env("sapi"),
            builder,
            EpisodeConfig(),
            InsightSchedule("never"),
            None,
            group_size=2,
            workers_per_task=2,
            exact_group_size=True,
        )


class RaisingEnv(SapiEnv):
    """The real SAPI environment with a bug: every step raises."""

    def step(self, code):
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")


class RaisingWriter(InsightWriter):
    """An insight writer with a bug: every write raises."""

    async def write(self, failed, *, seed=None):
        raise RecursionError("maximum recursion depth exceeded")


def test_env_and_writer_exceptions_do_not_end_the_phase(builder):
    """A step that raises is an "error: ..." observation; a write that raises is a counted parse failure; the phase
    completes with every attempt."""
    action = builder.tokenizer.encode("```python\nprint(1)\n```<|im_end|>", special=True)
    engine = ReplayEngine([list(action) for _ in range(4)])  # 2 attempts × 2 steps, no think phase
    collector = Collector(
        engine,
        RaisingEnv,
        builder,
        EpisodeConfig(max_steps=2, thinking=False, max_action_tokens=64, max_context_tokens=4096),
        InsightSchedule("threshold", threshold=0.5),
        RaisingWriter(builder.tokenizer, None, source="rule"),
        group_size=2,
        exact_group_size=True,
    )
    result = collector.collect(generate_tasks("train", seed=0, n=60)[:1], phase=0)
    assert len(result.attempts) == 2 and all(a.end == "max_steps" and a.env_steps == 2 for a in result.attempts)
    observations = [s.observation for a in result.attempts for s in a.steps]
    assert (
        observations
        == [
            "error: the environment failed to run this action (RecursionError: maximum recursion depth "
            "exceeded while decoding a JSON array)"
        ]
        * 4
    )
    assert result.parse_failures == 2
    errors = [j.parse_error for _, _, j in result.writer_outputs]
    assert errors == ["the insight writer failed: RecursionError: maximum recursion depth exceeded"] * 2
