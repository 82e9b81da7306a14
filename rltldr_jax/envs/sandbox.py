"""A persistent, isolated Python session for agent-written code (one per episode).

`Sandbox.run(code)` executes a code block in a separate process that keeps its globals across runs (like
a notebook) and returns an AppWorld-style observation: the captured stdout+stderr, "Execution successful."
when there is none, or the output followed by a traceback that shows only the agent's frames. Agent code
is hostile by default; nothing it does may crash, stall or kill the trainer, so `run()` never raises for
anything the agent code does: timeouts, crashes and limit violations restart the child and say so.

The child is `python -I -S -c <_sandbox_child.py> <config>`: isolated mode, no site-packages (the
standard library only), an empty environment (PATH, LANG, HOME and TMPDIR only), a private working
directory (deleted on close), its own session and process group (a kill reaches all it runs), and
stdin/stdout/stderr on /dev/null; it talks to the parent over two pipes (`pass_fds`). The parent reads
with `poll` and deadlines, and bounds every frame and the output it keeps.

Isolation layers. Layers 1-4 are enforced by the kernel and hold for native code and subinterpreters too; the
audit hook (5) only turns common attempts into clear messages. `Sandbox.isolation` names the layers active in
the current child; a warning is issued once per process when file access or process creation would rest on the
audit hook alone.

1. Its own identity (only when the trainer runs as root). The child starts as root, sets its limits and
   namespace, then setgroups([])/setgid/setuid to a uid of its own (`_UID_BASE + 64 * trainer pid + slot`), its
   working directory (mode 0700) chowned to it first. Sandboxes then cannot read, write or signal the trainer's
   or each other's files and processes, RLIMIT_NPROC counts each sandbox alone, and close() kills every process
   of that uid when seccomp is missing (a process that left the group with setsid included). The standard library
   must be readable by other users, so when `sys.executable` lives under an unreadable prefix (e.g. /root/.pyenv)
   a readable system interpreter of a supported version is used; without one this layer is skipped with a warning.
2. seccomp-bpf (x86-64 and AArch64; `_sandbox_confine.seccomp_program`): no new processes (threads only), signals
   only to itself, no ptrace/pidfds/process_vm_*, no sockets but socketpair, no namespaces, mounts, io_uring, bpf,
   keyrings or modules.
3. Landlock (Linux >= 5.13 with Landlock enabled; `_sandbox_confine.apply_landlock`): writes only under the working
   directory; reads only the standard library and system libraries (site-packages left out), /etc, its own /proc
   entry and a few devices, so the trainer's checkpoints, rollouts and packages stay unreadable; no execution; no
   TCP (ABI >= 4); no signals or abstract sockets across Landlock domains (ABI >= 6).
4. Network namespace and resource limits. `unshare(CLONE_NEWNET)` (with CLONE_NEWUSER when not root): no network
   at all, not even loopback (skipped where not permitted). RLIMIT_AS (memory_mb; Python usually raises
   MemoryError), RLIMIT_FSIZE (file_mb per file), RLIMIT_CORE 0, non-dumpable, PR_SET_PDEATHSIG (the child dies
   with the trainer, even one killed with SIGKILL; the working directories such a trainer leaves are deleted by the
   next Sandbox on the host). CPU: the parent reads the child's CPU time from /proc every 0.2 s during a run and
   restarts it past cpu_s; the child also sets RLIMIT_CPU to (CPU used + cpu_s) before each run, so SIGXCPU ends a
   background thread that keeps spinning between runs. The parent enforces wall_s by killing the process group.
   The trainer needs no privilege for any of this. Gap: the number of files and the total disk use in the working
   directory are not bounded (only each file's size and the run time).
5. An audit hook (`sys.addaudithook`, which cannot be removed) installed before any agent code. It raises
   PermissionError with a clear message for: socket creation (except AF_UNIX socketpairs), connect, bind,
   sendto and DNS lookups; fork/forkpty/exec/spawn/posix_spawn/system/subprocess (importing
   `_posixsubprocess`, hence `subprocess`, is refused too); kill/killpg of any other process; ctypes and
   extension modules outside the standard library; opening files for writing, and
   creating/removing/renaming/linking/chmod/chown/utime, outside the working directory (writing /proc
   included); reading /proc/<pid> of other processes; setrlimit/prlimit; sys.settrace/setprofile; replacing a
   function's __code__/__defaults__ (to protect the hook); and the known ways around an audit hook:
   subinterpreters (`_interpreters`, `_xxsubinterpreters`: hooks are per interpreter), gc.get_objects/
   get_referrers/get_referents and sys._current_frames (reaching the hook's state), CPython's `_test*` modules.
   Audit hooks are not a security boundary (PEP 578): Python-level tricks may find ways around it, which is why
   layers 1-4 do not depend on it.

Trusted calls: `Sandbox.call(name, argument, timeout_s)` calls a function that the preamble defined in the session
with one string and returns its string result (a verifier's solution side answers its judge this way; see
`envs/leetcode.py`). The result is the agent's answer, never a verdict: the function runs beside agent code.

API calls: with `api_handler`, the child's globals hold `apis` (and `ApiError`); `apis.<app>.<fn>(*args,
**kwargs)` sends JSON `(app, fn, args, kwargs)` to the parent, where `api_handler(app, fn, args, kwargs)`
runs (the world state stays out of the agent's reach) and its JSON-serialisable result is returned. A
handler exception surfaces in the agent's code as `ApiError(<message>)`. JSON turns tuples into lists and
dict keys into strings. Wall time includes the time spent in the handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_CHILD_SOURCE = (Path(__file__).parent / "_sandbox_child.py").read_text()
_CONFINE_SOURCE = (Path(__file__).parent / "_sandbox_confine.py").read_text()
#: Sandboxes of a root trainer run as uid (and gid) `_UID_BASE + 64 * trainer_pid + slot`: one identity per live
#: sandbox, above the ids that accounts and container id maps use, below 2**31 for any pid up to 2**22.
_UID_BASE = 1_800_000_000
_UID_SLOTS = 64
_WORKDIR_PREFIX = "rltldr_sandbox_"
_MAX_FRAME = 16 << 20  # bytes per message either way (API arguments/results)
_NPROC = 1024  # RLIMIT_NPROC of a sandbox's own uid (threads count; new processes are refused by seccomp)
_START_TIMEOUT_S = 20.0
_WATCHDOG_S = 0.2  # how often the parent checks the child's CPU time during a run


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandbox.

    Attributes:
      wall_s: wall time per run() (the parent kills and restarts the child after it).
      cpu_s: CPU seconds per run() (RLIMIT_CPU raised to used + cpu_s before each run).
      memory_mb: address-space limit of the child (RLIMIT_AS).
      output_chars: captured stdout+stderr kept per run; the rest is dropped and counted.
      file_mb: largest file the child may write (RLIMIT_FSIZE).
    """

    wall_s: float = 30.0
    cpu_s: float = 30.0
    memory_mb: int = 1024
    output_chars: int = 20_000
    file_mb: int = 256


