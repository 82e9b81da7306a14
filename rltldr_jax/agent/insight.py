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

Variants (configs/base.py `insight.*`, Table 3):

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
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from rltldr_jax.agent.generation import generate_two_phase, shorten
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs.base import Task
from rltldr_jax.envs.registry import uninformative_insight
from rltldr_jax.envs.reports import ASSERT, clip, sentence
from rltldr_jax.envs.spec import BUILTIN, get_spec
from rltldr_jax.tokenization import ContextBuilder, Tokenizer

SOURCES = ("policy", "teacher", "rule", "uninformative")
CONTENTS = ("hint", "feedback", "summary_feedback", "summary_feedback_code", "strategy")
WRITER_KEYS = ("summary", "feedback", "wrong_step_id", "corrected_step", "hint")

# ----------------------------------------------------------------------------------------------------
# The writer prompt (A.1, Prompt 1)
# ----------------------------------------------------------------------------------------------------

# GUESS: the PDF extraction prints "======== AGENT ROLLOUT ========" and "== END OF AGENT ROLLOUT"; the number of
# "=" is unknown (App. A.1, Prompt 1, as printed). 30 on each side, as one re-implementation writes the end line.
ROLLOUT_START = "=" * 30 + " AGENT ROLLOUT " + "=" * 30
ROLLOUT_END = "=" * 30 + " END OF AGENT ROLLOUT " + "=" * 30

# Prompt 1 as printed in the paper ([PDF] ≈57500–61500), with the PDF's wrapping line breaks joined. The task is
# inserted after "for the following task:" (the paper prints "..." there).
_DEVICE_INTRO = (
    "You are a verifier that is given a step-by-step solution of an agent that has to perform some on-device "
    "task for the following task: {task}\n"
    "Here is the step-by-step solution that the agent proposed. At each step, it proposed some code to retrieve "
    "information or execute actions, then gets an observation from the environment that executed that code on "
    "the simulated device.\n"
)

# One line per item of the prompt (hence the long lines).
_DEVICE_PARTS = """\
As a verifier, you now have to produce a json with FIVE parts: 1) Summarize the agent attempt, 2) Give feedback, 3) Give the step at which it went wrong, 4) Provide the corrected code for that step, 5) Give a one-sentence TL;DR hint.
1) Summarize the attempt
- Give a summary of roughly one paragraph that describes what the agent did.
- You can skip very generic code like API lookups or logins.
- Focus on what the agent searched for and what it edited.
- Also mention what the final answer of the agent was, or which items it changed on device exactly.
- Do NOT consider the failed tests yet, if this was a failed rollout.
- Do NOT critique yet, just summarize.
2) Give feedback
- For successful rollouts, just return an empty string.
- For failed rollouts, look at all failed tests.
- Write a paragraph on what went wrong in the rollout.
- Do NOT reveal what the ground-truth values are (private_data.* and all numbers that are on the right in the unit test asserts). You can reveal what the agent values were (the left values) if it helps explain the error.
- Try to point out where exactly in the code the error is. Stop at the FIRST thing that went wrong.
- Make it independent of the agent rollout, do NOT assume that the rollout will be shown along with your feedback.
3) Give the step at which it went wrong
- Return the ID of the step where the agent produced wrong code.
- If you cannot identify a specific step, output -1.
4) Provide the corrected code for that step
- Return ONLY the python code that the agent should have written for the wrong step in place of what it actually wrote. Not the prior steps, not the following steps.
- The code should be runnable as a drop-in replacement for the buggy step's code.
- Do NOT include explanatory prose inside the code; use code-comments only if essential.
- Do NOT reveal ground-truth values (private_data.* / unit-test RHS). If a value is unknown, query it via the API instead of hard-coding.
- If the rollout was correct or you cannot identify a specific wrong step, return an empty string.
5) Give a one-sentence TL;DR hint
- After creating all the previous four parts, output a single-sentence hint on what went wrong.
- Keep it to ONE sentence, plain language, no code.
- This should be a concise pointer the agent can act on (e.g. "You created the list but gave it the wrong name.").
- For successful rollouts, just return an empty string.
- Do NOT reveal ground-truth values (private_data.* / unit-test RHS).
"""  # noqa: E501

