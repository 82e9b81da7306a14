"""One attempt at a task: the multi-step loop of think → act (a Python code block) → observe.

Each step's context is rebuilt from token segments (`ContextBuilder.build`: task, the insights inserted for this
attempt, earlier steps without their think traces, then the generation prompt), so the training example of a
step is exactly what the engine saw. A step is generated in two phases (`generation.generate_two_phase`): the
think trace with the think budget (stopping at `</think>`; if the budget runs out, `</think>\\n\\n` is forced,
marked `forced`, and never a target), then the action with the action budget (stopping at `<|im_end|>`). The
action's last fenced Python block is run by the environment; the observation (shortened, middle elided) becomes
the next user turn.

An attempt ends when the environment says done (the agent called the completion API), at `max_steps`, when an
action has no code block (malformed, counted), or when the next context would exceed `max_context_tokens`.
Then the verifier runs. Sampling seeds derive from (seed, task, attempt, step), so a run is reproducible. An
exception from `env.step` is that step's observation ("error: ..."), never the end of the phase.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
from collections.abc import Sequence
from typing import Literal

from rltldr_jax.agent.generation import generate_two_phase, shorten
from rltldr_jax.agent.writer_prompt import FailedAttempt
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs.base import Env, StepResult, Task, Verdict
from rltldr_jax.envs.spec import API_PROMPT, CODING_PROMPT, PLAN_PROMPT, get_spec
from rltldr_jax.settings import Settings, build
from rltldr_jax.tokenization import ContextBuilder, Insight, Step

log = logging.getLogger(__name__)

EndReason = Literal["completed", "max_steps", "malformed", "context_full"]

_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The first user message of an attempt is its environment's `EnvSpec.task_prompt` (envs/spec.py); these are the
# built-in templates by kind.
TASK_PROMPTS = {"api": API_PROMPT, "coding": CODING_PROMPT, "plan": PLAN_PROMPT}


def task_text(task: Task) -> str:
    """The first user message of every attempt at `task`: its environment's task prompt with the task's goal."""
    return get_spec(task.env).task_prompt.format(goal=task.goal)


def extract_code(action: str) -> str | None:
    """The last fenced Python block of an action (None if there is none, or it is empty)."""
    blocks = _CODE_BLOCK.findall(action)
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]


def step_seed(seed: int, task_id: str, attempt: int, step: int, part: int) -> int:
    """A stable 32-bit sampling seed for one generation call."""
    digest = hashlib.blake2b(f"{seed}|{task_id}|{attempt}|{step}|{part}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Budgets and sampling of an attempt (`rollout.*`, `env.max_observation_chars`, `seed`; defaults the paper's)."""

    max_steps: int = 50
    thinking: bool = True
    max_think_tokens: int = 768
    max_action_tokens: int = 512
    max_context_tokens: int = 32768
    max_observation_chars: int = 4000
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0

    @classmethod
    def of(cls, settings: Settings) -> EpisodeConfig:
        """The budgets and sampling of a run's `rollout.*`, `env.max_observation_chars` and `seed`."""
        return build(
            cls, settings.rollout, max_observation_chars=settings.env.max_observation_chars, seed=settings.seed
        )


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step as generated and executed.

    Attributes:
      action_ids: the tokens after the generation prompt (think, `</think>`, action, `<|im_end|>`). [L]
      forced: [L] True for tokens the harness inserted (a forced `</think>\\n\\n`).
      logprobs: [L] the engine's logprob of each sampled token (0.0 for forced ones): the old logprobs of GRPO.
      code: the executed code block (None for a malformed action).
      observation: the shortened observation (None when the environment was not stepped).
      weight_version: the engine weights that produced the step's last token.
    """

    action_ids: tuple[int, ...]
    forced: tuple[bool, ...]
    logprobs: tuple[float, ...]
    code: str | None
    observation: str | None
    weight_version: int

    def as_step(self) -> Step:
        return Step(self.action_ids, self.observation, self.forced)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A finished attempt: its steps, how it ended, and the verifier's verdict."""

    task: Task
    index: int  # 1-based attempt number of this task in the phase
    insights: tuple[Insight, ...]
    steps: tuple[StepRecord, ...]
    end: EndReason
    verdict: Verdict

    @property
    def success(self) -> bool:
        return self.verdict.success

    @property
    def env_steps(self) -> int:
        """Environment interactions: every action the policy emitted, including a malformed last one (the
        environment receives it and the episode ends). This is the paper's x-axis and budget unit (§3.1: an
        episode of T actions takes T steps)."""
        return len(self.steps)

    @property
    def executed_steps(self) -> int:
        """Actions whose code block was executed (env_steps minus a malformed last action)."""
        return sum(s.code is not None for s in self.steps)

    @property
    def generated_tokens(self) -> int:
        return sum(len(s.action_ids) - sum(s.forced) for s in self.steps)

    def failed_attempt(self, builder: ContextBuilder) -> FailedAttempt:
        """What the insight writer reads: each step's visible action (think dropped) and observation."""
        steps = tuple(
            (
                builder.tokenizer.decode(
                    t for t in builder.strip_think(s.action_ids) if t != builder.tokenizer.im_end_id
                ),
                s.observation or "",
            )
            for s in self.steps
        )
        return FailedAttempt(task=self.task, steps=steps, report=self.verdict.report, attempt=self.index)