class SandboxError(RuntimeError):
    """A failure on the trusted side: the child cannot start, or the preamble failed."""


class _ChildGone(Exception):
    """The child closed its pipe (it exited or was killed)."""


class _Timeout(Exception):
    """The deadline passed while waiting for the child."""


class _CpuExceeded(Exception):
    """The child used more than cpu_s CPU seconds in this run."""


class _ProtocolError(Exception):
    """The child sent something that is not a valid frame (agent code wrote to the control pipe)."""


# ------------------------------------------------------------------------------- choosing the interpreter


def _others_can(path: str, final_bit: int) -> bool:
    """Whether a user with no special rights can traverse to `path` and has `final_bit` on it."""
    try:
        parts = Path(path).parts
        for i in range(1, len(parts)):
            if not os.stat(Path(*parts[:i])).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(path).st_mode & final_bit)
    except OSError:
        return False


def _stdlib_readable_by_others(executable: str) -> bool:
    """Whether `<prefix>/lib/pythonX.Y` of an interpreter (X.Y >= 3.8) is readable after dropping privileges."""
    real = os.path.realpath(executable)
    match = re.fullmatch(r"python(3)\.(\d+)", os.path.basename(real))
    if match is None or int(match.group(2)) < 8 or not os.access(real, os.X_OK):
        return False
    stdlib = Path(real).parent.parent / "lib" / f"python3.{match.group(2)}"
    return _others_can(str(stdlib / "os.py"), stat.S_IROTH) and _others_can(str(stdlib / "json"), stat.S_IXOTH)


