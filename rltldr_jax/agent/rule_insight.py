"""The rule-based insight (`insight.source = "rule"`): the writer's JSON fields written from the verifier's report
by rule, with no model.

hint: the first failed requirement as a "Make sure that …" sentence (read by the environment's
`EnvSpec.rule_failure`); feedback: every failed requirement; summary: the steps taken, the APIs called and the
outcome; no corrected step. Untrained tiny models thus exercise insertion, the SFT mask and every content variant.
"""

from __future__ import annotations

import re
from typing import Any

from rltldr_jax.agent.writer_prompt import FailedAttempt
from rltldr_jax.envs.reports import ASSERT, clip, sentence
from rltldr_jax.envs.spec import BUILTIN, get_spec

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