async def _env_step(env: Env, code: str, where: str) -> StepResult:
    """`env.step(code)`; an exception there (an environment bug, or one a hostile action provoked) becomes the step's
    observation and the attempt goes on: one episode never ends the phase."""
    try:
        return await asyncio.to_thread(env.step, code)
    except Exception as e:  # not BaseException: cancellation and interrupts still stop the run
        log.warning(
            "%s: the environment raised %s: %s (given to the agent as the observation)", where, type(e).__name__, e
        )
        return StepResult(f"error: the environment failed to run this action ({type(e).__name__}: {e})", False)


async def run_attempt(
    task: Task,
    index: int,
    insights: Sequence[Insight],
    env: Env,
    engine: GenerationEngine,
    builder: ContextBuilder,
    cfg: EpisodeConfig,
) -> Attempt:
    """Runs one attempt at `task` (the env is reset here and left open for the caller to reuse or close)."""
    goal = task_text(task)
    await asyncio.to_thread(env.reset, task)
    tok = builder.tokenizer
    steps: list[StepRecord] = []
    end: EndReason = "max_steps"
    for k in range(cfg.max_steps):
        prompt = builder.build(goal, insights, [s.as_step() for s in steps]).ids.tolist()
        # The most this step can add: think budget, a forced think close (reserved in both modes), action budget.
        budget = cfg.max_think_tokens * cfg.thinking + len(tok.think_close_ids) + cfg.max_action_tokens
        if len(prompt) + budget > cfg.max_context_tokens:
            end = "context_full"
            break
        seeds = (step_seed(cfg.seed, task.task_id, index, k, 0), step_seed(cfg.seed, task.task_id, index, k, 1))
        reply = await generate_two_phase(
            engine,
            tok,
            prompt,
            thinking=cfg.thinking,
            max_think_tokens=cfg.max_think_tokens,
            max_action_tokens=cfg.max_action_tokens,
            stop_ids=(tok.im_end_id,),
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            seeds=seeds,
        )
        ids, forced, logprobs, version = reply.ids, reply.forced, reply.logprobs, reply.weight_version
        visible = builder.strip_think(ids) if tok.think_end_id in ids else (() if cfg.thinking else ids)
        code = extract_code(tok.decode(visible))
        if code is None:
            steps.append(StepRecord(ids, forced, logprobs, None, None, version))
            end = "malformed"
            break
        result = await _env_step(env, code, f"{task.task_id} attempt {index} step {k + 1}")
        observation = shorten(result.observation, cfg.max_observation_chars)
        steps.append(StepRecord(ids, forced, logprobs, code, observation, version))
        if result.done:
            end = "completed"
            break
    verdict = await asyncio.to_thread(env.verify)
    return Attempt(task, index, tuple(insights), tuple(steps), end, verdict)
