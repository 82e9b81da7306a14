"""Checks that our chat contexts are what the checkpoint's own chat template renders for the same messages.

rltldr_jax renders the policy's contexts itself, on token ids (`tokenization.ContextBuilder`: Qwen 3.5's format),
and never through a checkpoint's `chat_template`. A checkpoint whose tokenizer files carry a template
(`chat_template.jinja`, else `chat_template` in `tokenizer_config.json`, as transformers reads them) was tuned on
that template's format, so the two must agree: a policy trained on contexts its checkpoint never saw, or served
by SGLang with its template, would see another format than ours.

    check_chat_format(builder)    # once, where the policy's tokenizer is loaded: raises ChatFormatMismatch

renders a few representative conversations both ways (`representative_cases`: a task alone; the task with the
insight messages of failed attempts, as the schedule inserts them; a later step with earlier actions, think traces
and observations; a sampled step, the GRPO target) in the run's thinking mode, with transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=..., enable_thinking=...)`, and compares the
texts byte for byte. A difference is one line: the first differing character (in which message), both snippets,
and the fix. A tokenizer without a template (the tiny worlds' tokenizers, the built-in Qwen 3.5 one) is skipped,
said at debug level.

What the check does not cover: Qwen 3.5's template trims each message's content, while `ContextBuilder` keeps
contents as given, so a content with leading or trailing whitespace (an observation ending in a newline) renders
differently; the representative messages have none. Texts are compared, not ids: `ContextBuilder` tokenizes each
segment on its own (see `tokenization`), which whole-text tokenization need not reproduce.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence

from rltldr_jax.tokenization import IM_END, IM_START, THINK, ContextBuilder, Insight, Step

log = logging.getLogger(__name__)

#: Where transformers reads a tokenizer's chat template: the `.jinja` file wins over the config's entry.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

#: The special tokens `apply_chat_template` passes to a template (from `tokenizer_config.json`).
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

#: Characters of each text shown before and after the first difference.
_SNIPPET = 30


class ChatFormatMismatch(ValueError):
    """Our contexts differ from the checkpoint's chat template (the message says where, and what to do)."""


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template, as transformers would load it.

    Attributes:
      text: the Jinja source.
      source: the file it was read from.
      special_tokens: the special tokens of `tokenizer_config.json` (`eos_token`, ...), which templates may read.
    """

    text: str
    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def renderer(self) -> Callable[[Sequence[Mapping[str, str]], bool, bool], str]:
        """`render(messages, add_generation_prompt, enable_thinking)`: transformers' `apply_chat_template` of this
        template (tokenize=False). The HF tokenizer it runs on holds no vocabulary: rendering text reads only the
        template and the special tokens, so the checkpoint's vocabulary is not loaded a second time."""
        import tokenizers
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer(tokenizers.models.BPE()),
            chat_template=self.text,
            **self.special_tokens,
        )

        def render(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool, enable_thinking: bool) -> str:
            return hf.apply_chat_template(
                [dict(m) for m in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
            )

        return render


def _special_tokens(config: Mapping[str, object]) -> dict[str, str]:
    tokens = {}
    for key in _SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):  # an AddedToken written as a dict
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def read_chat_template(path: str | os.PathLike) -> ChatTemplate | None:
    """The chat template of the tokenizer at `path` (a checkpoint directory, or its tokenizer.json), or None.

    As transformers loads it: `chat_template.jinja` if present, else `tokenizer_config.json`'s `chat_template` (a
    string, or named templates of which the one named "default" is used).
    """
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config: dict[str, object] = {}
    config_file = os.path.join(directory, TOKENIZER_CONFIG_FILE)
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as f:
            try:
                config = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"could not read {config_file}: {e} (not valid JSON: copy it again)") from None
    special = _special_tokens(config)
    jinja_file = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return ChatTemplate(f.read(), jinja_file, special)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return ChatTemplate(template, config_file, special)
    return None


# ----------------------------------------------------------------------------------------------------
# Representative conversations
# ----------------------------------------------------------------------------------------------------

