"""The insight writer: writer prompt, JSON parsing, content variants, the rule-based rule source, and one
end-to-end write on a tiny random Qwen 3.5 through the real JaxEngine."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from helpers import tiny_config

from rltldr_jax.agent import writer_json
from rltldr_jax.agent.generation import shorten
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.agent.writer_json import insight_from_fields, parse_writer_output
from rltldr_jax.agent.writer_prompt import ROLLOUT_END, ROLLOUT_START, FailedAttempt, render_writer_prompt
from rltldr_jax.config.base import get_config
from rltldr_jax.engines.engine import GenerationEngine, GenerationResult
from rltldr_jax.envs import leetcode as lc
from rltldr_jax.envs.appworld import verdict_from_tracker_dict
from rltldr_jax.envs.base import Task
from rltldr_jax.settings import settings_of

TASK = Task("sapi/t1", "Start a playlist that's long enough for my workout.", "sapi", "train")
REPORT = (
    ">> Failed Requirement\nassert the playlist has length >= the workout length\n----------\n"
    "AssertionError: got length=2712\n"
)


def _failed(**kw) -> FailedAttempt:
    steps = (
        ("print(apis.spotify.show_playlists(access_token=token))", "[" + "{'id': 7, 'title': 'Run'}, " * 200 + "]"),
        ("apis.supervisor.complete_task()", "Execution successful."),
    )
    return FailedAttempt(**({"task": TASK, "steps": steps, "report": REPORT, "attempt": 2} | kw))


# ------------------------------------------------------------------------------------------------ the prompt


def test_prompt_has_task_steps_shortened_observations_and_the_report():
    prompt = render_writer_prompt(_failed(), show_failed_tests=True, max_observation_chars=300)
    assert prompt.startswith("You are a verifier that is given a step-by-step solution of an agent")
    assert f"for the following task: {TASK.goal}\n" in prompt
    start, end = prompt.index(ROLLOUT_START), prompt.index(ROLLOUT_END)
    rollout = prompt[start:end]
    assert "Step 1:\nprint(apis.spotify.show_playlists(access_token=token))\nObservation 1:\n[{'id': 7" in rollout
    long_obs = _failed().steps[0][1]
    assert f"[... {len(long_obs) - 300} characters elided ...]" in rollout
    assert "Step 2:\napis.supervisor.complete_task()\nObservation 2:\nExecution successful.\n" in rollout
    assert "Rollout FAILED the following verifier tests:\n" + REPORT in prompt[end:]
    for key in ("summary", "feedback", "wrong_step_id", "corrected_step", "hint"):
        assert f'"{key}": ' in prompt
    assert prompt.rstrip().endswith("}")

    without = render_writer_prompt(_failed(), show_failed_tests=False, max_observation_chars=300)
    assert "AssertionError" not in without and "workout length" not in without
    assert "Rollout FAILED the verifier tests" in without
    coding = render_writer_prompt(_failed(task=dataclasses.replace(TASK, env="leetcode")))
    assert "solve a coding problem" in coding and "on-device" not in coding


def test_shorten_and_the_rollout_cap():
    assert shorten("abc", 3, marker_in_limit=False) == "abc"
    assert shorten("abcdefghij", 4, marker_in_limit=False) == "ab\n[... 6 characters elided ...]\nij"
    steps = tuple((f"code_{i}()", f"out_{i}") for i in range(1, 41))
    prompt = render_writer_prompt(_failed(steps=steps), max_rollout_chars=300)
    rollout = prompt[prompt.index(ROLLOUT_START) : prompt.index(ROLLOUT_END)]
    assert "Step 1:\ncode_1()" in rollout and "Step 40:\ncode_40()\nObservation 40:\nout_40" in rollout
    assert "omitted" in rollout and "Step 20:" not in rollout
    assert len(rollout) < 300 + 200
    assert "(the agent took no steps)" in render_writer_prompt(_failed(steps=()))


def test_prompt_ids_are_a_new_conversation(tokenizer):
    failed = _failed()
    for thinking, tail in (
        (True, "<|im_start|>assistant\n<think>\n"),
        (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ):
        writer = InsightWriter(tokenizer, object(), thinking=thinking)
        text = tokenizer.decode(writer.prompt_ids(failed))
        assert text == f"<|im_start|>user\n{writer.prompt(failed)}<|im_end|>\n{tail}"
        assert text.count("<|im_start|>") == 2  # one user message, then the generation prompt


# ------------------------------------------------------------------------------------------------ parsing

GOOD = {
    "summary": "S.",
    "feedback": "F.",
    "wrong_step_id": 2,
    "corrected_step": "x = 1",
    "hint": "Paginate the search.",
}
PARSE_CASES = [
    (
        "think + fenced",
        "I should look at step 2.\n</think>\n\n```json\n" + json.dumps(GOOD, indent=1) + "\n```<|im_end|>",
        GOOD,
    ),
    ("bare", json.dumps(GOOD), GOOD),
    ("trailing text", json.dumps(GOOD) + "\nI hope this helps! {not json}", GOOD),
    ("leading text", "Here is the JSON:\n" + json.dumps(GOOD), GOOD),
    (
        "trailing commas",
        '{"summary": "S.", "hint": "Paginate the search.",}',
        {"summary": "S.", "hint": "Paginate the search."},
    ),
    (
        "single quotes",
        "{'summary': 'S.', 'hint': \"Don't skip page 2.\", 'wrong_step_id': '3'}",
        {"summary": "S.", "hint": "Don't skip page 2.", "wrong_step_id": 3},
    ),
    ("python literals", "{'hint': 'H.', 'ok': true, 'x': null}", {"hint": "H.", "ok": True, "x": None}),
    (
        "raw newline and braces in strings",
        '{"corrected_step": "for p in pages:\n    print(f\\"{p}\\")", "hint": "Use {braces}."}',
        {"corrected_step": 'for p in pages:\n    print(f"{p}")', "hint": "Use {braces}."},
    ),
    (
        "draft in think, answer after",
        '<think>draft {"hint": "wrong"}</think>{"hint": "right", "summary": "S."}',
        {"hint": "right", "summary": "S."},
    ),
    (
        "example then answer",
        'Format {"a": 1}. Answer: {"hint": "H.", "feedback": "F."}',
        {"hint": "H.", "feedback": "F."},
    ),
    ("upper-case keys", '{"Hint": "H.", "Wrong_Step_ID": "Step 4"}', {"hint": "H.", "wrong_step_id": 4}),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_parse_realistic_outputs(text, expected):
    fields, error = parse_writer_output(text)
    assert error is None and fields == expected


@pytest.mark.parametrize(
    "text,why",
    [
        ('</think>{"summary": "S.", "hint": "Paginate', "no JSON object"),  # answer budget ran out mid-JSON
        ("The agent failed because it did not paginate.", "no JSON object"),
        ('{"answer": 42}', "none of the keys"),
        ("long thinking with no end", "no JSON object"),
        ("thinking...</think>\n\n", "empty answer"),
        ("", "empty answer"),
    ],
)
def test_parse_failures(text, why):
    fields, error = parse_writer_output(text)
    assert fields is None and why in error


@pytest.mark.parametrize(
    "text,why",
    [
        ("{" * 1_000_000, "more than the 64,000 read"),  # was 123 s of quadratic brace matching
        ('{"hint": ' + "[" * 100_000 + "]" * 100_000 + "}", "more than the 64,000 read"),  # was a RecursionError
        ("{" * 60_000, "more than 32 levels deep"),
        ('{"hint": ' + "[" * 20_000 + "]" * 20_000 + "}", "more than 32 levels deep"),
        ("```json\n{" + '"a": [' * 5_000 + "]" * 5_000 + "}\n```", "more than 32 levels deep"),
        ("{'hint': " + "(" * 20_000 + "1" + ")" * 20_000 + "}", "no JSON object"),
        (("{" + "[]" * 3_000) * 10, "no JSON object"),  # unclosed braces: the scan restarts, boundedly
    ],
    ids=[
        "1MB of {",
        "100k-deep JSON",
        "60k of {",
        "20k-deep JSON",
        "deep fenced JSON",
        "deep parentheses",
        "unclosed braces",
    ],
)
def test_pathological_answers_fail_fast(text, why, monkeypatch):
    # Work, not wall-clock time: characters the brace scan steps over plus characters handed to json/ast.
    work = _parse_work(monkeypatch)
    fields, error = parse_writer_output(text)
    assert fields is None and why in error
    # Each scan pass steps over the text once (at most _MAX_RESTARTS + 1 passes); at most _MAX_CANDIDATES spans
    # are parsed, each by at most four parsers. The quadratic brace matching this replaced did ~len(text)²/2.
    scanned, parsed = work()
    assert scanned <= (writer_json._MAX_RESTARTS + 1) * (len(text) + 1)
    assert parsed <= 4 * writer_json._MAX_CANDIDATES * len(text)


def _parse_work(monkeypatch):
    """Counters on the parser's two costs: (characters the brace scan passed, characters given to json/ast)."""
    counts = {"scanned": 0, "parsed": 0}
    special = writer_json._SPECIAL

    class CountingPattern:
        def search(self, text, pos=0):
            m = special.search(text, pos)
            counts["scanned"] += (m.end() if m else len(text)) - pos
            return m

    real_json_loads, real_literal_eval = writer_json.json.loads, writer_json.ast.literal_eval

    def json_loads(text, **kw):
        counts["parsed"] += len(text)
        return real_json_loads(text, **kw)

    def literal_eval(text):
        counts["parsed"] += len(text)
        return real_literal_eval(text)

    monkeypatch.setattr(writer_json, "_SPECIAL", CountingPattern())
    monkeypatch.setattr(writer_json.json, "loads", json_loads)
    monkeypatch.setattr(writer_json.ast, "literal_eval", literal_eval)
    return lambda: (counts["scanned"], counts["parsed"])