# GUESS: the paper does not show its LeetCode variant of Prompt 1 (App. A.1 shows the SAPI one). This is Prompt 1
# with the on-device wording replaced by coding wording and "ground truth" read as the tests' expected outputs;
# everything else is kept word for word.
_CODING_INTRO = (
    "You are a verifier that is given a step-by-step solution of an agent that has to solve a coding problem "
    "for the following task: {task}\n"
    "Here is the step-by-step solution that the agent proposed. At each step, it proposed some code, then gets "
    "an observation from the environment that executed that code.\n"
)

_CODING_PARTS = """\
As a verifier, you now have to produce a json with FIVE parts: 1) Summarize the agent attempt, 2) Give feedback, 3) Give the step at which it went wrong, 4) Provide the corrected code for that step, 5) Give a one-sentence TL;DR hint.
1) Summarize the attempt
- Give a summary of roughly one paragraph that describes what the agent did.
- Focus on the approach and algorithm the agent chose.
- Also mention what the final solution of the agent was.
- Do NOT consider the failed tests yet, if this was a failed rollout.
- Do NOT critique yet, just summarize.
2) Give feedback
- For successful rollouts, just return an empty string.
- For failed rollouts, look at all failed tests.
- Write a paragraph on what went wrong in the rollout.
- Do NOT reveal what the expected outputs of the tests are. You can reveal what the agent's code returned (the "got" values) if it helps explain the error.
- Try to point out where exactly in the code the error is. Stop at the FIRST thing that went wrong.
- Make it independent of the agent rollout, do NOT assume that the rollout will be shown along with your feedback.
3) Give the step at which it went wrong
- Return the ID of the step where the agent produced wrong code.
- If you cannot identify a specific step, output -1.
4) Provide the corrected code for that step
- Return ONLY the python code that the agent should have written for the wrong step in place of what it actually wrote. Not the prior steps, not the following steps.
- The code should be runnable as a drop-in replacement for the buggy step's code.
- Do NOT include explanatory prose inside the code; use code-comments only if essential.
- Do NOT hard-code the expected outputs of the tests; compute them.
- If the rollout was correct or you cannot identify a specific wrong step, return an empty string.
5) Give a one-sentence TL;DR hint
- After creating all the previous four parts, output a single-sentence hint on what went wrong.
- Keep it to ONE sentence, plain language, no code.
- This should be a concise pointer the agent can act on (e.g. "You sorted the list but returned it in the wrong order.").
- For successful rollouts, just return an empty string.
- Do NOT reveal the expected outputs of the tests.
"""  # noqa: E501

_JSON_FORMAT = """\
Output your answer in a JSON. Do NOT output any text except the JSON. The format should be:
{
"summary": "...",
"feedback": "...",
"wrong_step_id": "integer",
"corrected_step": "...",
"hint": "..."
}"""

_VERIFIER_OUTPUT = "The verifier code ran and returned this output:\n"
_FAILED = "Rollout FAILED the following verifier tests:\n"
# GUESS (after = "any", SGE): the paper shows only the failed case.
_PASSED = "Rollout PASSED all verifier tests:\n"
# GUESS ("Student, no info about failed unit tests", Table 3): the writer learns that the attempt failed, not which
# tests failed. The wording is ours.
_FAILED_NO_REPORT = "Rollout FAILED the verifier tests (which tests failed is not shown).\n"
_PASSED_NO_REPORT = "Rollout PASSED all verifier tests.\n"


