"""Starting and resuming runs in a workdir without mixing or hiding anything.

    lock = claim_workdir(workdir, resume=False, restart=False)  # refuses a workdir in use or holding a run
    undo = start_undo(workdir, restart=False)                  # (before the claim) then, if the claim or start fails:
    undo(lock)                                                 # the workdir as the failed start found it
    check_config_changes(saved_config, as_dict(settings), allow=False)   # on resume: logs and refuses changes
    move_aside(workdir, paths, why)                           # leftovers of a killed phase, newer checkpoints

Nothing written is ever deleted: an old run moves to a sibling `{workdir}.old-YYYYmmdd-HHMMSS`, leftovers to
`{workdir}/discarded-YYYYmmdd-HHMMSS/` (same relative paths). A fresh start that fails before its first phase
removes only what it made that holds no file (its lock, empty directories such as `checkpoints/`, the workdir itself
if it made it), so the next start finds the workdir as the failed one did.

A workdir the run creates is private (mode 0700: agent code in the sandbox runs as another user and cannot read
the run's rollouts or checkpoints); an existing one keeps its mode, with a warning when other users can enter it.
A workdir that cannot be created, locked or written is a `WorkdirError` naming it and the reason.

In a multi-process job (one workdir on a filesystem every process sees) process 0 alone takes the lock, refuses or
moves the old run aside, and moves leftovers; the other processes wait for its outcome and share it: they hold a
`FollowerLock` (nothing to release), and raise the same error when process 0 refuses the workdir.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

from rltldr_jax import distributed

log = logging.getLogger(__name__)

#: Config keys (a trailing "." means every key below) that may change when a run is resumed: where things go,
#: how long it runs, how it is evaluated and served, how it is sharded and compiled (padding, compilation cache),
#: memory and logging. Every other key (seed, tokenizer, model.* but remat/allow_nonfinite, env.*, rollout.* but
#: save_rollouts, insight.*, loss.*, optim.*, batch.* but pad_to_multiple/length_buckets, sft.*, mode, ...) defines
#: what the run trains and may change only with `allow_config_change` (`--allow_config_change`).
RESUME_FREE_KEYS = (
    "name",
    "workdir",
    "train.",
    "eval.",
    "engine.",
    "mesh.",
    "model.remat",
    "model.allow_nonfinite",
    "rollout.save_rollouts",
    "batch.pad_to_multiple",
    "batch.length_buckets",
    "compile.",
    "pretrain.cache_dir",
    "pretrain.shipped",
    "logging.",
)


#: Marks a config key that one side of a comparison does not have.
MISSING = object()


class RunExistsError(ValueError):
    """A fresh run was asked for in a workdir that already holds a run."""


class WorkdirInUseError(ValueError):
    """Another process holds the workdir's lock: it is running (or resuming) a run there."""


class WorkdirError(ValueError):
    """The workdir cannot be created, locked or written (read-only, not a directory, no permission, ...)."""


#: The lock file in a workdir (an advisory `flock`, held while a process runs there).
LOCK = ".lock"

#: The mode of a workdir the run creates: its owner's only.
WORKDIR_MODE = 0o700


def make_workdir(workdir: str) -> None:
    """Creates `workdir` with mode `WORKDIR_MODE` (missing parents with the default mode); an existing directory
    keeps its mode, with a warning when other users may enter or list it (the sandbox's agent code could then read
    the run's rollouts and checkpoints)."""
    try:
        os.makedirs(workdir, mode=WORKDIR_MODE)
        return
    except FileExistsError:
        if not os.path.isdir(workdir):
            raise
    mode = os.stat(workdir).st_mode & 0o777
    if mode & 0o007:
        log.warning(
            "%s can be read by other users (mode %04o): agent code in the sandbox could read the run's rollouts and "
            "checkpoints; chmod 700 it (a workdir the run creates is 0700)",
            workdir,
            mode,
        )


