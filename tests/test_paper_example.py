"""The paper's worked example end to end (§3.3 / Fig. 1 / App. B): a task whose attempts fail gets the policy's
insights inserted as user messages, and the update's L_SFT targets exactly the insight sentences.

"In the third attempt, it has them in context as two additional user chat messages. L_SFT backpropagates to
increase the log likelihoods of the tokens 'Remember to paginate search results.' given the context '... Task:
Start a playlist ... <|im_start|>user\\n==> A previous Attempt 1 on this same task FAILED the verifier. <==\\nHint
on what went wrong: '. It backpropagates 'Sort the notes to find the most recent one.' the same way, conditional
on the task, first insight, and start of the second insight message."

Real collector, schedule, insight writer (JSON parsing), batching, packing and train step; the policy's
generations are scripted (a random model cannot write the paper's insights), and the environment is a fixed
failing verifier (the paper's music/notes world is AppWorld's, not available offline).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rltldr_jax.agent.collector import Collector
from rltldr_jax.agent.episode import EpisodeConfig, task_text
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.engines import GenerationEngine, GenerationRequest, GenerationResult
from rltldr_jax.envs import StepResult, Task, Verdict
from rltldr_jax.models import sequence_logprobs
from rltldr_jax.tokenization import render_context
from rltldr_jax.train.batching import ExampleConfig, pack, phase_examples
from rltldr_jax.train.step import LossConfig, train_step

TASK = Task(
    "playlist", "Start a playlist that's long enough for my workout. My workout plan is in my notes.", "sapi", "train"
)
INSIGHTS = ["Remember to paginate search results.", "Sort the notes to find the most recent one."]
# The writer's hints in order; the third attempt's failure yields a third that no attempt of this phase sees.
HINTS = [*INSIGHTS, "Check the playlist's total duration before starting it."]
REPORT = "Failed requirement: a playlist of at least 45 minutes is playing (found: no playlist playing)."


class FailingEnv:
    """The verifier fails every attempt (no action is ever executed: the scripted actions are malformed)."""

    def reset(self, task: Task) -> str:
        return task.goal

    def step(self, code: str) -> StepResult:
        raise AssertionError("malformed actions never reach the environment")

    def verify(self) -> Verdict:
        return Verdict(False, REPORT, 0, 1, (REPORT,))

    def close(self) -> None:
        pass


class ScriptedPolicy(GenerationEngine):
    """The policy's two roles: as the agent it answers without a code block (each attempt fails after one step);
    as the writer (a fresh chat whose prompt contains the verifier's report) it answers with the next insight."""

    weight_version = 0

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.written = 0
        self.agent_prompts: list[str] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tok.decode(request.prompt_ids)
        if REPORT in prompt:  # the writer
            answer = {
                "summary": "s",
                "feedback": "f",
                "wrong_step_id": 1,
                "corrected_step": "",
                "hint": HINTS[self.written],
            }
            self.written += 1
            text = "```json\n" + json.dumps(answer) + "\n```<|im_end|>"
        else:
            self.agent_prompts.append(prompt)
            text = "I will think about it first.<|im_end|>"
        ids = tuple(self.tok.encode(text, special=True))
        return GenerationResult(request.request_id, ids, tuple([-0.5] * len(ids)), "stop", self.weight_version)


def test_failed_attempts_get_the_papers_insights_inserted_and_sft_masked(tiny_policy, builder):
    model, _ = tiny_policy
    tok = builder.tokenizer
    policy = ScriptedPolicy(tok)
    writer = InsightWriter(tok, policy, source="policy", thinking=False, max_action_tokens=256)
    collector = Collector(
        policy,
        FailingEnv,
        builder,
        EpisodeConfig(max_steps=2, max_think_tokens=16, max_action_tokens=16),
        InsightSchedule("threshold", threshold=0.5),
        writer,
        group_size=3,
        exact_group_size=True,
    )
    result = collector.collect([TASK], phase=0)
    attempts = result.groups()["playlist"]
    assert [len(a.insights) for a in attempts] == [0, 1, 2]  # running success 0 ≤ 0.5 and an insight exists
    assert [j.insight for _, _, j in result.writer_outputs] == HINTS and result.parse_failures == 0
    assert [i.text for i in attempts[2].insights] == INSIGHTS and [i.attempt for i in attempts[2].insights] == [1, 2]

    # The context of the third attempt, as the engine saw it: the task, then one user message per insight.
    expected_prefix = (
        f"<|im_start|>user\n{task_text(TASK)}<|im_end|>\n"
        "<|im_start|>user\n==> A previous Attempt 1 on this same task FAILED the verifier. <==\n"
        "Hint on what went wrong: Remember to paginate search results.<|im_end|>\n"
        "<|im_start|>user\n==> A previous Attempt 2 on this same task FAILED the verifier. <==\n"
        "Hint on what went wrong: Sort the notes to find the most recent one.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert policy.agent_prompts[2] == expected_prefix

    # The update: every attempt failed, so the group has zero advantage; with the filter off the third attempt's
    # step is one example whose SFT mask is exactly the two insight sentences (the flipped backprop mask).
    no_filters = ExampleConfig(filter_zero_advantage=False, positive_ratio=0.0)
    examples, _ = phase_examples(result.attempts, builder, no_filters)
    (third,) = [e for e in examples if e.attempt == 3]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], third.insight_mask.astype(np.int8), [0]])))
    runs = list(zip(edges[::2], edges[1::2], strict=False))
    assert [tok.decode(third.ids[a:b]) for a, b in runs] == INSIGHTS
    assert tok.decode(third.ids[: runs[0][0]]).endswith(
        "Task: Start a playlist that's long enough for my workout. My workout plan is in my notes.<|im_end|>\n"
        "<|im_start|>user\n==> A previous Attempt 1 on this same task FAILED the verifier. <==\nHint on what went wrong: "  # noqa: E501
    )
    assert render_context(builder.build(task_text(TASK), attempts[2].insights), tok) == expected_prefix
    assert not (third.insight_mask & third.action_mask).any()

    # L_SFT of the step is the mean NLL over exactly those tokens (hand-computed from teacher-forced logprobs).
    (batch,) = pack([third], micro_batch_size=1, grad_accum_steps=1, pad_to_multiple=64)
    graphdef, params = nnx.split(model)
    tx = optax.sgd(0.0)
    _, _, metrics = jax.jit(lambda p, s, b: train_step(graphdef, p, s, b, tx=tx, loss_cfg=LossConfig(lam=0.5)))(
        params, tx.init(params), batch
    )
    lp = np.asarray(jax.jit(lambda m, x: sequence_logprobs(m, x)[0])(model, jnp.asarray(third.ids[None])))[0]
    assert float(metrics["sft_tokens"]) == third.insight_mask.sum() == sum(len(tok.encode(t)) for t in INSIGHTS)
    np.testing.assert_allclose(float(metrics["sft_nll"]), -lp[third.insight_mask].mean(), rtol=1e-5)
