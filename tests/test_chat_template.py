"""Our contexts against a checkpoint's own chat template (rltldr_jax/chat_template.py): byte-equal to Qwen 3.5's
format in both thinking modes, a template one character off named with its position and the fix, templates found
where transformers finds them, tokenizers without one skipped, and the trainer checking before it builds the model.

Qwen 3.5's real template is not available offline (no installed package ships it, and tests download nothing), so
`QWEN3_5_TEMPLATE` below is a text-only Jinja rewrite of its format, written for these tests: the same rendering of
system, user, assistant and tool messages (contents trimmed; an assistant turn's think trace dropped before the last
user query and kept, in a `<think>` block, after it; `enable_thinking` choosing the generation prompt's open or
closed empty think block), without its tool-definition and image/video branches, which our contexts never use.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from helpers import tiny_run_settings, tiny_settings

from rltldr_jax.chat_template import (
    ChatFormatMismatch,
    ChatTemplate,
    check_chat_format,
    check_chat_template,
    read_chat_template,
    representative_cases,
)
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained
from rltldr_jax.tokenization import (
    INSIGHT_SCAFFOLD,
    SGE_SCAFFOLD,
    ContextBuilder,
    load_tokenizer,
    train_chatml_tokenizer,
)
from rltldr_jax.train import loop
from rltldr_jax.train.evaluation import evaluate_checkpoint

QWEN3_5_TEMPLATE = r"""
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools %}
    {{- raise_exception('This text-only rewrite of the Qwen 3.5 template renders no tools.') }}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + (messages[0].content or '') | trim + '<|im_end|>\n' }}
{%- endif %}
{%- set query = namespace(index=-1) %}
{%- for message in messages %}
    {%- set text = (message.content or '') | trim %}
    {%- if message.role == 'user' and not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
        {%- set query.index = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- if query.index < 0 %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = (message.content or '') | trim %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if message.tool_calls %}
            {{- raise_exception('This text-only rewrite of the Qwen 3.5 template renders no tool calls.') }}
        {%- endif %}
        {%- if loop.index0 > query.index %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning | trim + '\n</think>\n\n' + content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'tool' %}
        {%- if loop.previtem and loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
"""


def _qwen(text: str = QWEN3_5_TEMPLATE) -> ChatTemplate:
    return ChatTemplate(text, "the test's template", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


def _altered(old: str, new: str) -> ChatTemplate:
    assert QWEN3_5_TEMPLATE.count(old) == 1, old
    return _qwen(QWEN3_5_TEMPLATE.replace(old, new))


@pytest.fixture(scope="module")
def small_tokenizer():
    """A small ChatML tokenizer like the tiny worlds' (no chat template of its own), trained in milliseconds."""
    return train_chatml_tokenizer(["Craft planks and sticks, then a wooden pickaxe."] * 4, vocab_size=300)


def _checkpoint_dir(path, tokenizer, config: dict | None = None, jinja: str | None = None):
    """A tokenizer directory as a checkpoint has it: tokenizer.json, optionally tokenizer_config.json and a
    chat_template.jinja."""
    path.mkdir()
    tokenizer.save(str(path))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    return path


# --- our contexts are Qwen 3.5's format -----------------------------------------------------------------


@pytest.mark.parametrize("scaffold", [INSIGHT_SCAFFOLD, SGE_SCAFFOLD], ids=["insight", "sge"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "not-thinking"])
def test_our_contexts_equal_the_qwen3_5_template_byte_for_byte(tokenizer, thinking, scaffold):
    builder = ContextBuilder(tokenizer, thinking=thinking, insight_scaffold=scaffold)
    render = _qwen().renderer()
    cases = representative_cases(builder)
    assert [c.name for c in cases] == [
        "a task alone",
        "a task with the insights of failed attempts 1 and 2",
        "step 3 of an attempt with insights",
        "step 3 sampled (a training example)",
    ]
    for case in cases:
        theirs = render(case.messages, case.add_generation_prompt, thinking)
        assert theirs.encode() == (case.ours + case.closing).encode(), case.name
    check_chat_template(builder, _qwen())  # (raises on any difference)


def test_the_cases_are_the_contexts_the_policy_sees(tokenizer):
    """The compared texts are real contexts: the task alone is the golden one-message prompt's format, and a later
    step holds both insight messages and the earlier actions without their think traces."""
    alone, insights, later, sampled = representative_cases(ContextBuilder(tokenizer, thinking=True))
    assert alone.ours == (
        "<|im_start|>user\nCraft a wooden pickaxe.\nInventory: 3 logs.\nReply with one action per turn, for example "
        "craft('planks').<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert insights.ours.count("FAILED the verifier") == 2 and len(insights.messages) == 3
    assert later.ours.count("<|im_start|>assistant\ncraft('") == 2 and "Logs make planks" not in later.ours
    assert [m["role"] for m in later.messages] == ["user"] * 3 + ["assistant", "user"] * 2
    assert sampled.ours.endswith("<think>\nPlanks and sticks are ready.\n</think>\n\ncraft('wooden_pickaxe')<|im_end|>")
    assert sampled.ours.startswith(later.ours) and sampled.closing == "\n"
    not_thinking = representative_cases(ContextBuilder(tokenizer, thinking=False))[0]
    assert not_thinking.ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# --- differences are named -----------------------------------------------------------------------------


def test_a_role_marker_one_character_off_is_named_with_its_position(tokenizer):
    builder = ContextBuilder(tokenizer)
    with pytest.raises(ChatFormatMismatch) as e:
        check_chat_template(builder, _altered("'<|im_start|>user\\n' + content", "'<|im_start|>User\\n' + content"))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "the chat template of the test's template does not match our chat format: our context of a task alone "
        "(rollout.thinking=True) first differs at character 12, in message 1 of 1 (user) at its character 12: "
        "ours '<|im_start|>user\\nCraft a wooden pickaxe.\\nI'… vs the template's '<|im_start|>User\\nCraft a wooden "
        "pickaxe.\\nI'…; this checkpoint's chat template differs from Qwen 3.5's"
    )


def test_a_difference_inside_a_later_message_names_that_message(tokenizer):
    """An extra newline after an earlier assistant turn's header: the first two cases have no such turn and pass;
    the third differs right after `<|im_start|>assistant\\n` of message 4 (of 7)."""
    builder = ContextBuilder(tokenizer)
    altered = _altered("'<|im_start|>assistant\\n' + content", "'<|im_start|>assistant\\n\\n' + content")
    later = representative_cases(builder)[2]
    at = later.ours.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    with pytest.raises(ChatFormatMismatch, match="step 3 of an attempt with insights") as e:
        check_chat_template(builder, altered)
    assert f"first differs at character {at}, in message 4 of 7 (assistant) at its character 22: " in str(e.value)
    assert later.ours[at:].startswith("craft('planks')<|im_end|>")


def test_a_template_of_the_other_thinking_mode_says_which_key_to_set(tokenizer):
    """A generation prompt without the open think block (Qwen 3's thinking format) renders our not-thinking format
    only: the fix is the config key."""
    altered = _altered("{%- else %}\n        {{- '<think>\\n' }}", "{%- else %}")
    with pytest.raises(ChatFormatMismatch) as e:
        check_chat_template(ContextBuilder(tokenizer, thinking=True), altered)
    assert "in the generation prompt at its character 22" in str(e.value)
    assert "this template renders our rollout.thinking=False format: set rollout.thinking=False" in str(e.value)
    check_chat_template(ContextBuilder(tokenizer, thinking=False), altered)  # the other mode matches


def test_a_template_that_refuses_our_messages_is_a_mismatch(tokenizer):
    needs_system = "{%- if messages[0].role != 'system' %}{{ raise_exception('A system message is required.') }}"
    with pytest.raises(ChatFormatMismatch, match="cannot render our context of a task alone .*A system message is"):
        check_chat_template(ContextBuilder(tokenizer), _qwen(needs_system + "{% endif %}" + QWEN3_5_TEMPLATE))


# --- where the template comes from, and when there is none ---------------------------------------------


def test_the_template_of_a_checkpoint_directory_is_checked(tmp_path, small_tokenizer):
    config = {"chat_template": QWEN3_5_TEMPLATE, "eos_token": "<|im_end|>"}
    good = _checkpoint_dir(tmp_path / "good", small_tokenizer, config)
    tokenizer = load_tokenizer(good)
    assert tokenizer.path == str(good / "tokenizer.json")
    assert read_chat_template(good).source == str(good / "tokenizer_config.json")
    assert check_chat_format(ContextBuilder(tokenizer, thinking=False)) is True
    # chat_template.jinja wins over tokenizer_config.json, as in transformers
    bad_jinja = QWEN3_5_TEMPLATE.replace("'<|im_start|>user\\n'", "'<|im_start|>human\\n'")
    bad = _checkpoint_dir(tmp_path / "bad", small_tokenizer, config, jinja=bad_jinja)
    with pytest.raises(ChatFormatMismatch, match=f"the chat template of {bad}/chat_template.jinja .* character 12"):
        check_chat_format(ContextBuilder(load_tokenizer(bad)))
    # named templates: the "default" one
    named = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": bad_jinja}]}
    assert read_chat_template(_checkpoint_dir(tmp_path / "named", small_tokenizer, named)).text == bad_jinja


def test_tokenizers_without_a_template_are_skipped(tmp_path, small_tokenizer, tokenizer, caplog):
    caplog.set_level(logging.DEBUG, logger="rltldr_jax.chat_template")
    bare = _checkpoint_dir(tmp_path / "bare", small_tokenizer, {"eos_token": "<|im_end|>"})
    assert read_chat_template(bare) is None
    assert check_chat_format(ContextBuilder(load_tokenizer(bare))) is False
    assert check_chat_format(ContextBuilder(tokenizer)) is False  # the built-in Qwen 3.5 tokenizer (in memory)
    assert check_chat_format(ContextBuilder(small_tokenizer)) is False  # a tokenizer never saved
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 3
    assert f"{bare} has no chat template" in caplog.records[0].getMessage()


def test_the_trainer_checks_before_it_builds_the_model(tmp_path, small_tokenizer, monkeypatch):
    bad = QWEN3_5_TEMPLATE.replace("'<|im_start|>user\\n'", "'<|im_start|>human\\n'")
    directory = _checkpoint_dir(tmp_path / "tokenizer", small_tokenizer, {"chat_template": bad})

    def no_model(config):
        raise AssertionError("the model was built before the chat format was checked")

    monkeypatch.setattr(loop, "build_policy", no_model)
    config = tiny_run_settings(str(tmp_path / "run"), overrides={"tokenizer": str(directory)})
    with pytest.raises(ChatFormatMismatch, match="first differs at character 12"):
        loop.Trainer(config)


def test_the_evaluation_checks_the_checkpoints_own_template(tmp_path, small_tokenizer):
    """launch/eval.py on an HF directory whose tokenizer carries an off template: refused before any engine runs."""
    hf = tmp_path / "hf"
    save_pretrained(ModelSpec(dataclasses.replace(get_preset("tiny"), vocab_size=512)).build(seed=0), hf)
    bad = QWEN3_5_TEMPLATE.replace("'<|im_start|>user\\n'", "'<|im_start|>human\\n'")
    small_tokenizer.save(str(hf))
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": bad}))
    with pytest.raises(ChatFormatMismatch, match=f"the chat template of {hf}/tokenizer_config.json .*character 12"):
        evaluate_checkpoint(tiny_settings({"workdir": str(tmp_path / "w")}), str(hf))
    assert not (tmp_path / "w" / "eval").exists()


@pytest.mark.parametrize("thinking", [True, False])
def test_the_template_our_exports_write_passes_the_check(thinking):
    """launch/export_hf.py writes `tokenization.chat_template(thinking)` beside a world's tokenizer: the contexts a
    run built equal what that template renders (both thinking modes), so an export loads into training again."""
    from rltldr_jax.tokenization import chat_template

    builder = ContextBuilder(load_tokenizer(), thinking=thinking)
    assert check_chat_template(builder, ChatTemplate(chat_template(thinking), "x")) is None  # (raises on a mismatch)
    altered = chat_template(thinking).replace("<|im_start|>", "<|im_begin|>", 1)
    with pytest.raises(ChatFormatMismatch):
        check_chat_template(builder, ChatTemplate(altered, "x"))