def lock_workdir(workdir: str) -> IO[str]:
    """Creates `workdir` if needed (`make_workdir`: mode 0700) and holds its lock for as long as the returned file is
    open.

    Two processes never run in one workdir: the second is refused, naming the first's pid. The lock is an `flock`,
    so the operating system frees it when its process ends, however it ends (a killed run leaves no stale lock).

    Raises:
      WorkdirInUseError: another process holds the lock.
      OSError: the workdir cannot be created or its lock file opened (`claim_workdir` turns it into WorkdirError).
    """
    make_workdir(workdir)
    f = open(os.path.join(workdir, LOCK), "a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise WorkdirInUseError(
            f"{workdir} is in use by another process{f' (pid {holder})' if holder else ''}: wait for it to end or "
            "stop it, or give another --config.workdir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class ConfigChangeError(ValueError):
    """A resumed run's config changes keys that define what the run trains."""


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def run_contents(workdir: str) -> list[str]:
    """What of a run `workdir` holds: "checkpoints", "rollouts" and/or "event files" (empty when none)."""
    found = []
    checkpoints = os.path.join(workdir, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        found.append("checkpoints")
    rollouts = os.path.join(workdir, "rollouts")
    if os.path.isdir(rollouts) and any(f.endswith(".jsonl") for f in os.listdir(rollouts)):
        found.append("rollouts")
    if any(f.startswith("events.out.tfevents") for _, _, files in os.walk(os.path.join(workdir, "tb")) for f in files):
        found.append("event files")
    return found


def prepare_workdir(workdir: str, *, resume: bool, restart: bool) -> str | None:
    """Makes `workdir` ready for a run; returns where an old run was moved (None if it was not).

    A fresh run (`resume=False`) in a workdir that holds checkpoints, rollouts or event files is refused, so two
    runs never mix; with `restart=True` the old run is moved to `{workdir}.old-YYYYmmdd-HHMMSS` first.

    Raises:
      RunExistsError: the workdir holds a run and neither `resume` nor `restart` was given.
      ValueError: both were given.
    """
    if resume and restart:
        raise ValueError("--resume continues the run in the workdir and --restart moves it aside: give one of them")
    found = [] if resume else run_contents(workdir)
    moved = None
    if found:
        if not restart:
            raise RunExistsError(
                f"{workdir} already holds a run ({', '.join(found)}): continue it with --resume, start over with "
                f"--restart (moves it to {workdir}.old-<time>), or give a new --config.workdir"
            )
        moved = base = f"{workdir.rstrip(os.sep)}.old-{_stamp()}"
        n = 0
        while os.path.exists(moved):
            n += 1
            moved = f"{base}-{n}"
        os.rename(workdir, moved)
        log.warning("moved the previous run in %s to %s", workdir, moved)
    make_workdir(workdir)
    return moved


class FollowerLock:
    """What `claim_workdir` returns on the processes other than 0 of a multi-process job: process 0 holds the
    workdir's lock for the whole job, so there is nothing to release here."""

    closed = False

    def close(self) -> None:
        self.closed = True


def claim_workdir(workdir: str, *, resume: bool, restart: bool) -> IO[str] | FollowerLock:
    """`lock_workdir` then `prepare_workdir` (a restart moves the old run, its lock file with it, and locks the fresh
    workdir); returns the held lock, released on any error.

    In a multi-process job this is a collective: process 0 claims (the lock file names its pid), the others wait
    for it and get a `FollowerLock`, or raise the error process 0 raised (RunExistsError, WorkdirInUseError, ...),
    so no process refuses the run its own job holds.

    Raises:
      WorkdirError: the workdir cannot be created, locked or moved aside (the reason and the path in one line).
    """
    held: list[IO[str]] = []  # process 0's lock (the open file stays here: only the outcome is broadcast)
    distributed.from_main_process(lambda: held.append(_claim(workdir, resume=resume, restart=restart)))
    if held:
        return held[0]
    os.makedirs(workdir, exist_ok=True)  # (a shared filesystem: process 0 made it already)
    return FollowerLock()


def _holds_files(path: str) -> bool:
    """Whether `path` is a file (or link), or a directory with a file somewhere below it."""
    if not os.path.isdir(path) or os.path.islink(path):
        return True
    return any(files for _, _, files in os.walk(path))


def start_undo(workdir: str, *, restart: bool) -> Callable[[IO[str] | FollowerLock | None], None]:
    """Call before `claim_workdir` of a fresh start; returns `undo(lock)` for when the claim (lock None) or the
    start then fails: it releases the lock and removes what the start made that holds no file (its lock file, new
    empty directories, the workdir if it did not exist), on process 0; a new entry that holds files is kept and
    named in a warning. The workdir is then as the failed start found it (a restart's old run stays where it was
    moved)."""
    existed = os.path.isdir(workdir)
    found = set(os.listdir(workdir)) if existed else set()

    def undo(lock: IO[str] | FollowerLock | None) -> None:
        if lock is not None:
            lock.close()
        if not distributed.is_main_process() or not os.path.isdir(workdir):
            return
        # A restart that claimed the workdir moved what it found aside: everything there now is this start's. A
        # refused claim (lock None) made nothing but maybe the lock file, and another process's lock file stays.
        before = set() if restart and lock is not None else found
        kept = []
        for name in sorted(set(os.listdir(workdir)) - before):
            path = os.path.join(workdir, name)
            if name == LOCK:
                os.unlink(path)
            elif _holds_files(path):
                kept.append(name)
            else:
                shutil.rmtree(path, ignore_errors=True)
        if kept:
            log.warning("the failed start left %s in %s (they hold files)", ", ".join(kept), workdir)
        if not existed and not os.listdir(workdir):
            os.rmdir(workdir)

    return undo


def _claim(workdir: str, *, resume: bool, restart: bool) -> IO[str]:
    try:
        lock = lock_workdir(workdir)
        try:
            if prepare_workdir(workdir, resume=resume, restart=restart):
                lock.close()
                lock = lock_workdir(workdir)
        except BaseException:
            lock.close()
            raise
    except OSError as e:
        raise WorkdirError(
            f"cannot use {workdir} as the workdir: {e.strerror or e}"
            + (f": {e.filename!r}" if e.filename else "")
            + "; give a --config.workdir this user can write"
        ) from None
    return lock


def move_aside(workdir: str, paths: Iterable[str], why: str) -> str | None:
    """Moves `paths` (inside `workdir`) to `{workdir}/discarded-YYYYmmdd-HHMMSS/`, same relative paths, and logs
    it; returns that directory (None when there was nothing to move).

    In a multi-process job this is a collective: once every process has arrived (so none still reads what is
    moved), process 0 moves its `paths` and every process returns its result.
    """
    paths = list(paths)
    distributed.barrier("rltldr_move_aside")
    return distributed.from_main_process(lambda: _move_aside(workdir, paths, why))


def _move_aside(workdir: str, paths: list[str], why: str) -> str | None:
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        return None
    target = os.path.join(workdir, f"discarded-{_stamp()}")
    for p in paths:
        dest = os.path.join(target, os.path.relpath(p, workdir))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.rename(p, dest)
    log.warning("%s: moved %s to %s", why, ", ".join(os.path.relpath(p, workdir) for p in paths), target)
    return target


def rollouts_from(workdir: str, phase: int) -> list[str]:
    """The saved rollout files `rollouts/phase_NNNNN.jsonl` of phases >= `phase`."""
    directory = os.path.join(workdir, "rollouts")
    if not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        index = name.removeprefix("phase_").removesuffix(".jsonl")
        if name == f"phase_{index}.jsonl" and index.isdigit() and int(index) >= phase:
            found.append(os.path.join(directory, name))
    return found


def recorded_evaluations(path: str) -> set[int]:
    """The phases after which the run's `metrics.jsonl` at `path` records an evaluation (empty when it does not
    exist; lines cut short by a kill are skipped)."""
    found: set[int] = set()
    if not os.path.exists(path):
        return found
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
                if record["kind"] == "eval":
                    found.add(int(record["phase"]))
            except (ValueError, KeyError, TypeError):
                continue
    return found


def _flat(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, Mapping):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, current value) of every key that differs, sorted; `MISSING` marks a key one side
    lacks. Values are compared as JSON gives them back (the saved config went through JSON: tuples are lists)."""
    old = dict(_flat(saved))
    new = dict(_flat(json.loads(json.dumps(dict(current), default=str))))
    keys = sorted(old.keys() | new.keys())
    return [(k, old.get(k, MISSING), new.get(k, MISSING)) for k in keys if old.get(k, MISSING) != new.get(k, MISSING)]


def is_free(key: str) -> bool:
    """Whether `key` may change on resume (`RESUME_FREE_KEYS`)."""
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in RESUME_FREE_KEYS)


def check_config_changes(saved: Mapping[str, Any], current: Mapping[str, Any], *, allow: bool, step: int) -> None:
    """Logs every key that differs between checkpoint step `step`'s saved config and the current one (old → new);
    raises ConfigChangeError for changed values outside `RESUME_FREE_KEYS` unless `allow`. Keys only one side has
    (added to or removed from the code since) are logged, never refused."""
    changes = config_changes(saved, current)
    for key, old, new in changes:
        log.warning("resume: config %s changed: %s -> %s", key, _show(old), _show(new))
    refused = [f"{k}: {o!r} -> {n!r}" for k, o, n in changes if MISSING not in (o, n) and not is_free(k)]
    if refused and not allow:
        raise ConfigChangeError(
            f"resuming checkpoint step {step} with a changed config would change what the run trains ("
            + "; ".join(refused)
            + "): resume with the checkpoint's values, pass --allow_config_change to continue with the new ones, or "
            "start a new run in another workdir"
        )


def _show(value: Any) -> str:
    return "(no such key)" if value is MISSING else repr(value)
