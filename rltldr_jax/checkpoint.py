"""Training checkpoints (orbax) and their export to HF safetensors.

A checkpoint is everything a resumed run needs to continue exactly where it stopped:

    {directory}/{step}/
      params/      the model state (`nnx.split(model)[1]`), an orbax StandardSave pytree (tensorstore/OCDBT)
      opt_state/   the optax state, StandardSave (absent when saved with opt_state=None)
      state/       JSON: {"format", "step", "rng": key data + impl, "model_config": Qwen35Config.to_hf_dict(),
                   "checksums": {"algorithm", "params": {name: checksum}, "opt_state": {...}, "meta": checksum},
                   "state_checksum": of the rest of this JSON}
      meta/        JSON: the caller's dict (task cursor, collector/schedule state, metric accumulators, config,
                   phase index, env-step counter, weight version, ...)
      _CHECKPOINT_METADATA, commit_success.txt   (orbax)

Saving is atomic (orbax writes `{step}.orbax-checkpoint-tmp-*` and renames it when complete), so a crash
mid-save leaves the previous checkpoints intact and the partial one is never listed. Saves are asynchronous
by default: `save` returns once the arrays are copied off the accelerator (so the caller may donate or
overwrite them), the write continues in the background; `wait_until_finished` blocks until it is on disk.
A save first checks the free space against the checkpoint's size (params + optimizer state bytes, plus a
margin); a failed save (a full disk, an I/O error) is `CheckpointSaveError`, raised by `check_saved` (the trainer
calls it before more compute), `wait_until_finished` or the next `save`, and its temporary directory is removed.

In a multi-process job every process calls `save`, `restore`, `check_saved` and `close` at the same point (orbax
writes each process's shards and process 0 the metadata, on a filesystem all of them see); the decisions around
them (enough free space, is a save still running, did it fail) are made once for all, so no process goes its own
way.

`restore` restores into abstract targets (`jax.ShapeDtypeStruct`s, e.g. from `nnx.eval_shape` and
`jax.eval_shape(tx.init, ...)`) with their shardings, so a sharded model restores straight into its mesh
layout; every parameter's name, shape and dtype is checked against the checkpoint first, and a different
architecture fails with `CheckpointMismatchError` naming the mismatching parameters. Unreadable files (truncated,
damaged), restored arrays or JSON that differ from the checksums recorded at save time (`CHECKSUM_ALGORITHM`:
computed before `save` returns, on the accelerator or with numpy for host arrays; a flipped bit is always caught), and
restored arrays holding NaN/inf (unless `allow_nonfinite=True`) are `CorruptCheckpointError` naming the step and
item (the trainer's `--resume` then falls back to the newest intact step). Checkpoints saved before checksums were
recorded restore unverified, with a warning.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rltldr_jax import distributed
from rltldr_jax.mismatch import mismatch_problems
from rltldr_jax.models.config import Qwen35Config
from rltldr_jax.models.hf import ALLOW_NONFINITE_HINT, CorruptCheckpointError

FORMAT_VERSION = 1
ITEMS = ("params", "opt_state", "state", "meta")
_ARRAY_ITEMS = ("params", "opt_state")
#: A save needs the bytes of params + optimizer state times (1 + SPACE_MARGIN), plus SPACE_SLACK_BYTES (metadata).
SPACE_MARGIN = 0.1
SPACE_SLACK_BYTES = 16 * 2**20

log = logging.getLogger(__name__)


class CheckpointMismatchError(ValueError):
    """The restore target does not match the checkpoint: the message lists missing/unexpected/mis-shaped arrays."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (not enough free space, an I/O error): the message names the step, the
    directory and the reason; no partial checkpoint is left behind."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Checkpointer.restore` returns.

    Attributes:
      params: the model state, with the structure and shardings of `abstract_params`.
      opt_state: the optimizer state (None when not asked for).
      step: the checkpoint's step.
      rng: the JAX key as saved (typed key or raw uint32 key data), None if none was saved.
      meta: the JSON dict given to `save` (as JSON gives it back: tuples become lists, keys strings).
      model_config: the architecture recorded at save time, None if none was given.
    """

    params: Any
    opt_state: Any
    step: int
    rng: jax.Array | None
    meta: dict[str, Any]
    model_config: Qwen35Config | None


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------


def _key_name(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _flat(tree) -> dict[str, Any]:
    """Dotted path ("blocks.runs.0.mlp.up_proj.kernel.value", "1.0.mu.…") → leaf."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in leaves}


def _jsonable(value: Any, what: str) -> Any:
    """`value` as JSON gives it back; numpy/JAX scalars and arrays become Python numbers and lists."""

    def default(o):
        if isinstance(o, (np.generic,)):
            return o.item()
        if isinstance(o, (np.ndarray, jax.Array)):
            return np.asarray(o).tolist()
        if isinstance(o, (set, frozenset)):
            return sorted(o)
        raise TypeError(f"{what} must be JSON-serialisable; found {type(o).__name__}: {o!r:.80}")

    return json.loads(json.dumps(value, default=default))


def _rng_to_json(rng) -> dict[str, Any] | None:
    if rng is None:
        return None
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    typed = bool(jnp.issubdtype(rng.dtype, jax.dtypes.prng_key))
    data = np.asarray(jax.device_get(jax.random.key_data(rng) if typed else rng))
    return {
        "typed": typed,
        "impl": str(jax.random.key_impl(rng)) if typed else None,
        "dtype": str(data.dtype),
        "shape": list(data.shape),
        "data": data.ravel().tolist(),
    }