@pytest.mark.parametrize(
    "unit",
    ["{" + "[]" * 30, "{'a': " + "(" * 20 + "1" + ")" * 20, '{"x": "' + '\\"' * 20],
    ids=["unclosed braces", "parentheses", "escapes"],
)
def test_parse_work_is_linear_in_the_answer(unit, monkeypatch):
    work = _parse_work(monkeypatch)
    costs = []
    for copies in (100, 200):  # well past _MAX_RESTARTS unclosed braces, within _MAX_ANSWER_CHARS
        before = sum(work())
        parse_writer_output(unit * copies)
        costs.append(sum(work()) - before)
    assert costs[0] > 0 and costs[1] <= 2.2 * costs[0], costs


def test_parse_survives_unclosed_braces_and_apostrophes_in_prose():
    answer = "I'd say { is odd, isn't it? " + ("{" + "[]" * 300) * 6 + 'Here\'s mine: {"hint": "H.", "summary": "S."}'
    assert parse_writer_output(answer) == ({"hint": "H.", "summary": "S."}, None)
    nested = '{"hint": "H.", "x": ' + "[" * 30 + "]" * 30 + "}"  # within the depth limit
    assert parse_writer_output(nested)[0]["hint"] == "H."


def test_content_variants_select_fields():
    assert insight_from_fields(GOOD, "hint") == ("Paginate the search.", None)
    assert insight_from_fields({"hint": "  Two\n lines. "}, "hint") == ("Two lines.", None)
    assert insight_from_fields(GOOD, "feedback") == ("F.", None)
    assert insight_from_fields(GOOD, "summary_feedback") == ("S.\n\nF.", None)
    assert insight_from_fields(GOOD, "summary_feedback_code") == (
        "S.\n\nF.\n\nCorrected code for step 2:\n```python\nx = 1\n```",
        None,
    )
    assert insight_from_fields(GOOD | {"corrected_step": ""}, "summary_feedback_code") == ("S.\n\nF.", None)
    assert insight_from_fields(GOOD, "strategy") == ("S.", None)
    for content, fields in (
        ("hint", GOOD | {"hint": ""}),
        ("hint", {"feedback": "F."}),
        ("summary_feedback", {"summary": "S."}),
        ("hint", {"hint": ["not", "text"]}),
    ):
        text, error = insight_from_fields(fields, content)
        assert text is None and "missing or empty" in error
    with pytest.raises(ValueError):
        insight_from_fields(GOOD, "corrected")


