"""Reading the insight writer's reply: its JSON fields, and the inserted text of each content variant (Table 3).

`parse_writer_output` finds the writer's JSON object in its raw reply (after the think block; tolerant of code
fences, surrounding prose, trailing commas and Python-literal objects; bounded in time and nesting) and
`insight_from_fields` turns the fields into the text inserted for a content variant (`CONTENTS`). The writer itself
is `agent.insight.InsightWriter`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from rltldr_jax.settings import choices

CONTENTS = choices("insight.content")
WRITER_KEYS = ("summary", "feedback", "wrong_step_id", "corrected_step", "hint")

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
