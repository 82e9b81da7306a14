"""HF safetensors ⇄ our parameters: `load_pretrained` and `save_pretrained`.

Reads the released VLM layout (`model.language_model.*`, with `model.visual.*` and `mtp.*` skipped) or the
text layout (`model.*`), through `model.safetensors.index.json` or a single `model.safetensors`. Writes the
text layout of `Qwen3_5ForCausalLM`, which transformers and SGLang load; with `ServingFiles` (the policy's tokenizer
and sampling) also the tokenizer files and generation_config.json, so that the directory is a complete HF model
(`save_pretrained`), or a PEFT adapter with the tokenizer files (`save_peft_adapter`). Files are written 0644.

Name and layout mapping. Layer i = p·b + start(r) + j: block b (of `num_blocks`), run r of the block pattern
(length p; runs of one layer type, `config.block_runs`), layer j within the run:

    model.embed_tokens.weight [V, d]                 embed_tokens.embedding [V, d]
    model.layers.{i}.<...>.{proj}.weight [out, in]   blocks.runs.{r}.<...>.{proj}.kernel [n_blocks, run, in, out]
    model.layers.{i}.linear_attn.conv1d.weight [C, 1, K]   blocks.runs.{r}.linear_attn.conv_weight [n_blocks, run, K, C]
    model.layers.{i}.<...>.weight / A_log / dt_bias  blocks.runs.{r}.<...> [n_blocks, run, ...]
    model.norm.weight                                norm.weight
    lm_head.weight [V, d]                            lm_head.kernel [d, V]      (absent when tied)

Norm weights are stored as they are (zero-centred norms keep the offset convention of the checkpoint).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rltldr_jax.mismatch import mismatch_problems
from rltldr_jax.models.config import Qwen35Config
from rltldr_jax.models.qwen3_5 import ModelSpec, Qwen35
from rltldr_jax.tokenization import ENDOFTEXT, TOKENIZER_COMPANIONS, Tokenizer, load_tokenizer, write_hf_tokenizer

VLM_PREFIX = "model.language_model."
SKIPPED_PREFIXES = ("model.visual.", "mtp.")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

Path = tuple[str | int, ...]


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture: the message lists what is missing/unexpected/mis-shaped."""


#: How to load weights holding NaN/inf anyway (CorruptCheckpointError messages end with it).
ALLOW_NONFINITE_HINT = (
    "to load it anyway: allow_nonfinite=True "
    "(--config.model.allow_nonfinite=True; --allow_nonfinite of export_hf, serve)"
)


class CorruptCheckpointError(ValueError):
    """A checkpoint file that cannot be read (truncated, garbled) or whose weights hold NaN/inf; the message names
    the file (or the training checkpoint's step and item) and the fix."""


@contextlib.contextmanager
def open_safetensors(file: str) -> Iterator[Any]:
    """`safe_open(file, framework="numpy")`, with an unreadable file (truncated, garbled header) raised as
    CorruptCheckpointError naming it instead of safetensors' own error."""
    try:
        handle = safe_open(file, framework="numpy")
    except SafetensorError as e:
        raise CorruptCheckpointError(
            f"{file} is not a readable safetensors file ({e}): it is truncated or damaged; download or export it again"
        ) from None
    with handle as f:
        yield f


def check_finite(value: np.ndarray, what: str) -> None:
    """Raises CorruptCheckpointError if the float array `value` (any shape) holds NaN or inf; `what` names it.

    One float64 sum (no array-sized temporary): it is finite exactly when every element is.
    """
    if np.issubdtype(value.dtype, np.integer) or value.dtype == bool:
        return
    if not np.isfinite(np.sum(value, dtype=np.float64)):
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        raise CorruptCheckpointError(
            f"{what} holds {bad} NaN/inf values of {value.size}: "
            "the checkpoint is damaged or diverged; use another, or " + ALLOW_NONFINITE_HINT
        )


# ----------------------------------------------------------------------------------------------------
# Name mapping
# ----------------------------------------------------------------------------------------------------


