"""JAX's persistent compilation cache, set up the same way by every entry point (`enable_compile_cache`).

Every launcher that builds a model (launch/train.py, replicate.py, eval.py, pretrain.py, sft.py, insight_curves.py,
serve.py: through rltldr_jax.cli.common.use_compile_cache), every run process of a replication grid
(replication/driver.py) and the test suite (tests/conftest.py, also for the processes it starts) call
`enable_compile_cache` before compiling anything, so a program compiled once on this machine (a train step of one shape,
an engine's prefill chunk, a grid arm with another λ: the loss coefficients are traced arguments, train/step.py) is read
from disk by every later process instead of being compiled again. Every program is written, however small or fast to
compile (minimum compile time and entry size 0): a second run of the same command compiles nothing it compiled before.

Where (`compile.cache_dir`; `--compile_cache_dir` in serve.py):
- default (`default_cache_dir`): `$JAX_COMPILATION_CACHE_DIR` when set (JAX's own variable: the tests point the
  processes they start at their cache this way), else `$XDG_CACHE_HOME/rltldr_jax/xla`, i.e.
  `~/.cache/rltldr_jax/xla`: one cache per user, shared by every run, grid and launcher of the user;
- "" disables the cache (nothing read or written).
The directory holds compiled executables that this process loads and runs, so it must be private: it is created
0700; one owned by another user, or one others can write to (a shared path such as /tmp/xla that another user
could create first and fill), is refused with a one-line error; one of ours that others can only read is made 0700.

The cache is JAX's own (keyed by the program, the compile options, the JAX/XLA version and the devices). It is not
bounded (JAX evicts only with the `filelock` package and `jax_compilation_cache_max_size`); delete it at any time.
A later call with another directory switches this process's cache (JAX's `reset_cache`); with the same one it
only re-applies the settings.
"""

from __future__ import annotations

import logging
import os
import stat

import jax
from jax.experimental.compilation_cache import compilation_cache

log = logging.getLogger(__name__)

#: Environment variable (JAX's own) that replaces the default cache directory (`default_cache_dir`).
CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"

#: The mode of the cache directory: its owner's only.
CACHE_DIR_MODE = 0o700


class CompileCacheError(ValueError):
    """The compilation-cache directory cannot be used (another user's, not a directory, not writable)."""


def default_cache_dir() -> str:
    """`$JAX_COMPILATION_CACHE_DIR` if set, else `$XDG_CACHE_HOME/rltldr_jax/xla` (XDG_CACHE_HOME defaulting to
    `~/.cache`); absolute."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[CACHE_DIR_ENV]))
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(root, "rltldr_jax", "xla"))


def private_directory(path: str, *, key: str = "compile.cache_dir") -> str:
    """Creates `path` (and missing parents) with mode 0700 and checks it is ours; returns it absolute.

    A directory of ours that others can read (not write) is made 0700, with a warning. Raises CompileCacheError
    (naming `key` and the fix) for a path that is not a directory, belongs to another user, others can write to (they
    may have put programs in it already), or cannot be created or written.
    """
    path = os.path.abspath(os.path.expanduser(path))
    fix = f'set {key} to a directory of your own (or "" to disable the cache)'
    if os.path.exists(path) and not os.path.isdir(path):
        raise CompileCacheError(f"{key}={path!r} is not a directory: {fix}")
    try:
        os.makedirs(path, mode=CACHE_DIR_MODE, exist_ok=True)
        info = os.stat(path)
    except OSError as e:
        raise CompileCacheError(f"{key}={path!r} cannot be created ({e.strerror or e}): {fix}") from e
    if info.st_uid != os.getuid():
        raise CompileCacheError(
            f"{key}={path!r} belongs to another user (uid {info.st_uid}), who could plant compiled programs in it: "
            f"{fix}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise CompileCacheError(
            f"{key}={path!r} can be written by other users (mode {mode:o}), who could plant compiled programs in it: "
            f"remove it to have it recreated private, or {fix[0].lower() + fix[1:]}"
        )
    if mode != CACHE_DIR_MODE:
        log.warning(
            "%s=%s had mode %o; made it %o (compiled programs are read from it)",
            key,
            path,
            mode,
            CACHE_DIR_MODE,
        )
        try:
            os.chmod(path, CACHE_DIR_MODE)
        except OSError as e:
            raise CompileCacheError(f"{key}={path!r}: cannot make it private ({e.strerror or e}): {fix}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise CompileCacheError(f"{key}={path!r} is not writable: {fix}")
    return path


def enable_compile_cache(cache_dir: str | None = None, *, key: str = "compile.cache_dir") -> str | None:
    """Makes this process read and write compiled XLA programs in `cache_dir` (None: `default_cache_dir()`; "":
    no persistent cache). Call before the first compilation; returns the directory used (None when disabled).

    Every program is cached (`jax_persistent_cache_min_compile_time_secs` = 0, minimum entry size 0), and the
    directory is private (`private_directory`). `key` names the setting in error messages.

    Raises:
      CompileCacheError: the directory cannot be used; the message says how to fix it.
    """
    if cache_dir is None:
        cache_dir = default_cache_dir()
    current = jax.config.jax_compilation_cache_dir
    if not cache_dir:
        jax.config.update("jax_enable_compilation_cache", False)
        _reset(current)
        return None
    path = private_directory(cache_dir, key=key)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no minimum size, and no override
    if current != path:
        jax.config.update("jax_compilation_cache_dir", path)
        _reset(current)
    return path


def _reset(previous: str | None) -> None:
    """Drops the cache JAX may have opened at `previous` (none opens without a directory), without its INFO line."""
    if not previous:
        return
    jax_log = logging.getLogger("jax._src.compilation_cache")
    level = jax_log.level
    jax_log.setLevel(logging.WARNING)
    try:
        compilation_cache.reset_cache()
    finally:
        jax_log.setLevel(level)