@functools.cache
def _child_interpreter(want_drop: bool) -> tuple[str, bool]:
    """(interpreter path, whether the child drops privileges)."""
    own = os.path.realpath(sys.executable)
    if not want_drop:
        return own, False
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [own] + [f"{d}/python{v}" for v in (version, "3") for d in ("/usr/bin", "/usr/local/bin")]
    for candidate in candidates:
        if _stdlib_readable_by_others(candidate):
            return os.path.realpath(candidate), True
    warnings.warn(
        "sandbox: running as root, but no Python interpreter with a standard library readable by other users "
        f"was found ({own} is under an unreadable directory); sandboxes will NOT drop privileges. Install a "
        "system python3 (e.g. apt-get install python3) or make the interpreter's prefix world-readable.",
        stacklevel=3,
    )
    return own, False


_WEAK_WARNED = False


def _warn_if_weak(isolation: tuple[str, ...]) -> None:
    """Warns once per process when agent code's file access rests on the audit hook alone (no Landlock, no uid of
    its own) or when it may start processes (no seccomp): the hook is not a security boundary."""
    global _WEAK_WARNED
    has = set(isolation)
    missing = []
    if not any(x.startswith(("landlock:", "uid:")) for x in has):
        missing.append("file access is limited only by the Python audit hook (no Landlock; no uid of its own)")
    if "seccomp" not in has:
        missing.append("process creation and signals are limited only by the audit hook (no seccomp filter)")
    if not missing or _WEAK_WARNED:
        return
    _WEAK_WARNED = True
    warnings.warn(
        "sandbox: agent code is weakly contained here: " + "; ".join(missing) + ". Run on Linux >= 5.13 with "
        "Landlock enabled (x86-64 or AArch64 for seccomp), or run the trainer as root so that each sandbox gets its "
        "own uid.",
        stacklevel=4,
    )


def _workdir_base(drop: bool) -> str | None:
    base = tempfile.gettempdir()
    if not drop or _others_can(base, stat.S_IXOTH):
        return base
    return "/tmp" if _others_can("/tmp", stat.S_IXOTH) else base