def _hf_suffix(path: Path) -> tuple[str, str]:
    """Our parameter path (below a layer, or top level) → (HF name suffix, transform: plain | linear | conv)."""
    *head, leaf = (str(p) for p in path)
    if leaf == "kernel":
        return ".".join([*head, "weight"]), "linear"
    if leaf == "conv_weight":
        return ".".join([*head, "conv1d", "weight"]), "conv"
    if leaf == "embedding":
        return ".".join([*head, "weight"]), "plain"
    return ".".join([*head, leaf]), "plain"


def hf_names(path: Path, config: Qwen35Config) -> tuple[list[list[str]] | list[str], str]:
    """The HF tensor names of one of our parameters and their transform.

    Stacked block parameters get a [n_blocks][run_length] nested list of names; others a single-name list.
    """
    if path[:2] == ("blocks", "runs"):
        r = int(path[2])
        suffix, transform = _hf_suffix(path[3:])
        p = len(config.block_pattern)
        start = sum(n for _, n in config.block_runs[:r])
        run = config.block_runs[r][1]
        return [
            [f"model.layers.{b * p + start + j}.{suffix}" for j in range(run)] for b in range(config.num_blocks)
        ], transform
    if path[0] == "lm_head":
        return ["lm_head.weight"], "linear"
    suffix, transform = _hf_suffix(path)
    return [f"model.{suffix}"], transform


def _to_ours(t: np.ndarray, transform: str) -> np.ndarray:
    if transform == "linear":
        return t.T
    if transform == "conv":  # [C, 1, K] → [K, C]
        return t[:, 0, :].T
    return t


def _to_hf(t: np.ndarray, transform: str) -> np.ndarray:
    if transform == "linear":
        return np.ascontiguousarray(t.T)
    if transform == "conv":  # [K, C] → [C, 1, K]
        return np.ascontiguousarray(t.T[:, None, :])
    return np.ascontiguousarray(t)


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------


