"""The writer prompt (App. A.1, Prompt 1, and its variants): what the insight writer reads of one attempt.

`FailedAttempt` is what the writer sees of an attempt (task, steps, verifier report); `render_writer_prompt` turns it
into the text of the writer's single user message: the device (AppWorld/SAPI/crafting) or coding (LeetCode) variant of
Prompt 1, chosen by the environment's `EnvSpec.writer_prompt`, with the rollout's actions and observations shortened
when long, and the verifier's failed tests shown or hidden (`show_failed_tests`, Table 3). The writer itself is
`agent.insight.InsightWriter`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rltldr_jax.agent.generation import shorten
from rltldr_jax.envs.base import Task
from rltldr_jax.envs.spec import get_spec

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