class _UidPool:
    """The sandbox uids of this process: a free slot per live sandbox (shared only past `_UID_SLOTS` at once)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._used: dict[int, int] = {}
        self._warned = False

    def take(self) -> int:
        with self._lock:
            free = [slot for slot in range(_UID_SLOTS) if slot not in self._used]
            if not free and not self._warned:
                self._warned = True
                warnings.warn(
                    f"sandbox: more than {_UID_SLOTS} sandboxes at once; some now share a uid (Landlock and seccomp "
                    "still separate them where the kernel has them)",
                    stacklevel=3,
                )
            slot = free[0] if free else min(self._used, key=self._used.__getitem__)
            self._used[slot] = self._used.get(slot, 0) + 1
            return _UID_BASE + _UID_SLOTS * os.getpid() + slot

    def give_back(self, uid: int) -> None:
        slot = uid - _UID_BASE - _UID_SLOTS * os.getpid()
        with self._lock:
            if self._used.get(slot, 0) > 1:
                self._used[slot] -= 1
            else:
                self._used.pop(slot, None)


_UIDS = _UidPool()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def _remove_stale_workdirs(base: str) -> int:
    """Deletes the working directories that sandboxes of dead trainers left in `base` (a trainer killed with
    SIGKILL cannot clean up; its sandboxes die with it). Once per process and base; returns how many."""
    removed = 0
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for name in entries:
        match = re.fullmatch(_WORKDIR_PREFIX + r"(\d+)_[A-Za-z0-9_]+", name)
        if match is None or int(match.group(1)) == os.getpid() or _pid_alive(int(match.group(1))):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (os.geteuid() != 0 and st.st_uid != os.geteuid()):
            continue
        _remove_tree(path)
        removed += not os.path.lexists(path)
    return removed


# ----------------------------------------------------------------------------------------------- the child


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, from /proc; None when unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _Child:
    """One child process and the parent's ends of its pipes (framed messages, read with deadlines)."""

    def __init__(self, proc: subprocess.Popen, cmd_w: int, msg_r: int):
        self.proc, self.cmd_w, self.msg_r = proc, cmd_w, msg_r
        self.buf = bytearray()
        self.next_watch = 0.0
        self.poller = select.poll()
        self.poller.register(msg_r, select.POLLIN)

    def send(self, obj: dict, deadline: float) -> None:
        payload = b"J" + json.dumps(obj).encode()
        data = memoryview(len(payload).to_bytes(4, "big") + payload)
        out = select.poll()
        out.register(self.cmd_w, select.POLLOUT)
        while data:
            try:
                data = data[os.write(self.cmd_w, data) :]
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Timeout from None
                out.poll(max(1, int(left * 1000)))
            except (BrokenPipeError, OSError):
                raise _ChildGone from None

    def recv(self, deadline: float, watchdog: Callable[[], None] | None = None) -> tuple[bytes, bytes]:
        """The next frame as (kind, payload); calls `watchdog` about every _WATCHDOG_S while waiting."""
        while True:
            if len(self.buf) >= 4:
                n = int.from_bytes(self.buf[:4], "big")
                if not 1 <= n <= _MAX_FRAME:
                    raise _ProtocolError(f"frame length {n}")
                if len(self.buf) >= 4 + n:
                    frame = bytes(self.buf[4 : 4 + n])
                    del self.buf[: 4 + n]
                    if frame[:1] not in (b"J", b"O"):
                        raise _ProtocolError(f"frame kind {frame[:1]!r}")
                    return frame[:1], frame[1:]
            now = time.monotonic()
            if watchdog is not None and now >= self.next_watch:
                watchdog()
                self.next_watch = now + _WATCHDOG_S
            left = deadline - now
            if left <= 0:
                raise _Timeout
            wait = min(left, max(0.001, self.next_watch - now)) if watchdog is not None else left
            if not self.poller.poll(max(1, math.ceil(wait * 1000))):
                continue
            try:
                chunk = os.read(self.msg_r, 1 << 16)
            except OSError:
                raise _ChildGone from None
            if not chunk:
                raise _ChildGone
            self.buf += chunk

    def recv_json(self, deadline: float) -> dict:
        kind, payload = self.recv(deadline)
        if kind != b"J":
            raise _ProtocolError("expected a JSON frame")
        return _parse_json(payload)

    def kill(self) -> int | None:
        """Kills the whole process group, reaps the child, closes the pipes; returns the exit status."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # before reaping: the zombie keeps the group id reserved
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        for fd in (self.cmd_w, self.msg_r):
            try:
                os.close(fd)
            except OSError:
                pass
        return code


class _Resources:
    """What a Sandbox owns; `cleanup` also runs from a weakref finalizer if close() was never called.

    `uid`: the sandbox's own uid (root trainers), or None. `contained`: whether the current child runs under the
    seccomp filter (it then cannot have started processes, so killing its process group ends everything it ran)."""

    def __init__(self, workdir: str, uid: int | None, python: str):
        self.workdir, self.uid, self.python = workdir, uid, python
        self.child: _Child | None = None
        self.contained = False
        self.lock = threading.Lock()  # close() may kill the child while another thread is in run()

    def kill_child(self) -> int | None:
        with self.lock:
            child, self.child = self.child, None
            if child is None:
                return None
            code = child.kill()
            if not self.contained:
                self.kill_uid()
            return code

    def kill_uid(self) -> None:
        """Kills every process of the sandbox's uid (a process that left the group, e.g. with setsid, included)."""
        if self.uid is None:
            return
        try:
            subprocess.run(
                [self.python, "-I", "-S", "-c", "import os, signal\nos.kill(-1, signal.SIGKILL)"],
                user=self.uid,
                group=self.uid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass

    def cleanup(self) -> None:
        self.kill_child()
        _remove_tree(self.workdir)
        if self.uid is not None:
            _UIDS.give_back(self.uid)
            self.uid = None


def _remove_tree(path: str) -> None:
    """Deletes a working directory even where agent code removed permissions inside it."""

    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable_and_retry)
    else:
        shutil.rmtree(path, onerror=make_writable_and_retry)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# ---------------------------------------------------------------------------------------------- Sandbox