def _rng_from_json(raw: Mapping[str, Any] | None) -> jax.Array | None:
    if raw is None:
        return None
    data = jnp.asarray(np.asarray(raw["data"], dtype=raw["dtype"]).reshape(raw["shape"]))
    return jax.random.wrap_key_data(data, impl=raw["impl"]) if raw["typed"] else data


def _config_dict(config) -> dict[str, Any] | None:
    if config is None:
        return None
    if hasattr(config, "config") and isinstance(config.config, Qwen35Config):  # a ModelSpec
        config = config.config
    if isinstance(config, Qwen35Config):
        return config.to_hf_dict()
    if isinstance(config, Mapping):
        return Qwen35Config.from_hf_dict(dict(config)).to_hf_dict()
    raise TypeError(f"model_config must be a Qwen35Config, ModelSpec or HF config dict, not {type(config).__name__}")


def _abstract(tree, default_sharding: jax.sharding.Sharding):
    """Leaves → ShapeDtypeStruct with a sharding (their own, else `default_sharding`)."""

    def one(x):
        sharding = getattr(x, "sharding", None)
        if not isinstance(sharding, jax.sharding.Sharding):
            sharding = default_sharding
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    return jax.tree.map(one, tree)


def _fmt_shape(x) -> str:
    return f"{tuple(x.shape)} {np.dtype(x.dtype).name}"


def _compare(item: str, target, stored_metadata) -> list[str]:
    """Problems (empty when none) of restoring checkpoint item `item` into `target`."""
    want, have = _flat(target), _flat(stored_metadata)
    missing = [n for n in want if n not in have]
    unexpected = [n for n in have if n not in want]
    wrong = [
        f"{n}: checkpoint {_fmt_shape(have[n])} ≠ target {_fmt_shape(want[n])}"
        for n in want
        if n in have
        and (tuple(have[n].shape) != tuple(want[n].shape) or np.dtype(have[n].dtype) != np.dtype(want[n].dtype))
    ]

    return [
        f"{item}: {p}"
        for p in mismatch_problems(missing=missing, unexpected=unexpected, mis_shaped=wrong, what="arrays")
    ]


def tree_bytes(*trees) -> int:
    """Bytes of every array leaf of the trees (global sizes, as a checkpoint stores them)."""
    return sum(
        int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(trees) if hasattr(x, "dtype")
    )


