"""Two-phase generation (think, forced `</think>\\n\\n`, act), shared by the agent's steps and the insight writer."""

from __future__ import annotations

import asyncio

import pytest

from rltldr_jax.agent.generation import generate_two_phase
from rltldr_jax.engines import GenerationEngine, GenerationRequest, GenerationResult


class ScriptedEngine(GenerationEngine):
    """Returns fixed (ids, finish reason) results in order and records the requests."""

    weight_version = 0

    def __init__(self, *results: tuple[list[int], str]):
        self.results = list(results)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids, reason = self.results.pop(0)
        return GenerationResult(request.request_id, tuple(ids), (-0.5,) * len(ids), reason, len(self.requests))


def _generate(tokenizer, engine, **kw):
    settings = dict(
        thinking=True,
        max_think_tokens=4,
        max_action_tokens=8,
        stop_ids=(tokenizer.im_end_id,),
        temperature=1.0,
        seeds=(11, 12),
    )
    return asyncio.run(generate_two_phase(engine, tokenizer, [1, 2, 3], **(settings | kw)))


def test_think_then_act_with_the_close_forced_when_the_budget_runs_out(tokenizer):
    x, y, end = 100, 101, tokenizer.im_end_id
    close = tokenizer.think_close_ids
    assert tokenizer.decode(close) == "</think>\n\n"
    engine = ScriptedEngine(([x, y], "length"), ([y, end], "stop"))
    reply = _generate(tokenizer, engine)
    assert reply.ids == (x, y, *close, y, end) and reply.forced == (False, False, True, True, False, False)
    assert reply.logprobs == (-0.5, -0.5, 0.0, 0.0, -0.5, -0.5) and reply.acted
    assert (reply.think_tokens, reply.action_tokens, reply.finish_reason, reply.weight_version) == (2, 2, "stop", 2)
    think, action = engine.requests
    assert think.params.stop_token_ids == (tokenizer.think_end_id, end) and think.params.max_new_tokens == 4
    assert (think.params.seed, action.params.seed) == (11, 12) and action.params.stop_token_ids == (end,)
    assert action.prompt_ids == (1, 2, 3, x, y, *close)

    # A closed think block: nothing forced. No think budget: no think call, the close forced at once.
    reply = _generate(tokenizer, ScriptedEngine(([x, tokenizer.think_end_id], "stop"), ([end], "stop")))
    assert not any(reply.forced) and reply.ids == (x, tokenizer.think_end_id, end)
    engine = ScriptedEngine(([y, end], "stop"))
    reply = _generate(tokenizer, engine, max_think_tokens=0)
    assert len(engine.requests) == 1 and reply.ids == (*close, y, end) and reply.think_tokens == 0
    # Without thinking, only the action phase runs.
    engine = ScriptedEngine(([y, end], "stop"))
    reply = _generate(tokenizer, engine, thinking=False)
    assert reply.ids == (y, end) and not any(reply.forced) and engine.requests[0].params.seed == 12


@pytest.mark.parametrize(
    "think, agent_acts, writer_acts",
    [
        (([100, "im_end"], "stop"), False, False),  # the turn ended inside the think block
        (([100], "abort"), True, False),  # aborted: the agent's step goes on, the writer stops
        (([100, "im_end"], "length"), False, True),  # a stop token reported as "length" (the last budgeted token)
    ],
)
def test_when_the_think_phase_ends_without_closing(tokenizer, think, agent_acts, writer_acts):
    ids, reason = [tokenizer.im_end_id if t == "im_end" else t for t in think[0]], think[1]
    for act_only_after_budget, acts in ((False, agent_acts), (True, writer_acts)):
        engine = ScriptedEngine((ids, reason), ([101, tokenizer.im_end_id], "stop"))
        reply = _generate(tokenizer, engine, act_only_after_budget=act_only_after_budget)
        assert reply.acted == acts and len(engine.requests) == 1 + acts
        after = (*tokenizer.think_close_ids, 101, tokenizer.im_end_id) if acts else ()
        assert reply.ids == (*ids, *after)
        assert reply.finish_reason == ("stop" if acts else reason) and reply.action_tokens == 2 * acts