def _weight_files(path: str) -> dict[str, str]:
    """HF tensor name → file, from the index (any shard names) or the single file."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptCheckpointError(f"{index} is not a readable safetensors index ({e!r})") from None
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(single):
        with open_safetensors(single) as f:
            return {name: single for name in f.keys()}
    raise FileNotFoundError(f"no {INDEX_FILE} or {SINGLE_FILE} in {path!r}: not an HF safetensors checkpoint")


def _text_name(name: str) -> str | None:
    """VLM layout → text layout name; None for tensors the text model ignores (vision tower, MTP head)."""
    if name.startswith(SKIPPED_PREFIXES):
        return None
    if name.startswith(VLM_PREFIX):
        return "model." + name[len(VLM_PREFIX) :]
    return name


class _Reader(contextlib.ExitStack):
    """Reads tensors by (text-layout) name; each file is opened once and closed when the context exits."""

    def __init__(self, path: str):
        super().__init__()
        self.files: dict[str, tuple[str, str]] = {}  # text name → (file, stored name)
        for stored, file in _weight_files(path).items():
            text = _text_name(stored)
            if text is not None:
                self.files[text] = (file, stored)
        self._open: dict[str, Any] = {}

    def get(self, name: str) -> np.ndarray:
        file, stored = self.files[name]
        if file not in self._open:
            self._open[file] = self.enter_context(open_safetensors(file))
        try:
            return self._open[file].get_tensor(stored)
        except SafetensorError as e:
            raise CorruptCheckpointError(
                f"{file}: tensor {stored} cannot be read ({e}); download or export it again"
            ) from None


def load_pretrained(
    path: str | os.PathLike,
    *,
    dtype=None,
    compute_dtype=jnp.float32,
    remat: bool = False,
    allow_nonfinite: bool = False,
) -> Qwen35:
    """A Qwen 3.5 model with the weights of an HF checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors(.index.json); VLM or text layout.
      dtype: parameter dtype to cast to; None keeps each tensor's stored dtype (e.g. bf16 weights, fp32 A_log).
      compute_dtype: activation dtype of the forward pass.
      remat: rematerialise blocks in the backward pass.
      allow_nonfinite: accept tensors holding NaN/inf (by default they are CorruptCheckpointError).

    Returns:
      The model; called on int32 ids [B, T] it returns float32 logits [B, T, vocab].

    Raises:
      CheckpointError listing every missing, unexpected or mis-shaped tensor.
      CorruptCheckpointError naming an unreadable file, or a tensor holding NaN/inf.
    """
    path = os.fspath(path)
    config = Qwen35Config.from_pretrained(path)
    abstract = ModelSpec(config, dtype=compute_dtype, param_dtype=dtype or jnp.float32, remat=remat).abstract()
    graphdef, state = nnx.split(abstract)
    missing, misshaped, used = [], [], set()
    leaves: dict[Path, np.ndarray] = {}
    with _Reader(path) as reader:
        for key, var in nnx.to_flat_state(state):
            names, transform = hf_names(key, config)
            stacked = key[0] == "blocks"
            flat_names = [n for per_block in names for n in per_block] if stacked else names
            absent = [n for n in flat_names if n not in reader.files]
            used.update(n for n in flat_names if n in reader.files)  # expected names are never "unexpected"
            if absent:
                missing += absent
                continue
            expected = tuple(var.shape[2:] if stacked else var.shape)  # one layer's shape
            parts = {n: _to_ours(reader.get(n), transform) for n in flat_names}
            if not allow_nonfinite:
                for n, p in parts.items():
                    check_finite(p, f"{reader.files[n][0]}: tensor {reader.files[n][1]}")
            wrong = [
                f"{n}: checkpoint {p.shape} ≠ expected {expected}" for n, p in parts.items() if p.shape != expected
            ]
            if wrong:
                misshaped += wrong
                continue
            if stacked:
                value = np.stack([np.stack([parts[n] for n in per_block]) for per_block in names])
            else:
                value = parts[names[0]]
            leaves[key] = value if dtype is None else value.astype(dtype)
    unexpected = sorted(set(reader.files) - used - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    problems = mismatch_problems(missing=missing, unexpected=unexpected, mis_shaped=misshaped, what="tensors")
    if problems:
        raise CheckpointError(f"checkpoint {path!r} does not match its config.json: " + " | ".join(problems))
    flat = [(key, jnp.asarray(leaves[key])) for key, _ in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


# ----------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------

#: Modes of what an export writes: readable by every user, as generation servers running as another user need
#: (safetensors writes its files 0600). A directory that existed keeps its mode.
FILE_MODE, DIR_MODE = 0o644, 0o755
GENERATION_CONFIG = "generation_config.json"


@dataclasses.dataclass(frozen=True)
class ServingFiles:
    """What an HF model directory holds beside its weights, so that transformers, SGLang and our launchers use it as
    is: the policy's tokenizer as HF tokenizer files (`tokenization.write_hf_tokenizer`: tokenizer.json,
    tokenizer_config.json with a chat template, ...) and generation_config.json (stop, padding and BOS ids, the run's
    sampling); config.json gets the BOS and EOS ids too.

    Attributes:
      tokenizer: what `load_tokenizer` takes (a tokenizer.json, a directory holding one); None: the built-in Qwen 3.5.
      thinking: default of the written chat template's `enable_thinking` (the run's `rollout.thinking`); a tokenizer
        that brings a chat template of its own keeps it.
      temperature, top_p, top_k: the run's sampling (`rollout.*`) for generation_config.json; None is not written,
        nor is top_k <= 0 (off).
    """

    tokenizer: str | None = None
    thinking: bool = True
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    @classmethod
    def of_run(cls, run_config: Mapping[str, Any] | None, tokenizer: str | None = None) -> ServingFiles | None:
        """Those of a training run, from its recorded config (the `Checkpointer` metadata's "config", as
        `settings.as_dict` gives it): the tokenizer its trainer loaded (`tokenizer`, else `model.checkpoint`'s (a PEFT
        adapter without one: `model.base_checkpoint`'s), else the built-in one), its thinking mode and sampling.
        `tokenizer` replaces the run's tokenizer. None when there is neither a recorded config nor `tokenizer`."""
        from rltldr_jax.models.lora import is_adapter_dir

        if not isinstance(run_config, Mapping):
            return None if tokenizer is None else cls(tokenizer=tokenizer)
        model = run_config.get("model") or {}
        rollout = run_config.get("rollout") or {}
        if tokenizer is None:
            tokenizer = run_config.get("tokenizer") or model.get("checkpoint") or None
            if (
                tokenizer
                and is_adapter_dir(tokenizer)
                and not os.path.isfile(os.path.join(tokenizer, "tokenizer.json"))
            ):
                tokenizer = model.get("base_checkpoint") or tokenizer
        return cls(
            tokenizer=tokenizer,
            thinking=bool(rollout.get("thinking", True)),
            temperature=rollout.get("temperature"),
            top_p=rollout.get("top_p"),
            top_k=rollout.get("top_k"),
        )

    @classmethod
    def of_checkpoint(
        cls, checkpoint_dir: str | os.PathLike, step: int | None, tokenizer: str | None = None
    ) -> ServingFiles | None:
        """`of_run` of the config recorded with a training checkpoint (`Checkpointer` directory, step; None: latest)."""
        from rltldr_jax.checkpoint import Checkpointer

        with Checkpointer(checkpoint_dir, keep=None, async_save=False, create=False) as ckpt:
            _, _, meta = ckpt.read_state(step)
        return cls.of_run(meta.get("config"), tokenizer)

    def checked_tokenizer(self, config: Qwen35Config) -> Tokenizer:
        """The tokenizer, checked against the model it is written with.

        Raises:
          FileNotFoundError: it is gone; ValueError: it is unusable, or has more ids than the model's vocabulary.
        """
        fix = "give the tokenizer the model was trained with (ServingFiles.tokenizer, --tokenizer of export_hf)"
        try:
            tokenizer = load_tokenizer(self.tokenizer)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"the policy's tokenizer is gone: {e}; {fix}") from None
        if tokenizer.vocab_size > config.vocab_size:
            what = self.tokenizer or "the built-in Qwen 3.5 tokenizer"
            raise ValueError(
                f"the tokenizer {what} has {tokenizer.vocab_size} ids but the model only {config.vocab_size} "
                f"(vocab_size): they do not belong together; {fix}"
            )
        return tokenizer

    def config_ids(self, tokenizer: Tokenizer) -> dict[str, int]:
        """The special ids config.json gets: BOS `<|endoftext|>` (as Qwen's releases have it; the tokenizer adds no BOS)
        and EOS `<|im_end|>`, the end of an assistant turn. (No padding id: transformers would zero that embedding.)"""
        eot = tokenizer.token_to_id(ENDOFTEXT)
        return ({} if eot is None else {"bos_token_id": eot}) | {"eos_token_id": tokenizer.im_end_id}

    def generation_config(self, tokenizer: Tokenizer) -> dict[str, Any]:
        """generation_config.json: `config_ids` with EOS every stop id of `tokenizer` (`<|im_end|>`, `<|endoftext|>`),
        padding `<|endoftext|>` (`<|im_end|>` without one), and the run's sampling when known."""
        eot = tokenizer.token_to_id(ENDOFTEXT)
        out: dict[str, Any] = self.config_ids(tokenizer) | {
            "eos_token_id": list(tokenizer.stop_ids),
            "pad_token_id": tokenizer.im_end_id if eot is None else eot,
        }
        if self.temperature is not None:
            out |= {"do_sample": True, "temperature": float(self.temperature)}
        if self.top_p is not None:
            out["top_p"] = float(self.top_p)
        if self.top_k is not None and self.top_k > 0:
            out["top_k"] = int(self.top_k)
        return out

    def write(
        self, directory: str, tokenizer: Tokenizer, config: Qwen35Config, *, generation: bool = True
    ) -> list[str]:
        """Writes the tokenizer files (and generation_config.json) into `directory`; returns the names written."""
        names = write_hf_tokenizer(
            directory, self.tokenizer, thinking=self.thinking, model_max_length=config.max_position_embeddings
        )
        if generation:
            with open(os.path.join(directory, GENERATION_CONFIG), "w", encoding="utf-8") as f:
                json.dump(self.generation_config(tokenizer), f, indent=2)
            names.append(GENERATION_CONFIG)
        return names