# ------------------------------------------------------------------------------------------------ rule source


def test_verifier_source_on_real_sapi_reports():
    from rltldr_jax.envs import make_env
    from rltldr_jax.envs.sapi.tasks import generate_tasks

    env = make_env("sapi", step_timeout_s=10)
    try:
        for task in generate_tasks("train", n=3):
            env.reset(task)
            env.step("print(apis.supervisor.show_profile())")
            env.step("apis.supervisor.complete_task()")  # does nothing the task asks for
            verdict = env.verify()
            assert not verdict.success
            sentence = rule_insight(verdict.report)
            requirement = verdict.failures[0].removeprefix("assert ")
            assert sentence.startswith("Make sure that " + requirement), sentence
            assert sentence.endswith(".") and "\n" not in sentence and "assert" not in sentence
            got = verdict.report.split("AssertionError: got ", 1)[1].splitlines()[0]
            assert f"(this attempt had {got}" in sentence
    finally:
        env.close()


def test_verifier_source_on_collateral_damage_and_appworld_traces():
    report = (
        ">> Failed Requirement\nassert no other changes were made to the database than the ones the task asks for "
        "(no collateral changes)\n----------\nAssertionError: got unexpected changes:\ntodo.lists: record 3 changed "
        "color: 'Red' -> 'Blue'\n"
    )
    assert rule_insight(report) == (
        "Make sure that no other changes were made to the database than the ones the task asks for (no collateral "
        "changes) (this attempt had unexpected changes:; todo.lists: record 3 changed color: 'Red' -> 'Blue')."
    )
    aw = verdict_from_tracker_dict(
        {
            "success": False,
            "num_tests": 2,
            "passes": [{"requirement": "assert answers match.", "label": "x"}],
            "failures": [
                {"requirement": "assert the total was computed.", "trace": "AssertionError: 1592.0 == 1538.0"}
            ],
        }
    )
    assert rule_insight(aw.report) == "Make sure that the total was computed."  # AppWorld traces can hold ground truth