def free_bytes(directory: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem that holds (or will hold) `directory`; None for remote paths (gs://)."""
    path = os.fspath(directory)
    if "://" in path:
        return None
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def error_reason(e: BaseException) -> str:
    """The innermost cause's first line (TensorStore's own message names the file and what is wrong)."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    text = str(e).split(". See full TensorStore details")[0].strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


# ----------------------------------------------------------------------------------------------------
# Checksums
# ----------------------------------------------------------------------------------------------------

#: The array checksum recorded at save time (state["checksums"]["algorithm"]): two 32-bit lanes, each the sum mod
#: 2**32 over the elements of MurmurHash3's finaliser applied to (the element's bits XOR a function of its
#: row-major position). A sum does not depend on how the array is sharded or in which order it is reduced, so the
#: same checksum comes out on any mesh and on either path: on the accelerator (one fused jitted pass per array) or,
#: for arrays in host memory, with numpy in cache-sized chunks (no compilation). One changed element always changes
#: both lanes (the finaliser is a bijection), several escape with probability ~2**-64. Not a cryptographic hash: it
#: detects damage (flipped bits, garbled or misplaced blocks), not deliberate forgery.
CHECKSUM_ALGORITHM = "fmix32x2-v1"
_U32 = jnp.uint32
_LANE_A = (0x9E3779B9, 0)  # lane = fmix32(bits ^ (position * multiplier + offset))
_LANE_B = (0x7FEB352D, 0x846CA68B)
#: Elements per numpy chunk on the host path (fits in the L2 cache with its temporaries).
_HOST_CHUNK = 1 << 16
#: Elements per task of the host path's thread pool (larger arrays are checksummed on every core).
_HOST_TASK = 1 << 22


def _fmix32(h):
    """MurmurHash3's 32-bit finaliser, elementwise on uint32 (jax or numpy; a bijection: every input bit reaches every
    output bit)."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32: shape x.shape (1-, 2- and 4-byte dtypes, typed keys as their key data), or
    [*x.shape, 2] for 8-byte dtypes. Bool and sub-byte integer dtypes (int4) are converted, which is exact."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    bits = jax.dtypes.itemsize_bits(x.dtype)
    if x.dtype == jnp.bool_ or bits < 8:
        return x.astype(_U32)
    uint = {8: jnp.uint8, 16: jnp.uint16, 32: _U32, 64: _U32}[bits]
    return jax.lax.bitcast_convert_type(x, uint).astype(_U32)


def _positions(shape: tuple[int, ...]) -> jax.Array:
    """Every element's row-major position (mod 2**32), uint32 [*shape], built from iotas (nothing is stored)."""
    pos, stride = jnp.zeros(shape, _U32), 1
    for d in reversed(range(len(shape))):
        pos = pos + jax.lax.broadcasted_iota(_U32, shape, d) * _U32(stride % 2**32)
        stride *= shape[d]
    return pos


@jax.jit
def _inspect_device(leaves: list[jax.Array]) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """Per array: (all elements finite (integer arrays: True), checksum lane a, lane b); one fused pass each."""

    def one(x):
        w = _words(x)
        pos = _positions(w.shape)
        a, b = (jnp.sum(_fmix32(w ^ (pos * _U32(m) + _U32(o))), dtype=_U32) for m, o in (_LANE_A, _LANE_B))
        finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
        return finite, a, b

    return [one(x) for x in leaves]


def _inspect_host(x: Any) -> tuple[bool, int, int]:
    """`_inspect_device` of one array in host memory, with numpy (the same numbers)."""
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    x = np.ascontiguousarray(np.asarray(x))
    bits = jax.dtypes.itemsize_bits(x.dtype)
    finite = True
    if np.issubdtype(x.dtype, np.inexact) or jnp.issubdtype(x.dtype, jnp.inexact):  # (ml_dtypes: bf16, fp8)
        with np.errstate(invalid="ignore", over="ignore"):
            finite = bool(np.isfinite(np.sum(x, dtype=np.float64)))  # finite exactly when every element is
    if x.dtype == np.bool_ or bits < 8:
        flat = (x.reshape(-1).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    else:
        flat = x.reshape(-1).view({8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint32}[bits])
    spans = [(start, min(start + _HOST_TASK, flat.size)) for start in range(0, flat.size, _HOST_TASK)]
    if len(spans) > 1:  # numpy releases the GIL in its loops: the spans run in parallel
        with concurrent.futures.ThreadPoolExecutor(min(len(spans), os.cpu_count() or 1)) as pool:
            parts = list(pool.map(lambda span: _host_lanes(flat, *span), spans))
    else:
        parts = [_host_lanes(flat, 0, flat.size)]
    return finite, sum(a for a, _ in parts) % 2**32, sum(b for _, b in parts) % 2**32


def _host_lanes(flat: np.ndarray, begin: int, end: int) -> tuple[int, int]:
    """The two checksum lanes (not yet reduced mod 2**32) of elements [begin, end) of the flat words `flat`."""
    sums = [0, 0]
    for start in range(begin, end, _HOST_CHUNK):
        w = flat[start : min(start + _HOST_CHUNK, end)].astype(np.uint32)
        pos = (np.arange(start, start + w.size, dtype=np.uint64) & 0xFFFFFFFF).astype(np.uint32)
        for lane, (m, o) in enumerate((_LANE_A, _LANE_B)):
            sums[lane] += int(_fmix32(w ^ (pos * np.uint32(m) + np.uint32(o))).sum(dtype=np.uint64))
    return sums[0], sums[1]


def _on_host(x: Any) -> bool:
    """Whether `x` is in this process's host memory whole (numpy, or a JAX array on CPU devices only)."""
    if not isinstance(x, jax.Array):
        return True
    return x.is_fully_addressable and all(d.platform == "cpu" for d in x.devices())


def inspect_arrays(tree) -> dict[str, tuple[bool, str]]:
    """Dotted name → (every element finite, checksum as 16 hex digits) of every array leaf of `tree`: computed with
    numpy for arrays in host memory, on the accelerator for the others (the same numbers for any sharding of the
    same values). A collective in a multi-process job (every process calls it with its part of the arrays)."""
    flat = _flat(tree)
    found = {name: _inspect_host(x) for name, x in flat.items() if _on_host(x)}
    on_device = {name: x for name, x in flat.items() if name not in found}
    if on_device:
        found |= dict(zip(on_device, jax.device_get(_inspect_device(list(on_device.values()))), strict=True))
    return {name: (bool(found[name][0]), f"{int(found[name][1]):08x}{int(found[name][2]):08x}") for name in flat}


def array_checksums(tree) -> dict[str, str]:
    """Dotted name → checksum (`CHECKSUM_ALGORITHM`, 16 hex digits) of every array leaf of `tree`."""
    return {name: checksum for name, (_, checksum) in inspect_arrays(tree).items()}


def nonfinite_arrays(tree) -> list[str]:
    """Dotted names of the leaves of `tree` that hold NaN or inf."""
    return [name for name, (finite, _) in inspect_arrays(tree).items() if not finite]


def json_checksum(value: Any) -> str:
    """SHA-256 (16 hex digits) of a JSON value as JSON writes it with sorted keys (what a JSON item reads back)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: How long after a failed read the reports of the reads it orphaned are dropped. They come within a second or two
#: (TensorStore completing the other reads, the garbage collection of their futures); a report after this is shown.
ORPHAN_GRACE_S = 30.0


class _OrphanedReads:
    """Which directories' orbax reads are in flight or failed less than `ORPHAN_GRACE_S` ago (thread-safe), and the
    filters that drop the reports of their orphaned reads (installed once, at the first read).

    orbax reads every array concurrently on an event loop it closes as soon as one read fails, while TensorStore
    still completes the others. Each completion then reports `RuntimeError('Event loop is closed')` from
    `call_soon_threadsafe` to `sys.unraisablehook`, and each failed read nobody awaited makes asyncio log "... exception
    was never retrieved" when it is collected: a screen of tracebacks after the one clear error (launch/export_hf.py,
    launch/eval.py on a truncated checkpoint). The completions race the error on other threads, so a read is in scope
    from before it starts. The asyncio reports name the files they failed on and are dropped only when they name a
    directory in scope; the unraisable "Event loop is closed" names nothing, so it is dropped while any directory is
    in scope (a read in flight, or one failed within the grace period), and shown otherwise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._failed: dict[str, float] = {}  # directory -> time.monotonic() of its last failed read
        self._installed = False

    def begin(self, directory: str) -> None:
        with self._lock:
            self._in_flight[directory] = self._in_flight.get(directory, 0) + 1
            if not self._installed:
                self._install()
                self._installed = True

    def end(self, directory: str, *, failed: bool) -> None:
        with self._lock:
            left = self._in_flight.get(directory, 1) - 1
            if left > 0:
                self._in_flight[directory] = left
            else:
                self._in_flight.pop(directory, None)
            if failed:
                self._failed[directory] = time.monotonic()

    def scopes(self) -> tuple[str, ...]:
        """The directories in scope now."""
        with self._lock:
            now = time.monotonic()
            for d in [d for d, t in self._failed.items() if now - t > ORPHAN_GRACE_S]:
                del self._failed[d]
            return tuple({*self._in_flight, *self._failed})

    def names_a_scope(self, exc: BaseException | None) -> bool:
        """Whether `exc`, or an exception it was raised from, names a directory in scope (as a whole path
        component: `/a/ckpt` does not name `/a/ckpt_old`)."""
        scopes = self.scopes()
        if not scopes:
            return False
        pattern = re.compile("|".join(re.escape(s.rstrip("/")) + r"(?=/|$|[\s'\"\]),])" for s in scopes))
        for _ in range(8):
            if exc is None:
                break
            if pattern.search(str(exc)):
                return True
            exc = exc.__cause__ or exc.__context__
        return False

    def _install(self) -> None:
        previous = sys.unraisablehook

        def hook(unraisable, previous=previous):
            exc = unraisable.exc_value
            if (
                unraisable.object is None
                and isinstance(exc, RuntimeError)
                and str(exc) == "Event loop is closed"
                and _from_call_soon_threadsafe(unraisable.exc_traceback)
                and self.scopes()
            ):
                return
            previous(unraisable)

        sys.unraisablehook = hook
        logging.getLogger("asyncio").addFilter(_OrphanedReadReports(self))


def _from_call_soon_threadsafe(tb) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
            return True
        tb = tb.tb_next
    return False


class _OrphanedReadReports(logging.Filter):
    """Drops asyncio's "... exception was never retrieved" records (of a Future, a Task, a gather's
    _GatheringFuture) whose exception names a directory in scope."""

    def __init__(self, reads: _OrphanedReads):
        super().__init__()
        self.reads = reads

    def filter(self, record: logging.LogRecord) -> bool:
        first_line = record.getMessage().split("\n", 1)[0]
        if "exception was never retrieved" not in first_line or not record.exc_info:
            return True
        return not self.reads.names_a_scope(record.exc_info[1])


_ORPHANED_READS = _OrphanedReads()


# ----------------------------------------------------------------------------------------------------
# Checkpointer
# ----------------------------------------------------------------------------------------------------


class Checkpointer:
    """Saves and restores training checkpoints under `directory` (local path or gs://), keeping the newest `keep`.

    Args:
      directory: the run's checkpoint directory (e.g. {workdir}/checkpoints); created unless `create=False`.
      keep: most recent checkpoints kept (config `train.keep_checkpoints`); None keeps all.
      async_save: write in a background thread (`check_saved` / `wait_until_finished` / `close` to join it).
      create: create `directory` if missing; with False a missing directory raises FileNotFoundError.

    A relative local `directory` is made absolute (orbax needs absolute paths). Use as a context manager, or call
    `close()`, so a pending save finishes (or reports its failure) before the process exits.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int | None, async_save: bool = True, create: bool = True):
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least one checkpoint (or None for all)")
        path = os.fspath(directory)
        self.directory = epath.Path(path if "://" in path else os.path.abspath(path))
        self._pending: int | None = None  # the step of the last save, until its outcome is checked
        if not create and not self.directory.is_dir():
            raise FileNotFoundError(f"no checkpoint directory {os.fspath(directory)!r}")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=create,
            enable_async_checkpointing=async_save,
            save_interval_steps=1,
        )
        handlers = {
            "params": ocp.StandardCheckpointHandler(),
            "opt_state": ocp.StandardCheckpointHandler(),
            "state": ocp.JsonCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    # -- bookkeeping -------------------------------------------------------------------------------------

    def _step_dir(self, step: int) -> epath.Path:
        return self.directory / str(step)

    def _complete(self, step: int) -> bool:
        d = self._step_dir(step)
        return (d / "_CHECKPOINT_METADATA").exists() and (d / "params").exists() and (d / "state").exists()

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending (partial writes and foreign directories are skipped).

        A save still in flight is not listed yet (restoring waits for it).
        """
        self._manager.reload()  # read the directory (steps other processes or an earlier run wrote)
        return sorted(s for s in self._manager.all_steps() if self._complete(s))

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step; None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _resolve(self, step: int | None) -> int:
        self.wait_until_finished()  # a save of this process still in flight counts
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"no checkpoint in {os.fspath(self.directory)!r}")
            return steps[-1]
        if int(step) not in steps:
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {os.fspath(self.directory)!r}; steps: {steps or 'none'}"
            )
        return int(step)

    def wait_until_finished(self) -> None:
        """Blocks until every pending save is on disk (and old checkpoints beyond `keep` are deleted).

        Raises:
          CheckpointSaveError: the pending save failed.
        """
        self.check_saved(wait=True)

    def saving(self) -> bool:
        """Whether a save is still being written in the background."""
        return self._pending is not None and self._manager.is_saving_in_progress()

    def check_saved(self, *, wait: bool = False) -> None:
        """Raises CheckpointSaveError if the last save failed (its temporary directory removed). A save still being
        written is waited for with `wait=True`; with `wait=False` it is left alone and a later call reports it.

        Multi-process: process 0's view decides whether the save is still running, and a failure on any process
        is raised on all."""
        step = self._pending
        if step is None or (not wait and distributed.broadcast_object(self.saving())):
            return
        self._pending = None
        try:
            self._manager.wait_until_finished()
            reason = None
        except Exception as e:  # orbax re-raises the background thread's error (OSError, TensorStore errors, ...)
            reason = error_reason(e)
        distributed.barrier(f"rltldr_checkpoint_{step}_written")  # process 0 has finalised it too
        if reason is None and not self._complete(step):
            reason = "it is incomplete on disk"
        reason = next((r for r in distributed.gather_objects(reason) if r is not None), None)
        if reason is not None:
            self._remove_partial(step)
            raise CheckpointSaveError(self._save_failed(step, reason))

    def _save_failed(self, step: int, reason: str) -> str:
        steps = self.all_steps()
        return (
            f"saving checkpoint step {step} in {os.fspath(self.directory)!r} failed ({reason}); the newest saved "
            f"checkpoint is {f'step {steps[-1]}' if steps else 'none'}"
        )

    def _remove_partial(self, step: int) -> None:
        """Removes what a failed save of `step` left: orbax's temporary directories `{step}.orbax-checkpoint-tmp*`
        (process 0 does, in a multi-process job)."""
        if not distributed.is_main_process():
            return
        for tmp in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
            for _ in range(50):  # writes of the failed save may still be finishing in orbax's threads
                try:
                    tmp.rmtree()
                    break
                except OSError:
                    time.sleep(0.1)

    def close(self) -> None:
        try:
            self.wait_until_finished()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- save ----------------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        params,
        opt_state,
        rng: jax.Array | None,
        meta: Mapping[str, Any] | None = None,
        model_config: Qwen35Config | Mapping[str, Any] | None = None,
    ) -> None:
        """Saves a checkpoint for `step` (asynchronously unless `async_save=False`).

        Args:
          step: the optimizer step (or phase) it is saved at; must be new.
          params: the model state (`nnx.split(model)[1]`), any pytree of arrays.
          opt_state: the optax state (None to save none).
          rng: a JAX key (typed `jax.random.key` or raw uint32 `PRNGKey` data), or None.
          meta: JSON-serialisable dict (numpy scalars/arrays are converted to numbers/lists).
          model_config: the architecture (Qwen35Config, ModelSpec or HF config dict), so that `export_hf` needs
            nothing but the directory.

        Raises:
          CheckpointSaveError: the previous save failed, there is not enough free space for this one (checked
            before anything is written), or (synchronous saves) the write failed.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        self.wait_until_finished()  # the previous save's failure is reported before another one starts
        if step in self._manager.all_steps():
            raise ValueError(f"a checkpoint for step {step} already exists in {os.fspath(self.directory)!r}")
        need = int(tree_bytes(params, opt_state) * (1 + SPACE_MARGIN)) + SPACE_SLACK_BYTES
        free = distributed.broadcast_object(free_bytes(self.directory))  # process 0's filesystem decides for all
        if free is not None and free < need:
            raise CheckpointSaveError(
                f"not enough free space to save checkpoint step {step} in {os.fspath(self.directory)!r}: "
                "it needs about "
                f"{need / 2**30:.2f} GiB (parameters + optimizer state + {SPACE_MARGIN:.0%}), {free / 2**30:.2f} GiB "
                "are free; free some space or write to a larger disk"
            )
        meta = _jsonable(dict(meta or {}), "meta")
        # Checksums of what is written, verified on restore (`_verify_arrays`, `_verify_json`): computed here, before
        # `save` returns (the caller may donate the arrays then), on the accelerator in one pass per array.
        checksums = {"algorithm": CHECKSUM_ALGORITHM, "params": array_checksums(params), "meta": json_checksum(meta)}
        if opt_state is not None:
            checksums["opt_state"] = array_checksums(opt_state)
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "rng": _rng_to_json(rng),
            "model_config": _config_dict(model_config),
            "checksums": checksums,
        }
        state["state_checksum"] = json_checksum(state)
        args = {
            "params": ocp.args.StandardSave(params),
            "state": ocp.args.JsonSave(state),
            "meta": ocp.args.JsonSave(meta),
        }
        if opt_state is not None:
            args["opt_state"] = ocp.args.StandardSave(opt_state)
        try:
            saved = self._manager.save(step, args=ocp.args.Composite(**args), force=True)
        except Exception as e:  # the write itself (synchronous saves), or starting it
            self._remove_partial(step)
            raise CheckpointSaveError(self._save_failed(step, error_reason(e))) from e
        if not saved:
            raise RuntimeError(f"orbax declined to save step {step} in {os.fspath(self.directory)!r}")
        self._pending = step

    # -- restore ---------------------------------------------------------------------------------------------

    def _read(self, step: int, what: str, read: Any) -> Any:
        """`read()`, with any failure to read the files raised as CorruptCheckpointError naming the step."""
        scope = os.fspath(self.directory)
        scope = scope if "://" in scope else os.path.abspath(scope)
        _ORPHANED_READS.begin(scope)  # (its orphaned reads, should it fail, print nothing: `_OrphanedReads`)
        try:
            value = read()
        except Exception as e:
            _ORPHANED_READS.end(scope, failed=True)
            raise CorruptCheckpointError(
                f"checkpoint step {step} in {os.fspath(self.directory)!r}: "
                f"cannot read its {what} ({error_reason(e)}); its "
                "files are truncated or damaged"
            ) from e
        _ORPHANED_READS.end(scope, failed=False)
        return value

    def _corrupt(self, step: int, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"checkpoint step {step} in {os.fspath(self.directory)!r} is corrupt: {what}; use another step (--resume "
            "falls back to the newest intact one by itself)"
        )

    def _verify_json(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Raises CorruptCheckpointError if the state or meta JSON differs from the checksums recorded at save time
        (checkpoints saved before checksums were recorded have none: nothing to verify)."""
        if "state_checksum" not in state:
            return
        recorded = {k: v for k, v in state.items() if k != "state_checksum"}
        for item, ok in (
            ("state", json_checksum(recorded) == state["state_checksum"]),
            ("meta", json_checksum(meta) == state.get("checksums", {}).get("meta")),
        ):
            if not ok:
                raise self._corrupt(step, f"its {item} ({self._step_dir(step) / item}) differs from its checksum")

    def _verify_arrays(self, step: int, item: str, recorded: Mapping[str, str] | None, found: Mapping[str, str]):
        """Raises CorruptCheckpointError naming the arrays of `item` whose checksums (`found`, of the restored
        arrays) differ from those `recorded` at save time."""
        if recorded is None:
            return
        bad = [name for name, checksum in found.items() if recorded.get(name) != checksum]
        if bad:
            names = ", ".join(bad[:4]) + (", …" if len(bad) > 4 else "")
            raise self._corrupt(
                step,
                f"{len(bad)} of its {len(found)} {item} arrays differ from the checksums recorded when it was saved "
                f"({names}): the files under {self._step_dir(step) / item} are damaged",
            )

    def read_state(self, step: int | None = None) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """(step, internal state JSON, meta) of a checkpoint, without reading any array; both verified against their
        checksums (CorruptCheckpointError)."""
        step = self._resolve(step)
        args = ocp.args.Composite(state=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        r = self._read(step, "state and meta", lambda: self._manager.restore(step, args=args))
        state, meta = dict(r["state"]), dict(r["meta"] or {})
        self._verify_json(step, state, meta)
        return step, state, meta

    def model_config(self, step: int | None = None) -> Qwen35Config | None:
        """The architecture recorded with a checkpoint (None if it was saved without one)."""
        raw = self.read_state(step)[1].get("model_config")
        return None if raw is None else Qwen35Config.from_hf_dict(raw)

    def stored_arrays(self, step: int | None = None, item: str = "params") -> dict[str, Any]:
        """Dotted name → orbax ArrayMetadata (shape, dtype, ...) of a checkpoint's `params` or `opt_state`."""
        step = self._resolve(step)
        if not (self._step_dir(step) / item).exists():
            raise FileNotFoundError(f"checkpoint step {step} in {os.fspath(self.directory)!r} has no {item}")
        return _flat(self._read(step, "metadata", lambda: self._manager.item_metadata(step))[item])

    def restore(
        self, step: int | None = None, *, abstract_params, abstract_opt_state=None, allow_nonfinite: bool = False
    ) -> Restored:
        """Restores a checkpoint (default: the latest) into the given targets.

        Args:
          step: which checkpoint; None for the latest.
          abstract_params: the target of the model state: ShapeDtypeStructs (`nnx.split(spec.abstract())[1]`) or
            arrays, optionally with shardings (`jax.ShapeDtypeStruct(shape, dtype, sharding=...)`); leaves
            without a sharding go to the first local device.
          abstract_opt_state: the optimizer state's target (`jax.eval_shape(tx.init, abstract_params)`, shardings
            from `sharding.optimizer_shardings`); None skips the optimizer state.
          allow_nonfinite: accept restored arrays holding NaN/inf.

        Raises:
          FileNotFoundError: no such checkpoint.
          CheckpointMismatchError: the targets' names/shapes/dtypes differ from the checkpoint's.
          CorruptCheckpointError: its files cannot be read, an array or the JSON differs from the checksums
            recorded at save time, or (unless allowed) an array holds NaN/inf.
        """
        step = self._resolve(step)
        default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        targets = {"params": _abstract(abstract_params, default)}
        if abstract_opt_state is not None:
            targets["opt_state"] = _abstract(abstract_opt_state, default)
        metadata = self._read(step, "metadata", lambda: self._manager.item_metadata(step))
        problems = []
        for item, target in targets.items():
            if not (self._step_dir(step) / item).exists():
                problems.append(f"{item}: the checkpoint has none")
            else:
                problems += _compare(item, target, metadata[item])
        if problems:
            _, state, _ = self.read_state(step)
            saved = state.get("model_config")
            hint = ""
            if saved is not None:
                keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "tie_word_embeddings")
                hint = " (it was saved for " + ", ".join(f"{k}={saved.get(k)}" for k in keys) + ")"
            if all(p.startswith("opt_state") for p in problems):
                hint = (
                    " (only the optimizer state differs: it was saved by another optimizer; resume with the optim.*"
                    " settings the run was saved with, e.g. optim.name, optim.warmup_steps and optim.decay_steps, and"
                    " its model.lora.dropout: adapter dropout adds a step count to the state)"
                )
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {os.fspath(self.directory)!r} does not match the restore target{hint}:\n  "
                + "\n  ".join(problems)
            )
        args = {item: ocp.args.StandardRestore(t) for item, t in targets.items()}
        args |= {"state": ocp.args.JsonRestore(), "meta": ocp.args.JsonRestore()}
        r = self._read(step, "arrays", lambda: self._manager.restore(step, args=ocp.args.Composite(**args)))
        state = dict(r["state"])
        self._verify_json(step, state, dict(r["meta"] or {}))
        checksums = state.get("checksums")
        if checksums is None:
            log.warning(
                "checkpoint step %d in %s records no checksums (saved by an older version): "
                "its arrays are not verified",
                step,
                os.fspath(self.directory),
            )
        found = {item: inspect_arrays(r[item]) for item in targets}  # (finite, checksum) per array
        for item in targets:
            recorded = None if checksums is None else checksums.get(item)
            self._verify_arrays(step, item, recorded, {name: c for name, (_, c) in found[item].items()})
        if not allow_nonfinite:
            bad = [f"{item}.{name}" for item in targets for name, (finite, _) in found[item].items() if not finite]
            if bad:
                raise CorruptCheckpointError(
                    f"checkpoint step {step} in {os.fspath(self.directory)!r} holds NaN/inf in {len(bad)} arrays "
                    f"({', '.join(bad[:4])}{', …' if len(bad) > 4 else ''}): "
                    "its files are damaged or the run diverged; "
                    "use another step, or " + ALLOW_NONFINITE_HINT
                )
        if state.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"checkpoint step {step} has format {state.get('format')}; this code reads {FORMAT_VERSION}"
            )
        raw_config = state.get("model_config")
        return Restored(
            params=r["params"],
            opt_state=r["opt_state"] if abstract_opt_state is not None else None,
            step=step,
            rng=_rng_from_json(state.get("rng")),
            meta=dict(r["meta"] or {}),
            model_config=None if raw_config is None else Qwen35Config.from_hf_dict(raw_config),
        )