_TASK = "Craft a wooden pickaxe.\nInventory: 3 logs.\nReply with one action per turn, for example craft('planks')."
_INSIGHTS = (
    Insight("Craft planks from the logs before anything else.", 1),
    Insight("A pickaxe needs sticks too: keep two planks for them.", 2),
)
#: (think trace, action, observation) of two earlier steps.
_STEPS = (
    ("Logs make planks, so planks come first.", "craft('planks')", "Crafted 4 planks. Inventory: 2 logs, 4 planks."),
    ("Sticks come from planks.", "craft('sticks')", "Crafted 4 sticks. Inventory: 2 logs, 2 planks, 4 sticks."),
)
_CURRENT = ("Planks and sticks are ready.", "craft('wooden_pickaxe')")


@dataclasses.dataclass(frozen=True)
class ChatCase:
    """One representative conversation, rendered by us and given as chat messages for the template.

    Attributes:
      name: what it is ("a task alone", ...).
      messages: the conversation as `apply_chat_template` takes it (assistant turns with their think traces).
      ours: the text of our context (`ContextBuilder.build`, decoded with special tokens).
      add_generation_prompt: whether our context ends with the generation prompt.
      closing: what the template renders after our last token: the newline after a sampled turn's `<|im_end|>`,
        which the policy never samples ("" for a prompt).
    """

    name: str
    messages: tuple[Mapping[str, str], ...]
    ours: str
    add_generation_prompt: bool = True
    closing: str = ""


def representative_cases(builder: ContextBuilder) -> list[ChatCase]:
    """The conversations `check_chat_template` compares, in `builder`'s thinking mode and insight scaffold.

    A task alone (the first step of an attempt; also the insight writer's prompt, one user message); the task with
    the insight messages of two failed attempts (an attempt the schedule gives insights); a later step of that
    attempt (earlier assistant turns, their think traces dropped, and observations); and that step sampled (the
    GRPO target: our context ends at the stop token, the template's turn adds its newline).
    """
    tok = builder.tokenizer
    # The assistant turn as the model writes it after "<|im_start|>assistant\n": the generation prompt's think
    # opening (a closed empty block when not thinking), then what it sampled.
    opening = f"{THINK}\n" if builder.thinking else f"{THINK}\n\n</think>\n\n"

    def sampled(think: str, action: str) -> str:
        return f"{think}\n</think>\n\n{action}" if builder.thinking else action

    def step(think: str, action: str, observation: str | None = None) -> tuple[Step, list[dict[str, str]]]:
        ids = tok.encode(sampled(think, action) + IM_END, special=True)
        messages = [{"role": "assistant", "content": opening + sampled(think, action)}]
        if observation is not None:
            messages.append({"role": "user", "content": observation})
        return Step(tuple(ids), observation), messages

    def text(context) -> str:
        return tok.decode(context.ids)

    task = [{"role": "user", "content": _TASK}]
    insights = [{"role": "user", "content": builder.insight_scaffold.format(n=i.attempt) + i.text} for i in _INSIGHTS]
    steps, history = [], []
    for think, action, observation in _STEPS:
        s, messages = step(think, action, observation)
        steps.append(s)
        history += messages
    current, current_message = step(*_CURRENT)
    conversation = (*task, *insights, *history)
    return [
        ChatCase("a task alone", tuple(task), text(builder.build(_TASK))),
        ChatCase(
            "a task with the insights of failed attempts 1 and 2",
            (*task, *insights),
            text(builder.build(_TASK, _INSIGHTS)),
        ),
        ChatCase(
            "step 3 of an attempt with insights",
            conversation,
            text(builder.build(_TASK, _INSIGHTS, steps)),
        ),
        ChatCase(
            "step 3 sampled (a training example)",
            (*conversation, *current_message),
            text(builder.build(_TASK, _INSIGHTS, steps, current)),
            add_generation_prompt=False,
            closing="\n",
        ),
    ]


# ----------------------------------------------------------------------------------------------------
# The check
# ----------------------------------------------------------------------------------------------------