@dataclasses.dataclass(frozen=True)
class FailedAttempt:
    """What the insight writer sees of one attempt.

    Attributes:
      task: the task (its `goal` is the instruction the agent saw; `env` selects the prompt variant).
      steps: per step, (the agent's visible action text with the think trace removed, the observation text).
      report: the verifier's report (`Verdict.report`): the privileged failed-tests text.
      attempt: the 1-based number of this attempt within the task's phase (becomes `Insight.attempt`).
      success: the verdict (False for RLTL;DR; True only for SGE-style summaries of successes, `insight.after="any"`).
    """

    task: Task
    steps: tuple[tuple[str, str], ...]
    report: str
    attempt: int
    success: bool = False

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple((str(a), "" if o is None else str(o)) for a, o in self.steps))
        if self.attempt < 1:
            raise ValueError(f"FailedAttempt.attempt is 1-based, got {self.attempt}")


def _render_rollout(steps: Sequence[tuple[str, str]], max_observation_chars: int, max_rollout_chars: int) -> str:
    """`Step i:` / `Observation i:` blocks; long actions and observations are shortened, and a rollout longer than
    `max_rollout_chars` keeps its first step and as many of its last steps as fit."""
    if not steps:
        return "(the agent took no steps)"
    blocks = []
    for i, (action, observation) in enumerate(steps, start=1):
        action = shorten(action.strip("\n"), max_observation_chars, marker_in_limit=False)
        observation = shorten(observation.strip("\n"), max_observation_chars, marker_in_limit=False) or "(no output)"
        blocks.append(f"Step {i}:\n{action}\nObservation {i}:\n{observation}")
    text = "\n".join(blocks)
    if len(text) <= max_rollout_chars:
        return text
    keep_tail: list[int] = []
    used = len(blocks[0])
    for j in range(len(blocks) - 1, 0, -1):
        if used + len(blocks[j]) + 1 > max_rollout_chars:
            break
        keep_tail.insert(0, j)
        used += len(blocks[j]) + 1
    first_dropped, last_dropped = 1, (keep_tail[0] - 1 if keep_tail else len(blocks) - 1)
    if first_dropped <= last_dropped:
        cut = sum(len(blocks[j]) + 1 for j in range(first_dropped, last_dropped + 1))
        marker = f"[... steps {first_dropped + 1} to {last_dropped + 1} omitted ({cut} characters) ...]"
        text = "\n".join([blocks[0], marker, *(blocks[j] for j in keep_tail)])
    return shorten(text, max_rollout_chars, marker_in_limit=False)


def render_writer_prompt(
    failed: FailedAttempt,
    *,
    show_failed_tests: bool = True,
    max_observation_chars: int = 4000,
    max_rollout_chars: int = 20000,
) -> str:
    """The text of the writer's single user message (Prompt 1), for `failed`.

    The verifier's report is included exactly when `show_failed_tests`; the variant (device or coding) is the
    environment's `EnvSpec.writer_prompt`.
    """
    coding = get_spec(failed.task.env).writer_prompt == "coding"
    intro, parts = (_CODING_INTRO, _CODING_PARTS) if coding else (_DEVICE_INTRO, _DEVICE_PARTS)
    rollout = _render_rollout(failed.steps, max_observation_chars, max_rollout_chars)
    if show_failed_tests:
        report = shorten(failed.report.strip("\n"), max_rollout_chars, marker_in_limit=False)
        verdict = (_PASSED if failed.success else _FAILED) + report + "\n"
    else:
        verdict = _PASSED_NO_REPORT if failed.success else _FAILED_NO_REPORT
    return (
        intro.format(task=failed.task.goal.strip())
        + f"{ROLLOUT_START}\n{rollout}\n{ROLLOUT_END}\n"
        + _VERIFIER_OUTPUT
        + verdict
        + parts
        + _JSON_FORMAT
    )


# ----------------------------------------------------------------------------------------------------
# Parsing the writer's reply
# ----------------------------------------------------------------------------------------------------