# ----------------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------------


def restore_model(
    checkpoint_dir: str | os.PathLike,
    step: int | None = None,
    *,
    config: Qwen35Config | Any | None = None,
    compute_dtype: Any = jnp.float32,
    allow_nonfinite: bool = False,
) -> tuple[int, Any]:
    """The model of a training checkpoint: parameters only, each array in its stored dtype, on the host CPU.

    Args:
      checkpoint_dir: a `Checkpointer` directory.
      step: which checkpoint; None for the latest.
      config: the architecture (Qwen35Config or ModelSpec); None uses the one recorded at save time (a given one
        must agree with a recorded one).
      compute_dtype: activation dtype of the returned model's forward pass.
      allow_nonfinite: accept parameters holding NaN/inf (CorruptCheckpointError otherwise).

    Returns:
      (step, Qwen35 model): with its LoRA adapters when the run trained some (`model.lora.rank` > 0 in the config
      recorded with the checkpoint); `models.lora.merged` gives the plain model.
    """
    from rltldr_jax.models import ModelSpec
    from rltldr_jax.models.lora import attach, lora_spec_of_run

    ckpt = Checkpointer(checkpoint_dir, keep=None, async_save=False, create=False)
    try:
        step, state, meta = ckpt.read_state(step)
        saved = state.get("model_config")
        if config is not None and hasattr(config, "config") and isinstance(config.config, Qwen35Config):
            config = config.config
        if config is None:
            if saved is None:
                raise ValueError(
                    f"checkpoint step {step} in {os.fspath(checkpoint_dir)!r} records no model config; "
                    "give the architecture (a preset or an HF config.json)"
                )
            config = Qwen35Config.from_hf_dict(saved)
        elif saved is not None and Qwen35Config.from_hf_dict(saved) != config:
            ours, theirs = config.to_hf_dict(), Qwen35Config.from_hf_dict(saved).to_hf_dict()
            diff = ", ".join(
                f"{k}: given {ours.get(k)!r}, saved {theirs.get(k)!r}" for k in ours if ours.get(k) != theirs.get(k)
            )
            raise ValueError(f"the given model config differs from the one saved with checkpoint step {step}: {diff}")
        spec = ModelSpec(config, dtype=compute_dtype)
        adapters = lora_spec_of_run(meta.get("config"))
        if adapters is None:
            graphdef, abstract = nnx.split(spec.abstract())
        else:  # (a LoRA run: the adapters are parameters of the checkpoint too)
            graphdef, abstract = nnx.split(nnx.eval_shape(lambda: attach(spec.build(), adapters)))
        stored = ckpt.stored_arrays(step, "params")
        # Restore each array in its stored dtype (exact, no extra memory), on the host.
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])

        def target(path, leaf):
            name = ".".join(_key_name(k) for k in path)
            dt = stored[name].dtype if name in stored else leaf.dtype
            return jax.ShapeDtypeStruct(leaf.shape, dt, sharding=cpu)

        abstract = jax.tree_util.tree_map_with_path(target, abstract)
        restored = ckpt.restore(step, abstract_params=abstract, allow_nonfinite=allow_nonfinite)
        return step, nnx.merge(graphdef, restored.params)
    finally:
        ckpt.close()