def _refuse_adapters(model: Qwen35) -> None:
    """A model with LoRA adapters has no HF text layout of its own (ValueError naming the two ways out)."""
    from rltldr_jax.models.lora import has_adapters

    if has_adapters(model):
        raise ValueError(
            "the model holds LoRA adapters, which an HF model directory has no place for: export `lora.merged(model)` "
            "(full weights) or `lora.save_adapter(model, dir)` (a PEFT adapter)"
        )


def hf_tensors(model: Qwen35, dtype=None) -> Iterator[tuple[str, np.ndarray]]:
    """(HF text-layout name, host array) for every tensor of the model, in a stable order.

    Args:
      dtype: cast to this dtype on the way out; None keeps each parameter's dtype.
    """
    config = model.config
    _refuse_adapters(model)
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names, transform = hf_names(key, config)
        value = np.asarray(jax.device_get(var[...]))
        if dtype is not None:
            value = value.astype(dtype)
        if key[0] == "blocks":
            for b, per_block in enumerate(names):
                for j, name in enumerate(per_block):
                    yield name, _to_hf(value[b, j], transform)
        else:
            yield names[0], _to_hf(value, transform)


def save_pretrained(
    model: Qwen35,
    path: str | os.PathLike,
    *,
    dtype=None,
    max_shard_bytes: int = 5 * 2**30,
    serving: ServingFiles | None = None,
) -> None:
    """Writes config.json and safetensors shards (+ index when more than one) in HF's text layout, and with `serving`
    the tokenizer files and generation_config.json (`ServingFiles`): a complete HF model directory.

    An export replaces the directory's weights (and with `serving` its tokenizer files and generation config) as a
    whole: it is written to a temporary directory next to `path` and swapped in when complete (one atomic
    `renameat2(RENAME_EXCHANGE)` where the OS has it, else two renames), so `path` never holds a mix of two exports (a
    stale model.safetensors.index.json of an earlier sharded export would otherwise win over a new single file) and an
    interrupted export leaves the previous one as it was. The other files of an existing `path` (a README; without
    `serving`, its tokenizer files) are kept (hard-linked into the new directory). What is written is readable by
    every user (files 0644; a new directory 0755, an existing one keeps its mode): generation servers often run as
    another user.

    Args:
      model: the model to save.
      path: output directory (created; a symbolic link to a directory: the directory it points to is replaced).
      dtype: tensor dtype to write; None keeps each parameter's dtype.
      max_shard_bytes: shard size limit; tensors are never split.
      serving: the tokenizer and sampling to ship with the weights; None writes the weights alone.

    Raises:
      PermissionError: `path` exists and is not writable (nothing is written), or its parent is not writable.
      NotADirectoryError: `path` exists and is not a directory.
      ValueError: the model holds LoRA adapters (save `lora.merged(model)`, or the adapter: `lora.save_adapter`), or
        `serving`'s tokenizer does not fit the model (`ServingFiles.checked_tokenizer`; checked before anything is
        written, as is FileNotFoundError for a tokenizer that is gone).
    """
    _refuse_adapters(model)
    tokenizer = None if serving is None else serving.checked_tokenizer(model.config)

    def replaced(name: str) -> bool:  # what this export writes, and so replaces
        return _is_weight_file(name) or (serving is not None and _is_serving_file(name))

    with _replaced_directory(path, replaced) as tmp:
        ids = {} if tokenizer is None else serving.config_ids(tokenizer)
        names = _write_weights(model, tmp, dtype=dtype, max_shard_bytes=max_shard_bytes, config_ids=ids)
        if serving is not None:
            names += serving.write(tmp, tokenizer, model.config)
        _readable(tmp, names)