class Sandbox:
    """A persistent Python session in an isolated child process (see the module docstring).

    Args:
      limits: wall/CPU time per run, memory, kept output, file size.
      api_handler: `(app, fn, args, kwargs) -> JSON-serialisable result`, run in the parent for each
        `apis.<app>.<fn>(*args, **kwargs)` call of the agent code; its exceptions become `ApiError` there.
      preamble: trusted code run after each (re)start before any agent code (e.g. helper definitions);
        its errors raise SandboxError here.
      audit_hook: install the audit hook (default). False only to test that the OS layers hold on their own.
      confine: apply Landlock and seccomp where the kernel has them (default). False only to test the layers
        left (own uid, process group and uid-wide kill on close).

    Attributes:
      restarts: how many times the child was restarted (timeouts, crashes, limits).
      workdir: the child's private working directory.
      uid: the child's own uid (root trainers), else None.
      isolation: the isolation layers active in the current child, e.g. ("rlimits", "netns", "uid:1800012345",
        "landlock:7", "seccomp", "audit-hook").
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        *,
        api_handler: Callable[[str, str, list, dict], Any] | None = None,
        preamble: str = "",
        audit_hook: bool = True,
        confine: bool = True,
    ):
        self.limits = limits
        self.restarts = 0
        self.isolation: tuple[str, ...] = ()
        self._api_handler = api_handler
        self._preamble = preamble
        self._audit_hook, self._confine = audit_hook, confine
        self._lock = threading.Lock()
        self._closed = False
        self._python, self._drop = _child_interpreter(os.geteuid() == 0)
        base = _workdir_base(self._drop)
        _remove_stale_workdirs(base)
        self.uid = _UIDS.take() if self._drop else None
        self.workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}_", dir=base)
        self._res = _Resources(self.workdir, self.uid, self._python)
        self._finalizer = weakref.finalize(self, self._res.cleanup)
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------- public API

    def run(self, code: str, *, timeout_s: float | None = None) -> str:
        """Runs `code` in the session; returns the observation (never raises for what the code does).

        `timeout_s`: wall and CPU limit of this run (default: the limits' wall_s and cpu_s)."""
        with self._session():
            return self._observe(code, timeout_s)

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """Holds the sandbox for one request: refuses a closed one, starts the child if needed, and kills it on an
        exception of the trusted side (e.g. KeyboardInterrupt, an api_handler BaseException): no child mid-run."""
        with self._lock:
            if self._closed:
                raise SandboxError("this sandbox is closed; create a new Sandbox")
            if self._res.child is None:
                self._start()
            try:
                yield
            except BaseException:
                self._res.kill_child()
                raise

    def call(self, name: str, argument: str, timeout_s: float) -> CallResult:
        """Calls `name(argument)` in the session, a function that trusted code (the preamble) defined there, and
        returns its string result; the trusted side of a verifier talks to the agent's session this way.

        The function runs with the agent's code, so its result is only as trustworthy as that code: treat it as the
        agent's answer, never as a verdict. Output it prints is dropped. Past `timeout_s` seconds (wall or CPU) or
        when the process dies, the session is restarted (preamble re-run, the agent's variables gone) and the
        result says so; never raises for what the code does.
        """
        with self._session():
            status, text = self._execute({"op": "call", "name": name, "argument": argument}, timeout_s)
            if status == "ok":
                if text.error:
                    return CallResult("error", None, text.error)
                return CallResult("ok", text.value, "")
            exit_status = self._res.kill_child()
            if self._closed:
                raise SandboxError("the sandbox was closed during call()")
            message = _restart_message(
                status, exit_status, dataclasses.replace(self.limits, wall_s=timeout_s, cpu_s=timeout_s)
            )
            self.restarts += 1
            self._start()
            return CallResult("timeout" if status in ("timeout", "cpu") else "gone", None, message)

    def close(self) -> None:
        """Kills the child (and its process group) and deletes the working directory; idempotent.

        Safe to call from another thread during run(): that run returns or raises SandboxError at once."""
        self._closed = True
        self._res.kill_child()  # unblocks a run() in progress
        with self._lock:
            self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -------------------------------------------------------------------------------------- the child

    def _environment(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir, "TMPDIR": self.workdir}

    def _start(self) -> None:
        """Starts a fresh child, waits for it to be ready, and runs the preamble."""
        cmd_r, cmd_w = os.pipe()
        msg_r, msg_w = os.pipe()
        config = {
            "cmd_fd": cmd_r,
            "msg_fd": msg_w,
            "workdir": self.workdir,
            "max_frame": _MAX_FRAME,
            "memory_mb": self.limits.memory_mb,
            "file_mb": self.limits.file_mb,
            "output_chars": self.limits.output_chars,
            "drop_uid": self.uid,
            "cpu_s": self.limits.cpu_s,
            "nproc": _NPROC,
            "api": self._api_handler is not None,
            "netns": True,
            "landlock": self._confine,
            "seccomp": self._confine,
            "audit_hook": self._audit_hook,
            "parent_pid": os.getpid(),
            "confine_source": _CONFINE_SOURCE,
        }
        try:
            proc = subprocess.Popen(
                [self._python, "-I", "-S", "-c", _CHILD_SOURCE, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(cmd_r, msg_w),
                cwd=self.workdir,
                env=self._environment(),
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in (cmd_r, cmd_w, msg_r, msg_w):
                os.close(fd)
            raise
        os.close(cmd_r)
        os.close(msg_w)
        os.set_blocking(cmd_w, False)
        child = _Child(proc, cmd_w, msg_r)
        self._res.child = child
        try:
            msg = child.recv_json(time.monotonic() + max(_START_TIMEOUT_S, self.limits.wall_s))
        except (_Timeout, _ChildGone, _ProtocolError) as e:
            code = self._res.kill_child()
            raise SandboxError(
                f"the sandbox child ({self._python}) did not start ({type(e).__name__.strip('_')}, exit status "
                f"{code}); check that the interpreter runs with `-I -S`"
            ) from None
        if msg.get("op") != "ready":
            self._res.kill_child()
            raise SandboxError(f"the sandbox child failed to set up its isolation: {msg.get('error', msg)}")
        self.isolation = tuple(str(x) for x in msg.get("isolation", ()))
        self._res.contained = "seccomp" in self.isolation
        _warn_if_weak(self.isolation)
        if self._preamble:
            status, text = self._execute({"op": "run", "code": self._preamble, "trusted": True})
            if status != "ok" or text.error:
                self._res.kill_child()
                raise SandboxError(f"the sandbox preamble failed ({status}):\n{text.render(self.limits)}")

    def _execute(self, request: dict, timeout_s: float | None = None) -> tuple[str, _RunText]:
        """Sends one request (run or call); returns (status, text), status "ok", "timeout", "cpu", "gone" or
        "protocol". `timeout_s` (wall and CPU) defaults to the limits'."""
        child = self._res.child
        assert child is not None
        text = _RunText()
        deadline = time.monotonic() + (self.limits.wall_s if timeout_s is None else timeout_s)
        watchdog = self._cpu_watchdog(child.proc.pid, self.limits.cpu_s if timeout_s is None else timeout_s)
        child.next_watch = time.monotonic() + _WATCHDOG_S
        try:
            child.send(request, deadline)
            while True:
                kind, payload = child.recv(deadline, watchdog)
                if kind == b"O":
                    text.add_output(payload.decode("utf-8", "replace"), self.limits.output_chars)
                    continue
                msg = _parse_json(payload)
                op = msg.get("op")
                if op == "api":
                    child.send(self._call_api(msg), deadline)
                elif op == "done":
                    text.error = _bounded(msg.get("error"), self.limits.output_chars)
                    value = msg.get("value")
                    text.value = value if isinstance(value, str) else None
                    text.dropped += msg.get("dropped", 0) if isinstance(msg.get("dropped"), int) else 0
                    return "ok", text
                else:
                    raise _ProtocolError(f"unexpected message {op!r}")
        except _Timeout:
            return "timeout", text
        except _CpuExceeded:
            return "cpu", text
        except _ChildGone:
            return "gone", text
        except _ProtocolError:
            return "protocol", text

    def _cpu_watchdog(self, pid: int, cpu_s: float) -> Callable[[], None] | None:
        """A check that raises _CpuExceeded once the child used more than `cpu_s` CPU seconds since now."""
        start = _cpu_seconds(pid)
        if start is None:
            return None  # no /proc: RLIMIT_CPU in the child still applies
        limit = start + cpu_s

        def check() -> None:
            used = _cpu_seconds(pid)
            if used is not None and used > limit:
                raise _CpuExceeded

        return check

    def _call_api(self, msg: dict) -> dict:
        app, fn, args, kwargs = msg.get("app"), msg.get("fn"), msg.get("args"), msg.get("kwargs")
        if self._api_handler is None:
            return {"ok": False, "error": "no APIs are available in this environment"}
        if not (isinstance(app, str) and isinstance(fn, str) and isinstance(args, list) and isinstance(kwargs, dict)):
            return {"ok": False, "error": "malformed API call"}
        try:
            value = self._api_handler(app, fn, args, kwargs)
        except Exception as e:
            return {"ok": False, "error": str(e) or type(e).__name__}
        reply = {"ok": True, "value": value}
        try:
            size = len(json.dumps(reply))
        except (TypeError, ValueError) as e:
            return {"ok": False, "error": f"apis.{app}.{fn} returned a value that cannot be sent to the sandbox: {e}"}
        if size + 1 > _MAX_FRAME:
            return {"ok": False, "error": f"apis.{app}.{fn} returned too much data ({size} bytes)"}
        return reply

    def _observe(self, code: str, timeout_s: float | None) -> str:
        """Runs agent code; handles timeouts and crashes (restart + message); renders the observation."""
        status, text = self._execute({"op": "run", "code": code, "trusted": False}, timeout_s)
        if status == "ok":
            return text.render(self.limits)
        exit_status = self._res.kill_child()
        if self._closed:
            raise SandboxError("the sandbox was closed during run()")
        limits = self.limits
        if timeout_s is not None:
            limits = dataclasses.replace(limits, wall_s=timeout_s, cpu_s=timeout_s)
        text.tail = _restart_message(status, exit_status, limits)
        self.restarts += 1
        self._start()
        return text.render(self.limits)


def _restart_message(status: str, code: int | None, limits: SandboxLimits) -> str:
    after = "the Python session was restarted, so earlier variables are gone."
    if status == "timeout":
        return f"Execution timed out after {limits.wall_s:g} s; {after}"
    if status == "protocol":
        return f"The Python process broke the sandbox's control protocol (it wrote to the control pipe); {after}"
    if status == "cpu" or code == -signal.SIGXCPU:
        return f"Execution exceeded the CPU time limit of {limits.cpu_s:g} s; {after}"
    if code is not None and code < 0:
        name = _signal_name(-code)
        hint = " (possibly the CPU or memory limit)" if -code == signal.SIGKILL else ""
        return f"The Python process crashed ({name}{hint}); {after}"
    return f"The Python process exited (status {code}); {after}"


def _parse_json(payload: bytes) -> dict:
    try:
        msg = json.loads(payload)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the child's proxy allows
        raise _ProtocolError(str(e)) from None
    if not isinstance(msg, dict):
        raise _ProtocolError("expected a JSON object")
    return msg


def _bounded(text: Any, limit: int) -> str | None:
    """A child-provided string, cut in the middle when longer than `limit` characters."""
    if not isinstance(text, str) or not text:
        return None
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


@dataclasses.dataclass(frozen=True)
class CallResult:
    """What `Sandbox.call` returned.

    Attributes:
      status: "ok" (value holds the function's result), "error" (it raised or returned a non-string; message
        holds the traceback), "timeout" (wall or CPU time ran out) or "gone" (the process died); after "timeout"
        and "gone" the session was restarted (message says why).
      value: the returned string (status "ok" only).
      message: what went wrong ("" for "ok").
    """

    status: str
    value: str | None
    message: str


@dataclasses.dataclass
class _RunText:
    """The pieces of one run's observation (and a call's returned value)."""

    output: list[str] = dataclasses.field(default_factory=list)
    kept: int = 0
    dropped: int = 0
    error: str | None = None
    tail: str = ""
    value: str | None = None

    def add_output(self, piece: str, limit: int) -> None:
        room = limit - self.kept
        if room > 0:
            self.output.append(piece[:room])
            self.kept += min(len(piece), room)
        self.dropped += max(0, len(piece) - max(room, 0))

    def render(self, limits: SandboxLimits) -> str:
        text = "".join(self.output)
        if self.dropped or (self.tail and self.kept >= limits.output_chars):
            more = f"{self.dropped} more characters" if self.dropped else "more output was dropped"
            text += ("" if not text or text.endswith("\n") else "\n") + f"[output truncated: {more}]\n"
        for extra in (self.error, self.tail):
            if extra:
                text += ("" if not text or text.endswith("\n") else "\n") + extra
        if not text:
            return "Execution successful."
        if self.error or self.tail:
            text = text.rstrip("\n")
        return text.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates in observations
