"""The insight writer: after a failed attempt, it reads the rollout and the failed tests and writes a TL;DR.

Vocabulary: the policy in this role (the paper's "insight generator") is the insight writer, its A.1 prompt (the
paper's "judge prompt") the writer prompt, what it returns a `WriterOutput`; "verifier" is only the environment's
test checker (`Env.verify`), and the model-free source that writes insights from its report is `rule`.

The paper (A.1, "Prompt 1"): the failed rollout goes into the writer prompt in a NEW conversation (one user
message, to avoid contextual drag), with the task, the agent's actions, the observations (shortened if very long)
and the verifier's failed tests. The writer first thinks (budget 4096 tokens), then answers (budget 4096 tokens)
with a JSON of five fields: `summary`, `feedback`, `wrong_step_id`, `corrected_step`, `hint`. Only `hint` (the
one-sentence TL;DR) is used by default; the other fields are generated to make the hint more accurate, and Table 3
tries them as the inserted content.

Variants (settings `insight.*`, Table 3):

- content: `hint` (default) | `feedback` (diagnostic paragraph) | `summary_feedback` | `summary_feedback_code`
  (+ the corrected step) | `strategy` (SGE baseline: the summary of the attempt only, inserted under its own
  scaffold, `tokenization.SGE_SCAFFOLD`).
- source: `policy` (the current policy engine) | `teacher` (another GenerationEngine, e.g. GLM 5.2 served
  separately) | `rule` (no model: the writer's fields by rule from the verifier's report — hint: the first failed
  requirement as a "Make sure that …" sentence; feedback: every failed requirement; summary: the steps taken, the
  APIs called and the outcome; no corrected step — so untrained tiny models exercise insertion, the SFT mask and
  every content variant).
- thinking on/off, and `show_failed_tests=False` (the writer does not see the failed tests).

Generation is two-phase like the episodes (`generation.generate_two_phase`): the think part up to `</think>` within
the think budget; if the budget runs out, `</think>\\n\\n` is forced (marked in `WriterOutput.forced`) and the answer
gets its own budget; generation stops on `<|im_end|>`. A reply whose JSON cannot be read is a `WriterOutput` with
`parse_error` set and no insight: the caller counts it and inserts nothing.

This module is the writer (`InsightWriter`, its result `WriterOutput`, its `SOURCES`); the writer prompt is
`agent.writer_prompt`, the reading of its reply `agent.writer_json`, the rule source `agent.rule_insight`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rltldr_jax.agent.generation import generate_two_phase
from rltldr_jax.agent.rule_insight import rule_fields
from rltldr_jax.agent.writer_json import CONTENTS, insight_from_fields, parse_writer_output
from rltldr_jax.agent.writer_prompt import FailedAttempt, render_writer_prompt
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs.registry import CONTROLS, control_insight
from rltldr_jax.settings import Settings, build, choices
from rltldr_jax.tokenization import ContextBuilder, Tokenizer

SOURCES = choices("insight.source")


@dataclasses.dataclass(frozen=True)
class WriterOutput:
    """The insight writer's result for one attempt.

    Attributes:
      insight: the text to insert (per `content`), or None (parse failure, empty hint, successful attempt).
      fields: the writer's JSON fields (keys lower-cased); `rule_fields` for the rule source.
      parse_error: why there is no insight, or None.
      prompt_tokens: length of the writer prompt the model read (0 for the rule source, where no model runs).
      completion_tokens: tokens the writer sampled (think + answer; forced tokens not counted).
      think_tokens, action_tokens: the sampled tokens of each phase (each within its budget).
      text: the decoded reply (think block included).
      prompt_ids, completion_ids: the writer's context ids, as the engine saw and produced them (for RLTF-FM /
        writer SFT and for saved rollouts); `forced` flags the harness-inserted `</think>\\n\\n`.
      logprobs: per completion id, its sampling logprob (0.0 for forced ids).
      finish_reason: of the last generation call ("stop", "length", "abort"; "" for the rule source).
      weight_version: the engine's weight version that produced the last token (-1 for the rule source).
    """

    insight: str | None
    fields: dict[str, Any]
    parse_error: str | None
    prompt_tokens: int
    completion_tokens: int
    think_tokens: int = 0
    action_tokens: int = 0
    text: str = ""
    prompt_ids: tuple[int, ...] = ()
    completion_ids: tuple[int, ...] = ()
    forced: tuple[bool, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: str = ""
    weight_version: int = -1


class InsightWriter:
    """Writes the insight of one attempt: writer prompt → two-phase generation → JSON → content variant.

    Args:
      tokenizer: the policy's tokenizer (Qwen chat format).
      engine: the policy's GenerationEngine (the writer is the policy itself, A.1).
      source: policy | teacher | rule | uninformative | shuffled (see the module docstring).
      content: hint | feedback | summary_feedback | summary_feedback_code | strategy.
      thinking: the writer thinks first (think budget), or answers directly (Qwen's closed empty think block).
      show_failed_tests: the writer prompt includes the verifier's report (config `insight.show_failed_tests`).
      max_think_tokens, max_action_tokens: the two budgets (4096 each in the paper).
      max_observation_chars: each action and observation longer than this is shortened (middle elided).
      max_rollout_chars: the whole rollout (and the report) are shortened to about this many characters.
      temperature: sampling temperature of the writer.
      teacher_engine: the teacher's engine (required for source="teacher").
      teacher_tokenizer: the teacher's tokenizer if it differs from the policy's (it must use the same ChatML
        format; default: `tokenizer`).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        engine: GenerationEngine | None,
        *,
        source: str = "policy",
        content: str = "hint",
        thinking: bool = True,
        show_failed_tests: bool = True,
        max_think_tokens: int = 4096,
        max_action_tokens: int = 4096,
        max_observation_chars: int = 4000,
        max_rollout_chars: int = 20000,
        temperature: float = 1.0,
        teacher_engine: GenerationEngine | None = None,
        teacher_tokenizer: Tokenizer | None = None,
    ):
        if source not in SOURCES:
            raise ValueError(f"unknown insight source {source!r}; choose one of {', '.join(SOURCES)}")
        if content not in CONTENTS:
            raise ValueError(f"unknown insight content {content!r}; choose one of {', '.join(CONTENTS)}")
        if source == "teacher" and teacher_engine is None:
            raise ValueError("insight.source='teacher' needs a teacher engine (config insight.teacher.*)")
        if source == "policy" and engine is None:
            raise ValueError("insight.source='policy' needs the policy's engine")
        if max_action_tokens < 1 or max_think_tokens < 0:
            raise ValueError(
                f"budgets must be max_think_tokens >= 0 and max_action_tokens >= 1, got "
                f"{max_think_tokens}, {max_action_tokens}"
            )
        self.source, self.content, self.thinking = source, content, thinking
        self.show_failed_tests = show_failed_tests
        self.max_think_tokens, self.max_action_tokens = max_think_tokens, max_action_tokens
        self.max_observation_chars, self.max_rollout_chars = max_observation_chars, max_rollout_chars
        self.temperature = temperature
        self.engine = teacher_engine if source == "teacher" else engine
        self.tokenizer = (teacher_tokenizer or tokenizer) if source == "teacher" else tokenizer
        self.builder = ContextBuilder(self.tokenizer, thinking=thinking)

    @classmethod
    def of(
        cls,
        settings: Settings,
        tokenizer: Tokenizer,
        engine: GenerationEngine | None,
        teacher_engine: GenerationEngine | None = None,
        teacher_tokenizer: Tokenizer | None = None,
    ) -> InsightWriter:
        """The writer of a run's `insight.*` settings (budgets, variants), `env.max_observation_chars` and
        `rollout.temperature`."""
        return build(
            cls,
            settings.insight,
            tokenizer=tokenizer,
            engine=engine,
            teacher_engine=teacher_engine,
            teacher_tokenizer=teacher_tokenizer,
            max_observation_chars=settings.env.max_observation_chars,
            temperature=settings.rollout.temperature,
        )

    def prompt(self, failed: FailedAttempt) -> str:
        """The writer's user message for `failed`."""
        return render_writer_prompt(
            failed,
            show_failed_tests=self.show_failed_tests,
            max_observation_chars=self.max_observation_chars,
            max_rollout_chars=self.max_rollout_chars,
        )

    def prompt_ids(self, failed: FailedAttempt) -> tuple[int, ...]:
        """`<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n` (or the closed empty think
        block when not thinking): a new conversation with one user message."""
        return tuple(int(i) for i in self.builder.build(self.prompt(failed)).ids)

    async def write(self, failed: FailedAttempt, *, seed: int | None = None) -> WriterOutput:
        """The insight writer's output for `failed`: the insight (or why there is none) and the writer's tokens.

        `seed` makes the writer's sampling reproducible (the answer phase uses seed + 1).
        """
        if self.source == "rule" or self.source in CONTROLS:
            # No model runs; the writer context is still recorded (the writer-SFT ablations of Table 8 train on it).
            prompt = self.prompt_ids(failed)
            if failed.success and self.content != "strategy":
                return WriterOutput(None, {}, "the attempt succeeded: no failed requirement", 0, 0, prompt_ids=prompt)
            # Without the failed-test information (Table 3), the rule has no report to read: generic sentences.
            fields = rule_fields(failed if self.show_failed_tests else dataclasses.replace(failed, report=""))
            insight, error = insight_from_fields(fields, self.content)
            if insight and self.source in CONTROLS:  # a control: the rule's insight replaced (envs/registry.py)
                insight = control_insight(failed.task.env, self.source)(insight, failed.task, seed or 0)
                fields = {**fields, "hint": insight}
            return WriterOutput(insight, fields, error, 0, 0, prompt_ids=prompt)
        tok = self.tokenizer
        prompt = self.prompt_ids(failed)
        # A think phase that ended the turn inside the think block, or was aborted, has no answer phase.
        reply = await generate_two_phase(
            self.engine,
            tok,
            prompt,
            thinking=self.thinking,
            max_think_tokens=self.max_think_tokens,
            max_action_tokens=self.max_action_tokens,
            stop_ids=tok.stop_ids,
            temperature=self.temperature,
            seeds=(seed, None if seed is None else (seed + 1) % 2**32),
            act_only_after_budget=True,
        )
        finish = reply.finish_reason
        text = tok.decode(reply.ids)
        insight = None
        if reply.acted:
            fields, error = parse_writer_output(text)
        else:  # the writer ended (or was aborted) inside its think block: there is no answer
            fields, error = None, f"no answer: generation ended inside the think block ({finish})"
        if fields is not None:
            insight, error = insight_from_fields(fields, self.content)
        if error and finish == "length":
            error += " (the answer budget ran out)"
        return WriterOutput(
            insight=insight,
            fields=fields or {},
            parse_error=error,
            prompt_tokens=len(prompt),
            completion_tokens=reply.think_tokens + reply.action_tokens,
            think_tokens=reply.think_tokens,
            action_tokens=reply.action_tokens,
            text=text,
            prompt_ids=prompt,
            completion_ids=reply.ids,
            forced=reply.forced,
            logprobs=tuple(float(x) for x in reply.logprobs),
            finish_reason=finish,
            weight_version=reply.weight_version,
        )