def save_peft_adapter(
    model: Qwen35, path: str | os.PathLike, *, base_model: str = "", serving: ServingFiles | None = None
) -> list[str]:
    """`models.lora.save_adapter` (a PEFT LoRA adapter directory: adapter_config.json, adapter_model.safetensors),
    with `serving`'s tokenizer files beside it (as PEFT adapters on the hub ship them; no generation_config.json: the
    base model's applies). The directory is replaced as a whole. Returns the adapted module names.

    Raises:
      ValueError: the model holds no adapters (or several ranks), or the tokenizer does not fit the model.
    """
    from rltldr_jax.models.lora import save_adapter

    tokenizer = None if serving is None else serving.checked_tokenizer(model.config)
    with _replaced_directory(path, lambda name: True) as tmp:
        modules = save_adapter(model, tmp, base_model=base_model)  # (puts the adapter directory in tmp's place)
        if serving is not None:
            _readable(tmp, serving.write(tmp, tokenizer, model.config, generation=False))
    return modules


def _is_weight_file(name: str) -> bool:
    """What an export writes (and so replaces): config.json, *.safetensors and the index."""
    return name in ("config.json", INDEX_FILE) or name.endswith(".safetensors")


def _is_serving_file(name: str) -> bool:
    """The tokenizer files and generation config of a model directory (replaced by an export with `ServingFiles`)."""
    return name in ("tokenizer.json", GENERATION_CONFIG, *TOKENIZER_COMPANIONS) or name.endswith(
        (".model", ".tiktoken")
    )