def _first_difference(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def _snippet(text: str, at: int) -> str:
    start, end = max(0, at - _SNIPPET), at + _SNIPPET
    return ("…" if start else "") + repr(text[start:end]) + ("…" if end < len(text) else "")


def _where(ours: str, at: int, messages: Sequence[Mapping[str, str]]) -> str:
    """Which of our turns character `at` falls in: "in message 1 of 3 (user) at its character 12"."""
    starts = [m.start() for m in re.finditer(re.escape(IM_START), ours)]
    turn = bisect.bisect_right(starts, at)
    if turn == 0:
        return "before the first message"
    offset = at - starts[turn - 1]
    if turn > len(messages):
        return f"in the generation prompt at its character {offset}"
    return f"in message {turn} of {len(messages)} ({messages[turn - 1]['role']}) at its character {offset}"


def _first_mismatch(builder: ContextBuilder, render: Callable[..., str]) -> str | None:
    """What differs first between `builder`'s contexts and `render`'s texts, in words; None if nothing does."""
    for case in representative_cases(builder):
        expected = case.ours + case.closing
        try:
            theirs = render(case.messages, case.add_generation_prompt, builder.thinking)
        except Exception as e:  # the template is the checkpoint's code: any error it raises is the finding
            detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return f"it cannot render our context of {case.name} (rollout.thinking={builder.thinking}): {detail}"
        if theirs != expected:
            at = _first_difference(expected, theirs)
            return (
                f"our context of {case.name} (rollout.thinking={builder.thinking}) first differs at character {at}, "
                f"{_where(expected, at, case.messages)}: ours {_snippet(expected, at)} vs the template's "
                f"{_snippet(theirs, at)}"
            )
    return None


def check_chat_template(builder: ContextBuilder, template: ChatTemplate) -> None:
    """Raises ChatFormatMismatch (one line) unless `builder`'s contexts are byte-equal to what `template` renders
    for the same messages (`representative_cases`, in `builder`'s thinking mode)."""
    render = template.renderer()
    mismatch = _first_mismatch(builder, render)
    if mismatch is None:
        return
    other = not builder.thinking
    other_builder = ContextBuilder(builder.tokenizer, thinking=other, insight_scaffold=builder.insight_scaffold)
    if _first_mismatch(other_builder, render) is None:
        fix = (
            f"this template renders our rollout.thinking={other} format: set rollout.thinking={other} "
            f"(--config.rollout.thinking={other}), or use a checkpoint whose template has Qwen 3.5's "
            f"rollout.thinking={builder.thinking} format"
        )
    else:
        fix = (
            "this checkpoint's chat template differs from Qwen 3.5's, the format rltldr_jax renders "
            "(tokenization.ContextBuilder): use a Qwen 3.5 checkpoint, or, if this one was tuned on Qwen 3.5's "
            "format, a tokenizer with Qwen 3.5's template (config tokenizer=DIR)"
        )
    raise ChatFormatMismatch(
        f"the chat template of {template.source} does not match our chat format: {mismatch}; {fix}"
    )


#: (template file, template, thinking, insight scaffold) already checked in this process.
_checked: set[tuple[str, str, bool, str]] = set()


def check_chat_format(builder: ContextBuilder) -> bool:
    """Checks the policy's contexts against its checkpoint's chat template, once per process and format.

    The template is looked for next to the tokenizer's tokenizer.json (`Tokenizer.path`, set by `load_tokenizer`).

    Returns:
      True if a template was found and matches; False if there is none to check against (a tokenizer built in
      memory, or one without a template: logged at debug level).

    Raises:
      ChatFormatMismatch: the template renders the representative conversations differently (see
        `check_chat_template`).
    """
    path = getattr(builder.tokenizer, "path", None)
    if path is None:
        log.debug("chat format: the tokenizer was not read from a checkpoint; no chat template to check against")
        return False
    template = read_chat_template(path)
    if template is None:
        log.debug("chat format: %s has no chat template; nothing to check against", os.path.dirname(path))
        return False
    key = (template.source, template.text, builder.thinking, builder.insight_scaffold)
    if key not in _checked:
        check_chat_template(builder, template)
        _checked.add(key)
        log.info("chat format: our contexts match the chat template of %s", template.source)
    return True