def test_verifier_source_writes_every_content_variant_by_rule(tokenizer):
    """The rule-based writer fills summary / feedback / hint, so every Table 3 content variant (and SGE's summaries,
    also of successes) runs with an untrained model; the writer prompt is recorded for the writer-SFT ablations."""
    report = (
        ">> Failed Requirement\nassert the playlist is playing\n----------\nAssertionError: got None\n"
        ">> Failed Requirement\nassert the playlist lasts 45 minutes\n"
    )
    task = Task("t", "Start a playlist.", "sapi", "train")
    steps = (("```python\nprint(apis.music.search_songs(query='run'))\n```", "[]"), ("I give up.", ""))
    failed = FailedAttempt(task, steps, report, attempt=2)
    expected_summary = "Attempt 2 took 2 steps and called apis.music.search_songs; the verifier rejected it."
    expected_feedback = (
        "The verifier found 2 failed requirements: assert the playlist is playing; assert the playlist "
        "lasts 45 minutes."
    )
    hint = rule_insight(report)
    texts = {
        "hint": hint,
        "feedback": expected_feedback,
        "summary_feedback": f"{expected_summary}\n\n{expected_feedback}",
        "summary_feedback_code": f"{expected_summary}\n\n{expected_feedback}",
        "strategy": expected_summary,
    }
    for content, text in texts.items():
        writer = InsightWriter(tokenizer, None, source="rule", content=content)
        writer_output = asyncio.run(writer.write(failed))
        assert writer_output.insight == text and writer_output.parse_error is None, content
        assert writer_output.prompt_ids == writer.prompt_ids(failed) and writer_output.completion_tokens == 0
    succeeded = dataclasses.replace(failed, success=True, report="")
    sge = asyncio.run(InsightWriter(tokenizer, None, source="rule", content="strategy").write(succeeded))
    assert sge.insight == "Attempt 2 took 2 steps and called apis.music.search_songs; the verifier accepted it."
    assert asyncio.run(InsightWriter(tokenizer, None, source="rule").write(succeeded)).insight is None


