"""Verifier reports as rule insights (`insight.source="rule"`): the sentence helpers every environment's
`EnvSpec.rule_failure` uses, and the parser of the AppWorld-style report that SAPI, AppWorld and the crafting world
write (§4.1: the failed requirements, shown to the insight writer only)."""

from __future__ import annotations

import re

ASSERT = re.compile(r"^\s*assert\s+", re.IGNORECASE)


def clip(text: str, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters (with "…")."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def sentence(text: str) -> str:
    """`text` stripped, ending with a full stop unless it ends with one of `.!?`."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def requirement_failure(report: str) -> str | None:
    """The first `>> Failed Requirement` block of an AppWorld-style report as a sentence ("Make sure that X"), or
    None when there is none."""
    lines = report.splitlines()
    for k, line in enumerate(lines):
        if line.strip() != ">> Failed Requirement":
            continue
        body = []
        for nxt in lines[k + 1 :]:
            if nxt.startswith((">>", "─")):
                break
            body.append(nxt)
        requirement = next((b.strip() for b in body if b.strip()), "")
        if not requirement:
            return None
        requirement = ASSERT.sub("", requirement).rstrip(" .")
        # SAPI writes "AssertionError: got <the agent's values>"; AppWorld's own traces can show ground truth, so
        # only the "got" form is quoted.
        got_lines: list[str] = []
        for j, b in enumerate(body):
            if b.startswith("AssertionError: got "):
                got_lines = [b[len("AssertionError: got ") :]]
                got_lines += [x for x in body[j + 1 :] if x.strip()]
                break
        text = f"Make sure that {requirement}"
        got = clip("; ".join(x.strip() for x in got_lines if x.strip()))
        if got:
            text += f" (this attempt had {got})"
        return sentence(text)
    return None