def split_step(path: str) -> tuple[str, int | None]:
    """`DIR[:STEP]` → (DIR, STEP or None). A trailing `:N` is a step only when N is an integer."""
    head, sep, tail = os.fspath(path).rpartition(":")
    if sep and head and tail.isdigit():
        return head, int(tail)
    return os.fspath(path), None


def load_model(
    path: str | os.PathLike, *, compute_dtype: Any = jnp.float32, param_dtype: Any = None, allow_nonfinite: bool = False
) -> tuple[Any, str]:
    """A model from either kind of checkpoint: an HF directory (config.json + safetensors) or a training run's
    `Checkpointer` directory (`runs/X/checkpoints`, optionally `:STEP`; default the latest).

    Args:
      path: the directory, `DIR:STEP` for a given training checkpoint.
      compute_dtype: activation dtype of the forward pass.
      param_dtype: cast the parameters to this dtype (None keeps the stored ones).
      allow_nonfinite: accept parameters holding NaN/inf (CorruptCheckpointError otherwise).

    Returns:
      (Qwen35 model, a one-line description of what was loaded).
    """
    from rltldr_jax.models import load_pretrained

    directory, step = split_step(os.fspath(path))
    if os.path.isfile(os.path.join(directory, "config.json")):
        if step is not None:
            raise ValueError(f"{path!r}: an HF directory has no steps; drop the ':{step}'")
        model = load_pretrained(
            directory, dtype=param_dtype, compute_dtype=compute_dtype, allow_nonfinite=allow_nonfinite
        )
        return model, f"HF checkpoint {directory}"
    ckpt = Checkpointer(directory, keep=None, async_save=False, create=False) if os.path.isdir(directory) else None
    if ckpt is None or not ckpt.all_steps():
        raise FileNotFoundError(
            f"{path!r} is neither an HF checkpoint directory (config.json + *.safetensors) nor a training run's "
            "checkpoint directory with saved steps (e.g. runs/sapi-tiny/checkpoints or runs/sapi-tiny/checkpoints:3)"
        )
    ckpt.close()
    step, model = restore_model(directory, step, compute_dtype=compute_dtype, allow_nonfinite=allow_nonfinite)
    if param_dtype is not None:
        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(param_dtype), state))
    return model, f"training checkpoint {directory} step {step}"