def _readable(directory: str, names: list[str]) -> None:
    """Makes the files `names` of `directory` (written there by this export) readable by every user (`FILE_MODE`)."""
    for name in names:
        os.chmod(os.path.join(directory, name), FILE_MODE)


@contextlib.contextmanager
def _replaced_directory(path: str | os.PathLike, replaced: Callable[[str], bool]) -> Iterator[str]:
    """Yields a new empty directory next to `path` to write an export into; when the block completes, it takes
    `path`'s place (`_swap_directories`), holding also the entries of an existing `path` that the block did not write
    and `replaced(name)` does not claim (hard-linked). Mode: an existing `path`'s, else `DIR_MODE`. On an error
    nothing changes at `path` and the temporary directory is removed.

    Raises:
      PermissionError: `path` exists and is not writable, or its parent is not writable.
      NotADirectoryError: `path` exists and is not a directory.
    """
    path = os.path.realpath(os.fspath(path))
    parent, name = os.path.split(path)
    exists = os.path.lexists(path)
    if exists and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", path)
    if exists and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "the directory is not writable", path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.export-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    try:
        yield tmp
        if exists:
            for entry in os.listdir(path):
                if not replaced(entry) and not os.path.lexists(os.path.join(tmp, entry)):  # the directory's other files
                    _link_tree(os.path.join(path, entry), os.path.join(tmp, entry))
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            _swap_directories(tmp, path)  # `tmp` now holds the previous export
        else:
            os.chmod(tmp, DIR_MODE)
            os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _link_tree(src: str, dst: str) -> None:
    """`src` (file, directory or symbolic link) at `dst`: files hard-linked (copied across filesystems)."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    else:
        link(src, dst)


def _swap_directories(a: str, b: str) -> None:
    """Exchanges two directories of one parent: atomically with Linux's renameat2(RENAME_EXCHANGE), else (other
    systems, file systems without it) by two renames, between which `b` is briefly absent (never mixed)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
    aside = f"{a}.previous"
    os.rename(b, aside)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(aside, b)  # the previous export back in place
        raise
    os.rename(aside, a)


def _write_weights(
    model: Qwen35, path: str, *, dtype, max_shard_bytes: int, config_ids: Mapping[str, Any] | None = None
) -> list[str]:
    """config.json (with `config_ids` added: special token ids) and the safetensors shards (+ index when more than one)
    of `model` into the directory `path`; returns the names written."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    total = 0
    for name, tensor in hf_tensors(model, dtype):
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
        total += tensor.nbytes
    config = model.config.to_hf_dict() | dict(config_ids or {})
    config["dtype"] = str(np.dtype(dtype or next(iter(shards[0].values())).dtype))
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
        return ["config.json", SINGLE_FILE]
    weight_map = {}
    names = ["config.json", INDEX_FILE]
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
        names.append(file)
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return names
