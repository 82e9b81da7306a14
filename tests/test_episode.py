"""Episodes: code extraction, shortening, the two-phase think/action budget, and whole attempts on SAPI."""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rltldr_jax.agent.episode import EpisodeConfig, extract_code, run_attempt, step_seed, task_text
from rltldr_jax.agent.generation import shorten
from rltldr_jax.engines import GenerationEngine, GenerationRequest, GenerationResult
from rltldr_jax.envs import make_env
from rltldr_jax.envs.sapi.tasks import generate_tasks, golden_solution
from rltldr_jax.models import sequence_logprobs
from rltldr_jax.tokenization import Insight, Step


def test_extract_code_takes_the_last_python_block():
    text = "Let me look.\n```python\nx = 1\n```\nthen\n```py\nprint(x)\n```"
    assert extract_code(text) == "print(x)\n"
    assert extract_code("```\nbare = True\n```") == "bare = True\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\n   \n```") is None


def test_shorten_elides_the_middle():
    text = "a" * 50 + "b" * 50
    short = shorten(text, 60)
    assert len(short) <= 60 and short.startswith("a") and short.endswith("b") and "characters elided" in short
    assert shorten("tiny", 60) == "tiny"
    assert step_seed(0, "t", 1, 2, 0) == step_seed(0, "t", 1, 2, 0) != step_seed(0, "t", 1, 2, 1)


@pytest.fixture(scope="module")
def sapi_task():
    return generate_tasks("train", seed=0, n=40)[0]


def test_random_policy_attempt_forced_think_and_engine_logprobs(tiny_policy, builder, sapi_task):
    """A random policy never closes its think block in 6 tokens: `</think>` is forced (not a target), the action
    has no code block (malformed), and every sampled token's logprob equals the trainer's on the rebuilt context."""
    model, engine = tiny_policy
    cfg = EpisodeConfig(max_steps=3, max_think_tokens=6, max_action_tokens=5, max_context_tokens=4096)
    insights = (Insight("Remember to save the preference.", attempt=1),)
    env = make_env("sapi", step_timeout_s=5.0)
    try:
        attempt = asyncio.run(run_attempt(sapi_task, 2, insights, env, engine, builder, cfg))
    finally:
        env.close()
    assert attempt.end == "malformed" and not attempt.success and attempt.env_steps == 1 and attempt.executed_steps == 0
    (step,) = attempt.steps
    close = (builder.tokenizer.think_end_id, *builder.tokenizer.encode("\n\n"))
    assert step.forced == (False,) * 6 + (True,) * len(close) + (False,) * 5
    assert step.action_ids[6 : 6 + len(close)] == close
    context = builder.build(task_text(sapi_task), insights, [], Step(step.action_ids, None, step.forced))
    assert context.insight_mask.sum() == len(builder.tokenizer.encode(insights[0].text))
    ids = jnp.asarray(context.ids[None])
    teacher = np.asarray(jax.jit(lambda m, x: sequence_logprobs(m, x)[0])(model, ids))[0]
    start = context.prompt_length
    sampled = ~np.asarray(step.forced)
    np.testing.assert_allclose(np.asarray(step.logprobs)[sampled], teacher[start:][sampled], atol=2e-5)
    assert np.array_equal(np.flatnonzero(context.action_mask) - start, np.flatnonzero(sampled))


class ReplayEngine(GenerationEngine):
    """Plays back fixed completions (a test double for the control flow of multi-step attempts: a random model
    cannot write working code). Each completion is cut at the request's stop ids and budget, like an engine."""

    weight_version = 7

    def __init__(self, completions: list[list[int]]):
        self.completions = completions
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids = self.completions.pop(0)
        out = []
        for t in ids[: request.params.max_new_tokens]:
            out.append(t)
            if t in request.params.stop_token_ids:
                break
        reason = "stop" if out and out[-1] in request.params.stop_token_ids else "length"
        return GenerationResult(request.request_id, tuple(out), tuple([-1.0] * len(out)), reason, self.weight_version)

    def update_weights(self, params, version):
        self.weight_version = version  # a replay has no weights; only the label follows the protocol


def test_golden_solution_in_two_steps_completes_and_verifies(builder, sapi_task):
    tok = builder.tokenizer
    golden = golden_solution(sapi_task)
    lines = golden.splitlines()
    first, rest = "\n".join(lines[:1]) + "\n", "\n".join(lines[1:]) + "\n"

    def turn(think: str, code: str) -> tuple[list[int], list[int]]:
        return (
            tok.encode(think + "</think>", special=True),
            tok.encode(f"\n\n```python\n{code}```<|im_end|>", special=True),
        )

    t1, a1 = turn("First the login.", first)
    t2, a2 = turn("Now the rest.", rest)
    engine = ReplayEngine([t1, a1, t2, a2])
    cfg = EpisodeConfig(max_steps=5, max_think_tokens=64, max_action_tokens=4096, max_context_tokens=32768)
    env = make_env("sapi", step_timeout_s=10.0)
    try:
        attempt = asyncio.run(run_attempt(sapi_task, 1, (), env, engine, builder, cfg))
    finally:
        env.close()
    assert attempt.end == "completed" and attempt.success, attempt.verdict.report
    assert attempt.env_steps == attempt.executed_steps == 2 and [s.code for s in attempt.steps] == [first, rest]
    assert all(not any(s.forced) for s in attempt.steps)
    # The second step's prompt holds the first step without its think trace, then its observation.
    second_prompt = builder.tokenizer.decode(engine.requests[2].prompt_ids)
    assert (
        "First the login." not in second_prompt
        and first in second_prompt
        and attempt.steps[0].observation in second_prompt
    )
    failed = attempt.failed_attempt(builder)
    assert failed.steps[0][0].startswith("```python") and failed.attempt == 1