def export_hf(
    checkpoint_dir: str | os.PathLike,
    step: int | None,
    out_dir: str | os.PathLike,
    *,
    config: Qwen35Config | Any | None = None,
    dtype: Any = jnp.bfloat16,
    allow_nonfinite: bool = False,
    adapter: str | None = None,
    base_model: str = "",
    tokenizer: str | None = None,
) -> int:
    """Writes a checkpoint's parameters as an HF model directory (`models.save_pretrained`), or a LoRA run's
    adapters as a PEFT adapter directory (`models.hf.save_peft_adapter`), with the tokenizer its run used as HF
    tokenizer files (+ generation_config.json for a model; `models.hf.ServingFiles.of_checkpoint`).

    Args:
      checkpoint_dir: a `Checkpointer` directory.
      step: which checkpoint; None for the latest.
      out_dir: output directory (config.json + model*.safetensors).
      config: the architecture (Qwen35Config or ModelSpec); None uses the one recorded at save time.
      dtype: tensor dtype written (None keeps the stored one).
      allow_nonfinite: export parameters holding NaN/inf (CorruptCheckpointError otherwise).
      adapter: for a LoRA run's checkpoint (required there): "peft" writes its adapters as a PEFT adapter directory
        (`models.lora.save_adapter`; `dtype` does not apply: float32), "merge" the full weights with the adapters
        merged in. None for a full fine-tuning run's checkpoint ("merge" is accepted there too).
      base_model: recorded as the adapter's `base_model_name_or_path` (the base's hub id or directory).
      tokenizer: the tokenizer to ship (a tokenizer.json or a directory holding one) instead of the run's; needed for
        a checkpoint that records no run config, which is otherwise exported without tokenizer files.

    Returns:
      The exported step.
    """
    from rltldr_jax.models import save_pretrained
    from rltldr_jax.models.hf import ServingFiles, save_peft_adapter
    from rltldr_jax.models.lora import has_adapters, merged

    step, model = restore_model(checkpoint_dir, step, config=config, allow_nonfinite=allow_nonfinite)
    serving = ServingFiles.of_checkpoint(checkpoint_dir, step, tokenizer)
    if has_adapters(model) and adapter is None:
        raise ValueError(
            f"checkpoint step {step} holds LoRA adapters: export them as a PEFT adapter (--adapter) or merged into "
            "full weights (--merge)"
        )
    if adapter == "peft":
        if not has_adapters(model):
            raise ValueError(
                f"checkpoint step {step} holds no LoRA adapters (the run trained every weight): drop --adapter"
            )
        save_peft_adapter(model, out_dir, base_model=base_model, serving=serving)
    else:
        save_pretrained(merged(model), out_dir, dtype=dtype, serving=serving)
    return step