def _lc_report(statuses, details=(), setup_error=None):
    marker = lc.new_marker()
    payload = {"n": len(statuses), "statuses": statuses, "details": list(details), "setup_error": setup_error}
    return lc.parse_result(f"{marker} {json.dumps(payload)}\n", marker, max(len(statuses), 1)).report


def test_verifier_source_on_leetcode_reports():
    wrong = _lc_report(
        "PFE",
        [
            {"i": 1, "s": "F", "input": "nums = [3, 2, 4], target = 6", "got": "[0, 1]", "expected": "[1, 2]"},
            {"i": 2, "s": "E", "input": "nums = []", "error": "IndexError: list index out of range"},
        ],
    )
    sentence = rule_insight(wrong)
    assert (
        sentence
        == "Make sure your solution returns the correct result for input nums = [3, 2, 4], target = 6 (it returned [0, 1])."  # noqa: E501
    )
    assert "[1, 2]" not in sentence  # never the expected output
    error = _lc_report("PE", [{"i": 1, "s": "E", "input": "nums = []", "error": "IndexError: list index out of range"}])
    assert rule_insight(error) == (
        "Make sure your solution runs without errors for input nums = [] "
        "(it raised IndexError: list index out of range)."
    )
    he = _lc_report(
        "F",
        [
            {
                "i": 0,
                "s": "F",
                "input": "assert candidate([1.0, 2.2], 0.05) == False",
                "got": "True",
                "expected": "False",
            }
        ],
    )
    assert (
        rule_insight(he)
        == "Make sure your solution returns the correct result for input candidate([1.0, 2.2], 0.05) (it returned True)."  # noqa: E501
    )
    assert rule_insight(_lc_report("T", [{"i": 0, "s": "T", "input": "n = 10**9"}])) == (
        "Make sure your solution is fast enough for input n = 10**9; it exceeded the time limit."
    )
    setup = rule_insight(_lc_report("", setup_error="`Solution` is not defined"))
    assert setup.startswith("Make sure your code defines what the tests call") and "`Solution` is not defined" in setup
    assert (
        rule_insight("Failed: no code was run.")
        == "Make sure to write your solution as a Python code block so that it runs."
    )
    assert "did not finish" in rule_insight(lc.parse_result("", lc.new_marker(), 3).report)
    assert rule_insight("") == "Make sure the attempt fully completes the task as asked."


def test_verifier_writer_needs_no_engine(tokenizer):
    writer = InsightWriter.of(settings_of(tiny_config()), tokenizer, engine=None)
    writer_output = asyncio.run(writer.write(_failed()))
    assert (
        writer_output.insight
        == "Make sure that the playlist has length >= the workout length (this attempt had length=2712)."
    )
    assert writer_output.parse_error is None and writer_output.prompt_tokens == writer_output.completion_tokens == 0
    assert asyncio.run(writer.write(_failed(success=True))).insight is None


# ------------------------------------------------------------------------------------------------ generation


class ScriptedEngine(GenerationEngine):
    """Replies from a script and records the requests (checks the two-phase control flow)."""

    weight_version = 5

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.requests = tokenizer, list(replies), []

    async def generate(self, request):
        self.requests.append(request)
        ids = tuple(self.tokenizer.encode(self.replies.pop(0), special=True))[: request.params.max_new_tokens]
        stop = next((k for k, t in enumerate(ids) if t in request.params.stop_token_ids), None)
        ids = ids if stop is None else ids[: stop + 1]
        reason = "stop" if stop is not None else "length"
        return GenerationResult(request.request_id, ids, (-0.5,) * len(ids), reason, self.weight_version)