_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_PY_LITERALS = [
    (re.compile(r"([:\[,]\s*)" + a + r"\b"), r"\g<1>" + b)
    for a, b in (("true", "True"), ("false", "False"), ("null", "None"))
]
_MAX_CANDIDATES = 256
# Bounds that keep parsing linear and json/ast away from pathological replies: the answer's length (about 4× the
# paper's 4,096-token answer budget), the nesting of brackets inside an object, and how often the brace scan
# starts over after a `{` that is never closed.
_MAX_ANSWER_CHARS = 64_000
_MAX_DEPTH = 32
_MAX_RESTARTS = 8
_SPECIAL = re.compile(r"[{}\[\]\"'\\]")


def answer_text(text: str) -> str:
    """The reply without its think block (everything up to the last `</think>`) and without chat special tokens."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    for token in ("<think>", "<|im_end|>", "<|endoftext|>"):
        text = text.replace(token, "")
    return text.strip()


def _object_spans(text: str) -> tuple[list[tuple[int, int]], bool]:
    """The `(start, end)` of every balanced `{...}` in `text`, by start, and whether brackets nest deeper than
    `_MAX_DEPTH` inside one (then the spans found so far).

    One left-to-right pass with a stack: inside braces, strings in either quote style are skipped (with backslash
    escapes); outside, the text is prose (an apostrophe is no quote). A `{` left open at the end was prose too: the
    pass is redone from just after it, at most `_MAX_RESTARTS` times (the last pass's spans are kept as found), so
    the time is linear in `len(text)`.
    """
    spans: dict[int, int] = {}
    begin = 0
    for restart in range(_MAX_RESTARTS + 1):
        stack: list[int] = []
        found: dict[int, int] = {}
        brackets, quote = 0, None
        m = _SPECIAL.search(text, begin)
        while m is not None:
            i, c = m.start(), m.group()
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = None
            elif c == "{":
                stack.append(i)
            elif not stack:
                pass
            elif c in "\"'":
                quote = c
            elif c == "}":
                found[stack.pop()] = i + 1
                brackets = brackets if stack else 0
            elif c == "[":
                brackets += 1
            elif c == "]":
                brackets = max(brackets - 1, 0)
            if len(stack) + brackets > _MAX_DEPTH:
                return sorted(spans.items()), True
            m = _SPECIAL.search(text, i + 1)
        if not stack or restart == _MAX_RESTARTS:  # done, or the last pass: keep what it found
            spans.update(found)
            break
        # Spans closed before the first unclosed `{` stand; the rest is scanned again with that `{` as prose.
        spans.update((a, b) for a, b in found.items() if a < stack[0])
        begin = stack[0] + 1
    return sorted(spans.items()), False


def _loads(candidate: str) -> Any:
    """JSON, then JSON without trailing commas, then a Python literal (single quotes, True/None); None if none works."""
    attempts = [candidate, _TRAILING_COMMA.sub(r"\1", candidate)]
    for text in attempts:
        try:
            return json.loads(text, strict=False)
        except (ValueError, RecursionError):
            pass
    py = attempts[1]
    for pattern, repl in _PY_LITERALS:
        py = pattern.sub(repl, py)
    for text in (attempts[1], py):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return None


def _normalize(obj: Mapping[Any, Any]) -> dict[str, Any]:
    fields = {str(k).strip().lower(): v for k, v in obj.items()}
    step = fields.get("wrong_step_id")
    if isinstance(step, str):
        match = re.fullmatch(r"\s*(?:step\s*)?(-?\d+)\s*", step, re.IGNORECASE)
        if match:
            fields["wrong_step_id"] = int(match.group(1))
    elif isinstance(step, float) and step.is_integer():
        fields["wrong_step_id"] = int(step)
    return fields


def parse_writer_output(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The writer's JSON fields from its raw reply, or (None, why) when there is no readable JSON object.

    Tolerates a think block (only the text after the last `</think>` is read), code fences, text before or after
    the JSON, trailing commas and single-quoted (Python-literal) objects. Among several objects, the one with the
    most of the five writer keys wins (the later one on ties). Keys are lower-cased; a numeric `wrong_step_id`
    string becomes an int. Bounded: an answer longer than `_MAX_ANSWER_CHARS` or nesting brackets deeper than
    `_MAX_DEPTH` is (None, why) without any JSON parsing; the time is linear in the answer's length.
    """
    answer = answer_text(text)
    if not answer:
        return None, "empty answer" + (
            " (the think block was not closed)" if "</think>" not in text and text.strip() else ""
        )
    if len(answer) > _MAX_ANSWER_CHARS:
        return None, f"the answer has {len(answer):,} characters, more than the {_MAX_ANSWER_CHARS:,} read"
    spans, too_deep = _object_spans(answer)
    if too_deep:
        return None, f"the answer nests brackets more than {_MAX_DEPTH} levels deep"
    candidates: list[tuple[int, int, dict[str, Any]]] = []  # (known keys, position, fields)
    covered_end = -1  # objects inside one already read are not read again
    for start, end in spans[:_MAX_CANDIDATES]:
        if start < covered_end:
            continue
        obj = _loads(answer[start:end])
        if isinstance(obj, dict):
            fields = _normalize(obj)
            candidates.append((sum(k in fields for k in WRITER_KEYS), start, fields))
            covered_end = end
    if not candidates:
        return None, "no JSON object in the answer"
    best = max(candidates, key=lambda c: (c[0], c[1]))
    if best[0] == 0:
        return None, f"the JSON has none of the keys {', '.join(WRITER_KEYS)}"
    return best[2], None


def _text_field(fields: Mapping[str, Any], key: str) -> str:
    value = fields.get(key)
    return value.strip() if isinstance(value, str) else ""


def insight_from_fields(fields: Mapping[str, Any], content: str) -> tuple[str | None, str | None]:
    """The inserted text for `content` (Table 3) from the writer's fields, or (None, why) if a needed field is
    missing or empty.

    hint: the TL;DR sentence, on one line. feedback: the diagnostic paragraph. summary_feedback: summary, blank line,
    feedback. summary_feedback_code: that plus the corrected step as a code block (omitted when the writer gave none).
    strategy (SGE): the summary.
    """
    if content not in CONTENTS:
        raise ValueError(f"unknown insight content {content!r}; choose one of {', '.join(CONTENTS)}")
    needed = {
        "hint": ("hint",),
        "feedback": ("feedback",),
        "summary_feedback": ("summary", "feedback"),
        "summary_feedback_code": ("summary", "feedback"),
        "strategy": ("summary",),
    }[content]
    missing = [k for k in needed if not _text_field(fields, k)]
    if missing:
        return None, f"missing or empty field {', '.join(map(repr, missing))} in the writer's JSON"
    if content == "hint":
        return " ".join(_text_field(fields, "hint").split()), None
    if content in ("feedback", "strategy"):
        return _text_field(fields, needed[0]), None
    text = f"{_text_field(fields, 'summary')}\n\n{_text_field(fields, 'feedback')}"
    code = _text_field(fields, "corrected_step")
    if content == "summary_feedback_code" and code:
        # GUESS: how the paper lays out "+ corrected code" in the insight message is not shown.
        step = fields.get("wrong_step_id")
        where = f" for step {step}" if isinstance(step, int) and step > 0 else ""
        text += f"\n\nCorrected code{where}:\n```python\n{code}\n```"
    return text, None


# ----------------------------------------------------------------------------------------------------
# The rule-based insight (source = "rule")
# ----------------------------------------------------------------------------------------------------

_API_CALL = re.compile(r"\bapis\.(\w+)\.(\w+)\s*\(")
_ANY_FENCE = re.compile(r"```")


def rule_fields(failed: FailedAttempt) -> dict[str, Any]:
    """The writer's JSON fields written by rule (source="rule"): hint, feedback, summary; no corrected step."""
    n = len(failed.steps)
    calls = list(dict.fromkeys(f"apis.{a}.{f}" for action, _ in failed.steps for a, f in _API_CALL.findall(action)))
    with_code = sum(bool(_ANY_FENCE.search(action)) for action, _ in failed.steps)
    did = (
        f"called {', '.join(calls[:6])}{' and more' if len(calls) > 6 else ''}"
        if calls
        else ("ran code without calling any API" if with_code else "wrote no code block")
    )
    outcome = "the verifier accepted it" if failed.success else "the verifier rejected it"
    summary = f"Attempt {failed.attempt} took {n} step{'s' if n != 1 else ''} and {did}; {outcome}."
    failures = [line.strip(" -─=>") for line in failed.report.splitlines() if ASSERT.match(line.strip(" -─=>"))]
    if failed.success:
        feedback = "Every requirement passed."
    elif failures:
        feedback = (
            f"The verifier found {len(failures)} failed requirement{'s' if len(failures) != 1 else ''}: "
            + "; ".join(clip(f) for f in failures[:5])
            + ("; …" if len(failures) > 5 else "")
            + "."
        )
    else:
        feedback = rule_insight(failed.report, failed.task.env)
    hint = "" if failed.success else rule_insight(failed.report, failed.task.env)
    return {"summary": summary, "feedback": feedback, "wrong_step_id": 0, "corrected_step": "", "hint": hint}


def rule_insight(report: str, env: str | None = None) -> str:
    """A one-sentence insight from the verifier's report by rule (no model): its first failed requirement.

    The environment's `EnvSpec.rule_failure` reads its report (AppWorld/SAPI/crafting reports: "assert X" becomes
    "Make sure that X", with the agent's value when the report gives it as "AssertionError: got …"; LeetCode
    reports: the first failed test's input and what the code returned or raised, never the expected output).
    `env=None` tries each built-in environment's reader in turn. Anything else: the report's first informative line.
    """
    readers = [get_spec(env).rule_failure] if env is not None else [get_spec(name).rule_failure for name in BUILTIN]
    for read in readers:
        found = read(report) if read is not None else None
        if found:
            return found
    lines = report.splitlines()
    for line in lines:
        text = line.strip(" -─=>")
        if text and not text.lower().startswith(("num ", "overall stats", "passes", "fails", "none")):
            return sentence(f"Make sure the verifier's check passes: {clip(text)}")
    return "Make sure the attempt fully completes the task as asked."


# ----------------------------------------------------------------------------------------------------
# The writer
# ----------------------------------------------------------------------------------------------------


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
      source: policy | teacher | rule | uninformative (see the module docstring).
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
    def from_config(
        cls,
        config: ml_collections.ConfigDict,
        tokenizer: Tokenizer,
        engine: GenerationEngine | None,
        teacher_engine: GenerationEngine | None = None,
        teacher_tokenizer: Tokenizer | None = None,
    ) -> InsightWriter:
        """The writer of `config.insight.*` (budgets, variants), `config.env.max_observation_chars` and
        `config.rollout.temperature`."""
        ins = config.insight
        return cls(
            tokenizer,
            engine,
            source=ins.source,
            content=ins.content,
            thinking=ins.thinking,
            show_failed_tests=ins.show_failed_tests,
            max_think_tokens=ins.max_think_tokens,
            max_action_tokens=ins.max_action_tokens,
            max_observation_chars=config.env.max_observation_chars,
            max_rollout_chars=ins.max_rollout_chars,
            temperature=config.rollout.temperature,
            teacher_engine=teacher_engine,
            teacher_tokenizer=teacher_tokenizer,
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
        if self.source in ("rule", "uninformative"):
            # No model runs; the writer context is still recorded (the writer-SFT ablations of Table 8 train on it).
            prompt = self.prompt_ids(failed)
            if failed.success and self.content != "strategy":
                return WriterOutput(None, {}, "the attempt succeeded: no failed requirement", 0, 0, prompt_ids=prompt)
            # Without the failed-test information (Table 3), the rule has no report to read: generic sentences.
            fields = rule_fields(failed if self.show_failed_tests else dataclasses.replace(failed, report=""))
            insight, error = insight_from_fields(fields, self.content)
            if insight and self.source == "uninformative":  # the control: same form and length, no information
                insight = uninformative_insight(failed.task.env)(insight, failed.task, seed or 0)
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
