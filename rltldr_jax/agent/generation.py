"""Two-phase generation (think, then act) and the shortening of long texts: shared by the agent's steps and the
insight writer.

A reply is generated in two phases, for the agent's steps (§3.1) and for the writer that writes the insight
(App. A.1) alike: first the think trace within the think budget, stopping at `</think>` or at the end of the turn;
if the think budget runs out, `</think>\\n\\n` (`Tokenizer.think_close_ids`) is forced — marked `forced`, with
logprob 0.0, never a training target — and the action (the agent's code, the writer's JSON answer) gets its own
budget, stopping at the end of the turn. Without thinking (Qwen's closed empty think block is in the prompt),
only the action phase runs.

Long texts (observations in the agent's context, actions, observations and the verifier's report in the writer
prompt) are shortened by `shorten`, which keeps their head and tail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rltldr_jax.engines.engine import GenerationEngine, GenerationRequest, GenerationResult, SamplingParams
from rltldr_jax.tokenization import Tokenizer

_ELIDED = "\n[... {n} characters elided ...]\n"


def shorten(text: str, max_chars: int, *, marker_in_limit: bool = True) -> str:
    """`text` if it has at most `max_chars` characters, else its head and tail around a marker saying how many
    characters were elided (the head gets the odd character).

    Args:
      text: the text.
      max_chars: the limit.
      marker_in_limit: the marker counts towards `max_chars`, so the result never has more than `max_chars`
        characters (the observations in the agent's context); False keeps `max_chars` characters of `text` and
        adds the marker on top (the writer prompt's actions, observations and report, A.1).
    """
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(_ELIDED.format(n=len(text)))) if marker_in_limit else max_chars
    head, tail = keep - keep // 2, keep // 2
    return text[:head] + _ELIDED.format(n=len(text) - head - tail) + (text[len(text) - tail :] if tail else "")


@dataclasses.dataclass(frozen=True)
class TwoPhaseReply:
    """A reply's tokens as the engine sampled them, with the forced think close between the two phases.

    Attributes:
      ids: [L] the think trace, `</think>` (sampled, or forced), the action, and the stop token if generation
        stopped on one.
      forced: [L] True for the harness-inserted `Tokenizer.think_close_ids`.
      logprobs: [L] the engine's sampling logprob of each token (0.0 for forced ones).
      think_tokens: tokens sampled in the think phase (0 when it did not run).
      action_tokens: tokens sampled in the action phase (0 when it did not run).
      acted: the action phase ran (it does not after a think phase that ended the turn).
      finish_reason: of the last generation call ("stop", "length" or "abort").
      weight_version: the engine weights that produced the last token.
    """

    ids: tuple[int, ...]
    forced: tuple[bool, ...]
    logprobs: tuple[float, ...]
    think_tokens: int
    action_tokens: int
    acted: bool
    finish_reason: str
    weight_version: int


async def generate_two_phase(
    engine: GenerationEngine,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    *,
    thinking: bool,
    max_think_tokens: int,
    max_action_tokens: int,
    stop_ids: tuple[int, ...],
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    seeds: tuple[int | None, int | None] = (None, None),
    act_only_after_budget: bool = False,
) -> TwoPhaseReply:
    """Think (budgeted, `think_close_ids` forced when the budget runs out), then act.

    Args:
      engine: samples both phases.
      tokenizer: its `think_end_id` stops the think phase; its `think_close_ids` are forced.
      prompt: [P] the context, ending with the generation prompt (`<think>\\n` when thinking).
      thinking: run the think phase (False: the prompt holds a closed empty think block; only the action runs).
      max_think_tokens: the think budget; 0 skips the think phase and forces the close at once.
      max_action_tokens: the action budget.
      stop_ids: the tokens that end the turn: both phases stop on them (the think phase on `</think>` too).
      temperature, top_p, top_k: sampling of both phases (`SamplingParams`).
      seeds: the sampling seeds of the think and the action phase (None: unseeded).
      act_only_after_budget: after a think phase that did not close its block, act only if its budget ran out
        (finish reason "length"), as the insight writer does; False acts unless the think phase's last token ends
        the turn, as the agent's steps do. The two differ for an aborted think phase (the agent's step goes on to
        the action, the writer does not) and for an engine that reports "length" for a stop token sampled as the
        last budgeted one (the writer acts, the agent's step does not).

    Returns:
      The reply; its `ids`, `forced` and `logprobs` continue `prompt`.
    """
    prompt = tuple(prompt)
    ids: list[int] = []
    forced: list[bool] = []
    logprobs: list[float] = []
    think_tokens = action_tokens = 0
    finish, version, acted = "", -1, True

    async def sample(max_new: int, stop: tuple[int, ...], seed: int | None) -> GenerationResult:
        params = SamplingParams(temperature, top_p, top_k, max_new, stop, seed)
        result = await engine.generate(GenerationRequest((*prompt, *ids), params))
        ids.extend(result.token_ids)
        forced.extend([False] * len(result.token_ids))
        logprobs.extend(result.logprobs)
        return result

    if thinking:
        closed = False
        if max_think_tokens > 0:
            think = await sample(max_think_tokens, (tokenizer.think_end_id, *stop_ids), seeds[0])
            think_tokens, finish, version = len(think.token_ids), think.finish_reason, think.weight_version
            closed = bool(think.token_ids) and think.token_ids[-1] == tokenizer.think_end_id
            if act_only_after_budget:
                acted = closed or think.finish_reason == "length"
            else:
                acted = not (think.token_ids and think.token_ids[-1] in stop_ids)
        if acted and not closed:
            close = tokenizer.think_close_ids
            ids.extend(close)
            forced.extend([True] * len(close))
            logprobs.extend([0.0] * len(close))
    if acted:
        action = await sample(max_action_tokens, stop_ids, seeds[1])
        action_tokens, finish, version = len(action.token_ids), action.finish_reason, action.weight_version
    return TwoPhaseReply(
        tuple(ids), tuple(forced), tuple(logprobs), think_tokens, action_tokens, acted, finish, version
    )