def test_two_phase_generation_and_a_parsed_insight(tokenizer):
    answer = '{"summary": "S.", "feedback": "F.", "wrong_step_id": 1, "corrected_step": "", "hint": "Paginate the search."}<|im_end|>'  # noqa: E501
    engine = ScriptedEngine(tokenizer, ["The agent missed page two.</think>", "\n\n" + answer])
    writer = InsightWriter(tokenizer, engine, max_think_tokens=64, max_action_tokens=128)
    j = asyncio.run(writer.write(_failed(), seed=7))
    assert j.insight == "Paginate the search." and j.parse_error is None and j.fields["wrong_step_id"] == 1
    think, act = engine.requests
    assert think.params.max_new_tokens == 64 and tokenizer.think_end_id in think.params.stop_token_ids
    assert act.params.max_new_tokens == 128 and act.params.stop_token_ids == tokenizer.stop_ids
    assert act.prompt_ids == think.prompt_ids + j.completion_ids[: j.think_tokens]  # the answer continues the think
    assert (think.params.seed, act.params.seed) == (7, 8) and j.weight_version == 5 and not any(j.forced)

    # Think budget exhausted: `</think>\n\n` is forced (not counted as sampled) and the answer has its own budget.
    engine = ScriptedEngine(tokenizer, ["word " * 50, answer])
    writer = InsightWriter(tokenizer, engine, content="feedback", max_think_tokens=8, max_action_tokens=128)
    j = asyncio.run(writer.write(_failed()))
    assert j.insight == "F." and j.think_tokens == 8 and sum(j.forced) == 2
    assert tokenizer.decode(j.completion_ids[8:10]) == "</think>\n\n" and j.forced[8:10] == (True, True)
    assert j.completion_tokens == len(j.completion_ids) - 2

    # Stopping with <|im_end|> inside the think block ends the writer's reply: no answer phase, a parse error.
    engine = ScriptedEngine(tokenizer, ["hmm<|im_end|>"])
    j = asyncio.run(InsightWriter(tokenizer, engine).write(_failed()))
    assert len(engine.requests) == 1 and j.insight is None and "inside the think block" in j.parse_error


@pytest.fixture(scope="module")
def jax_engine(tiny_policy):
    return tiny_policy[1]


def test_write_with_a_random_tiny_model(tokenizer, jax_engine):
    """A random model's reply does not parse: a parse error and no insight; both budgets hold."""
    writer = InsightWriter(tokenizer, jax_engine, max_think_tokens=8, max_action_tokens=16, max_observation_chars=200)
    failed = _failed()
    j = asyncio.run(writer.write(failed, seed=0))
    assert j.insight is None and j.parse_error
    assert j.prompt_ids == writer.prompt_ids(failed) and j.prompt_tokens == len(j.prompt_ids)
    assert 1 <= j.think_tokens <= 8 and 1 <= j.action_tokens <= 16
    n_forced = sum(j.forced)
    assert n_forced in (0, 2) and len(j.completion_ids) == j.think_tokens + n_forced + j.action_tokens
    assert j.completion_tokens == j.think_tokens + j.action_tokens
    assert len(j.logprobs) == len(j.completion_ids) and j.text == tokenizer.decode(j.completion_ids)
    if j.finish_reason == "length":
        assert j.action_tokens == 16

    # Non-thinking writer, served as a "teacher": one phase only, the closed empty think block in the prompt.
    teacher = InsightWriter(
        tokenizer,
        None,
        source="teacher",
        teacher_engine=jax_engine,
        thinking=False,
        show_failed_tests=False,
        max_action_tokens=16,
        max_observation_chars=200,
    )
    j = asyncio.run(teacher.write(failed, seed=1))
    assert j.think_tokens == 0 and 1 <= j.action_tokens <= 16 and not any(j.forced) and j.insight is None
    assert tokenizer.decode(j.prompt_ids).endswith(
        "<think>\n\n</think>\n\n"
    ) and "AssertionError" not in tokenizer.decode(j.prompt_ids)


def test_from_config_and_argument_checks(tokenizer):
    config = get_config()
    writer = InsightWriter.of(settings_of(config), tokenizer, engine=object())
    assert (writer.source, writer.content, writer.thinking, writer.show_failed_tests) == ("policy", "hint", True, True)
    assert (writer.max_think_tokens, writer.max_action_tokens, writer.max_observation_chars) == (4096, 4096, 4000)
    with pytest.raises(ValueError, match="teacher engine"):
        InsightWriter(tokenizer, object(), source="teacher")
    with pytest.raises(ValueError, match="unknown insight content"):
        InsightWriter(tokenizer, object(), content="corrected")
