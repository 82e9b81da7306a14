"""Child side of `rltldr_jax.envs.sandbox.Sandbox` (standard library only).

The parent starts this file's text as `python -I -S -c <source> <config json>` in a fresh session. It
applies the isolation layers (rlimits, network namespace, privilege drop, audit hook; see the parent
module's docstring), then serves requests read from a control pipe:

- parent -> child: JSON frames `{"op": "run", "code", "trusted"}` and, during a run, replies to API calls
  `{"ok": true, "value"}` / `{"ok": false, "error"}`.
- child -> parent: `{"op": "ready", "isolation"}` once; during a run raw output frames (kind b"O") and API
  calls `{"op": "api", "app", "fn", "args", "kwargs"}`; then `{"op": "done", "error", "dropped"}`.

A frame is a 4-byte big-endian length, a kind byte (b"J" JSON, b"O" output text in UTF-8), and the payload.
Nothing here is trusted by the parent: agent code can rewrite any of it, so the parent bounds and checks all
it reads. This file must stay compatible with any Python >= 3.8 (the child may be the system interpreter).
"""

from __future__ import annotations

import _thread
import io
import json
import os
import posix
import sys

_ALLOWED_KINDS = (b"J", b"O")
_SYSTEM_FRAME = "<sandbox>"


# ----------------------------------------------------------------------------------------------- framing


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:  # the parent went away: nothing left to do
            os._exit(0)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Channel:
    """Framed messages over the two control pipes; one lock per direction (agent threads may print)."""

    def __init__(self, cmd_fd: int, msg_fd: int, max_frame: int):
        self.cmd_fd, self.msg_fd, self.max_frame = cmd_fd, msg_fd, max_frame
        self.send_lock = _thread.allocate_lock()
        self.call_lock = _thread.allocate_lock()

    def send_raw(self, kind: bytes, payload: bytes) -> None:
        header = (len(payload) + 1).to_bytes(4, "big") + kind
        with self.send_lock:
            _write_all(self.msg_fd, header + payload)

    def send(self, obj: dict) -> None:
        self.send_raw(b"J", json.dumps(obj).encode())

    def recv(self) -> dict:
        n = int.from_bytes(_read_exact(self.cmd_fd, 4), "big")
        if not 1 <= n <= self.max_frame:
            raise RuntimeError(f"bad frame length {n} from the parent")
        data = _read_exact(self.cmd_fd, n)
        return json.loads(data[1:].decode())


# ------------------------------------------------------------------------------------------ output capture


class _Capture:
    """Combined stdout+stderr of one run: forwards the first `limit` characters, counts the rest."""

    def __init__(self, channel: _Channel, limit: int):
        self.channel, self.limit = channel, limit
        self.kept = self.dropped = 0
        self.active = False
        self.lock = _thread.allocate_lock()

    def reset(self) -> None:
        self.kept = self.dropped = 0
        self.active = True

    def write(self, text: str) -> None:
        if not self.active or not text:
            return
        with self.lock:
            room = self.limit - self.kept
            if room > 0:
                piece = text[:room]
                self.kept += len(piece)
                self.channel.send_raw(b"O", piece.encode("utf-8", "replace"))
            self.dropped += max(0, len(text) - max(room, 0))


class _BinaryStream:
    """`sys.stdout.buffer`: bytes decoded as UTF-8 into the same capture."""

    def __init__(self, capture: _Capture):
        self._capture = capture

    def write(self, data: bytes) -> int:
        self._capture.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        pass


class _Stream(io.TextIOBase):
    """A text stream (sys.stdout / sys.stderr) writing into a `_Capture`."""

    def __init__(self, capture: _Capture, name: str):
        self._capture, self._name = capture, name
        self.buffer = _BinaryStream(capture)

    @property
    def name(self) -> str:
        return self._name

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def errors(self) -> str:
        return "replace"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._capture.write(text)
        return len(text)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the sandbox's output stream has no file descriptor")


# -------------------------------------------------------------------------------------------------- APIs


#: Lists/dicts in API arguments nest at most this deep (the parent decodes them; far below its recursion limit).
_MAX_API_NESTING = 100


class ApiError(Exception):
    """An API call failed in the environment (the message is the environment's)."""


def _nests_deeper(value, limit: int) -> bool:
    """True if lists, tuples and dicts nest more than `limit` levels in `value` (depth first, without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > limit:
                return True
            stack.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))
    return False


def _make_apis(channel: _Channel):
    """The `apis` proxy: `apis.<app>.<fn>(*args, **kwargs)` is answered by the parent's api_handler."""

    def call(app: str, fn: str, args: tuple, kwargs: dict):
        if any(_nests_deeper(v, _MAX_API_NESTING) for v in (*args, *kwargs.values())):
            raise ValueError(f"apis.{app}.{fn}(): arguments nest lists/dicts more than {_MAX_API_NESTING} levels deep")
        try:
            payload = json.dumps({"op": "api", "app": app, "fn": fn, "args": list(args), "kwargs": kwargs})
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"apis.{app}.{fn}(): arguments must be JSON-serialisable (str, int, float, bool, None, "
                f"list, dict with str keys): {e}"
            ) from None
        data = payload.encode()
        if len(data) + 1 > channel.max_frame:
            raise ValueError(
                f"apis.{app}.{fn}(): arguments too large ({len(data)} bytes; the limit is {channel.max_frame})"
            )
        with channel.call_lock:
            channel.send_raw(b"J", data)
            reply = channel.recv()
        if reply.get("ok"):
            return reply.get("value")
        raise ApiError(str(reply.get("error", "API call failed")))

    class ApiFunction:
        __slots__ = ("_app", "_fn")

        def __init__(self, app: str, fn: str):
            self._app, self._fn = app, fn

        def __call__(self, *args, **kwargs):
            return call(self._app, self._fn, args, kwargs)

        def __repr__(self) -> str:
            return f"<API apis.{self._app}.{self._fn}>"

    class App:
        __slots__ = ("_app",)

        def __init__(self, app: str):
            self._app = app

        def __getattr__(self, fn: str):
            if fn.startswith("_"):
                raise AttributeError(fn)
            return ApiFunction(self._app, fn)

        def __repr__(self) -> str:
            return f"<API app apis.{self._app}>"

    class Apis:
        __slots__ = ()

        def __getattr__(self, app: str):
            if app.startswith("_"):
                raise AttributeError(app)
            return App(app)

        def __repr__(self) -> str:
            return "<APIs: call apis.<app>.<function>(...)>"

    return Apis()


# ----------------------------------------------------------------------------------------------- isolation


def _apply_rlimits(cfg: dict) -> None:
    import resource

    mb = 1 << 20
    limits = [
        (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, cfg["file_mb"] * mb),
        (resource.RLIMIT_CORE, 0),
    ]
    if cfg.get("drop_uid") is not None:
        limits.append((resource.RLIMIT_NPROC, cfg["nproc"]))
    for which, value in limits:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _native_isolation(cfg: dict, stdlib_dir: str) -> list:
    """The OS layers, via libc, before any agent code (and before the audit hook forbids ctypes): network namespace,
    privilege drop to the sandbox's own uid, undumpable, death with the parent, Landlock, then seccomp (last: it
    forbids the unshare/prctl calls the earlier steps make). Returns the names of the layers applied.

    Raises when a layer that the parent asked for fails after the kernel showed it has it (a half-confined child
    never runs agent code); layers the kernel lacks are skipped and left out of the returned names."""
    layers = []
    is_root = os.geteuid() == 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:  # no ctypes in this interpreter: no namespace, no prctl, no Landlock, no seccomp
        libc = None
    if libc is not None and cfg.get("netns", True):
        clone_newnet, clone_newuser = 0x40000000, 0x10000000
        flags = clone_newnet if is_root else clone_newuser | clone_newnet
        if libc.unshare(flags) == 0:
            layers.append("netns")
    if cfg.get("drop_uid") is not None and is_root:
        uid = gid = cfg["drop_uid"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        layers.append(f"uid:{uid}")
    if libc is not None:
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no core dumps, no ptrace by same-uid processes
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG SIGKILL (after setuid, which clears it): die with the trainer
        if os.getppid() != cfg["parent_pid"]:  # the trainer died before the line above
            os._exit(0)
        confine = {"__name__": "_sandbox_confine"}
        exec(compile(cfg["confine_source"], "<sandbox-confine>", "exec"), confine)
        if cfg.get("landlock", True):
            abi = confine["apply_landlock"](libc, cfg["workdir"], confine["read_roots"](stdlib_dir))
            if abi:
                layers.append(f"landlock:{abi}")
        if cfg.get("seccomp", True) and confine["apply_seccomp"](libc, os.getpid()):
            layers.append("seccomp")
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]
    for module, attr in ((os, "pidfd_open"), (posix, "pidfd_open")):
        if hasattr(module, attr):
            delattr(module, attr)
    return layers


def _make_cpu_limiter(cpu_s: float):
    """Sets RLIMIT_CPU (soft) to the CPU used so far + cpu_s; the audit hook allows no more than that."""
    import math
    import resource

    def limit_cpu(
        *,
        _getrusage=resource.getrusage,
        _getrlimit=resource.getrlimit,
        _setrlimit=resource.setrlimit,
        _self=resource.RUSAGE_SELF,
        _cpu=resource.RLIMIT_CPU,
        _ceil=math.ceil,
        _cpu_s=cpu_s,
    ):
        usage = _getrusage(_self)
        hard = _getrlimit(_cpu)[1]
        soft = _ceil(usage.ru_utime + usage.ru_stime + _cpu_s)
        if hard >= 0:
            soft = min(soft, hard)
        _setrlimit(_cpu, (soft, hard))

    return limit_cpu


def _make_hook(workdir: str, pid: int, stdlib_dirs: tuple, cpu_s: float):
    """The audit hook. It has no mutable state and reaches nothing through globals (agent code can rebind
    module attributes and builtins, so every helper is bound as a keyword default; replacing a function's
    __code__/__defaults__ is itself refused)."""
    import resource
    import types

    proc_prefix = "/proc/"

    def realpath(
        path,
        cwd,
        *,
        _lstat=posix.lstat,
        _readlink=posix.readlink,
        _list=list,
        _reversed=reversed,
        _OSError=OSError,
        _join="/".join,
    ):
        if not path.startswith("/"):
            path = cwd + "/" + path
        pending = _list(_reversed(path.split("/")))
        out = []
        links = 0
        while pending:
            part = pending.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            candidate = "/" + _join(out + [part])
            try:
                mode = _lstat(candidate).st_mode
            except _OSError:
                out.append(part)
                continue
            if mode & 0o170000 == 0o120000:
                links += 1
                if links > 40:
                    raise _OSError("too many symbolic links")
                target = _readlink(candidate)
                if target.startswith("/"):
                    out = []
                pending.extend(_reversed(target.split("/")))
            else:
                out.append(part)
        return "/" + _join(out)

    def resolve(
        path,
        dir_fd,
        follow,
        *,
        _realpath=realpath,
        _getcwd=posix.getcwd,
        _fspath=posix.fspath,
        _decode=bytes.decode,
        _isinstance=isinstance,
        _int=int,
        _bytes=bytes,
        _readlink=posix.readlink,
        _str=str,
    ):
        """The absolute, symlink-free path an operation touches (None for an open file descriptor)."""
        if _isinstance(path, _int):
            return _realpath(_readlink("/proc/self/fd/" + _str(path)), "/")
        path = _fspath(path)
        if _isinstance(path, _bytes):
            path = _decode(path, "utf-8", "surrogateescape")
        base = _getcwd()
        if _isinstance(dir_fd, _int) and dir_fd >= 0 and not path.startswith("/"):
            base = _readlink("/proc/self/fd/" + _str(dir_fd))
        if follow:
            return _realpath(path, base)
        head, _, tail = path.rpartition("/")
        if not path.startswith("/"):
            head = base + ("/" + head if head else "")
        return _realpath(head or "/", "/").rstrip("/") + "/" + tail

    def denied(what, hint, *, _PermissionError=PermissionError):
        return _PermissionError(f"{what} is not allowed in the sandbox; {hint}")

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    process_events = frozenset(
        ["os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "pty.spawn"]
    )
    network_events = frozenset(
        [
            "socket.connect",
            "socket.bind",
            "socket.sendto",
            "socket.sendmsg",
            "socket.getaddrinfo",
            "socket.gethostbyname",
            "socket.gethostbyaddr",
            "socket.getnameinfo",
        ]
    )
    # event -> ((argument index, dir_fd index or -1, follow symlinks), ...)
    path_events = {
        "os.remove": ((0, 1, False),),
        "os.rmdir": ((0, 1, False),),
        "os.mkdir": ((0, 2, False),),
        "os.rename": ((0, 2, False), (1, 3, False)),
        "os.link": ((0, 2, True), (1, 3, False)),
        "os.symlink": ((1, 2, False),),
        "os.chmod": ((0, 2, True),),
        "os.chown": ((0, 3, True),),
        "os.truncate": ((0, -1, True),),
        "os.utime": ((0, 3, True),),
        "os.setxattr": ((0, -1, True),),
        "os.removexattr": ((0, -1, True),),
    }
    path_events = tuple(path_events.items())  # immutable: the hook's state must not be changeable in place
    # Known ways around a Python audit hook: subinterpreters (hooks are per interpreter), reaching the hook's state
    # through the garbage collector or other threads' frames, and CPython's test modules (raw memory access).
    # Refused as defence in depth; the OS layers (seccomp, Landlock, own uid) hold without this hook.
    bypass_events = frozenset(
        ["cpython.PyInterpreterState_New", "gc.get_objects", "gc.get_referrers", "gc.get_referents"]
        + ["sys._current_frames", "sys._current_exceptions"]
    )
    watched = frozenset(
        ["open", "socket.__new__", "os.kill", "os.killpg", "import", "object.__setattr__", "resource.setrlimit"]
        + ["resource.prlimit", "sys.settrace", "sys.setprofile"]
        + list(process_events)
        + list(network_events)
        + [event for event, _ in path_events]
        + list(bypass_events)
    )
    blocked_imports = frozenset(
        ["_posixsubprocess", "_ctypes", "ctypes", "_posixshmem", "_xxsubinterpreters", "_interpreters"]
        + ["_xxinterpchannels", "_interpchannels", "_interpqueues", "_testcapi", "_testinternalcapi", "_testbuffer"]
        + ["_testmultiphase", "_testsinglephase", "_testimportmultiple", "_testclinic", "_testclinic_limited"]
        + ["_testlimitedcapi", "_testexternalinspection", "_xxtestfuzz", "_ctypes_test"]
    )
    protected_attrs = frozenset(["__code__", "__defaults__", "__kwdefaults__"])
    workdir = workdir.rstrip("/")
    inside = workdir + "/"
    pid_str = str(pid)

    def hook(
        event,
        args,
        *,
        _watched=watched,
        _process=process_events,
        _network=network_events,
        _paths=path_events,
        _bypass=bypass_events,
        _blocked_imports=blocked_imports,
        _protected=protected_attrs,
        _write_flags=write_flags,
        _workdir=workdir,
        _inside=inside,
        _pid=pid,
        _pid_str=pid_str,
        _proc=proc_prefix,
        _stdlib=stdlib_dirs,
        _resolve=resolve,
        _denied=denied,
        _isinstance=isinstance,
        _str=str,
        _int=int,
        _len=len,
        _function=types.FunctionType,
        _OSError=OSError,
        _getrusage=resource.getrusage,
        _getrlimit=resource.getrlimit,
        _self=resource.RUSAGE_SELF,
        _cpu=resource.RLIMIT_CPU,
        _cpu_s=cpu_s,
    ):
        if event not in _watched:
            if event.startswith("ctypes."):
                raise _denied("ctypes (" + event + ")", "native code cannot be loaded")
            return
        if event == "open":
            path, mode, flags = args
            if path is None or _isinstance(path, _int):
                return
            writing = (_isinstance(flags, _int) and flags & _write_flags) or (
                _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            )
            try:
                real = _resolve(path, None, True)
            except _OSError:
                real = "?"
            if writing and real != "/dev/null" and real != _workdir and not real.startswith(_inside):
                raise _denied(f"writing to {path!r}", "only files under the working directory can be changed")
            if real.startswith(_proc):
                first = real[6:].partition("/")[0]
                if first.isdigit() and first != _pid_str:
                    raise _denied(f"reading {path!r}", "other processes cannot be inspected")
            return
        if event in _bypass:
            raise _denied(event, "it would reach around the sandbox's checks")
        for path_event, specs in _paths:
            if path_event != event:
                continue
            for index, dir_index, follow in specs:
                path = args[index]
                dir_fd = args[dir_index] if dir_index >= 0 else None
                try:
                    real = _resolve(path, dir_fd, follow)
                except _OSError:
                    real = "?"
                if real != _workdir and not real.startswith(_inside):
                    raise _denied(f"{event} on {path!r}", "only files under the working directory can be changed")
            return
        if event in _process:
            raise _denied(f"starting processes ({event})", "run the code directly in this Python session")
        if event in _network or (event == "socket.__new__" and args[1] != 1):
            raise _denied(f"network access ({event})", "there is no network")
        if event == "os.kill" or event == "os.killpg":
            if args[0] != _pid:
                raise _denied(f"sending signals to other processes ({event})", "only this process can be signalled")
            return
        if event == "import":
            name, filename = args[0], args[1]
            if name in _blocked_imports:
                if name.startswith("_test") or "interp" in name or name == "_xxtestfuzz":
                    raise _denied(f"importing {name}", "it would run code around the sandbox's checks")
                raise _denied(f"importing {name}", "it can start processes or load native code")
            if _isinstance(filename, _str) and filename.endswith(".so"):
                ok = False
                for d in _stdlib:
                    if filename.startswith(d):
                        ok = True
                if not ok:
                    raise _denied(
                        f"loading the extension module {filename!r}", "only the standard library's are available"
                    )
            return
        if event == "object.__setattr__":
            if _isinstance(args[0], _function) and args[1] in _protected:
                raise _denied(f"replacing a function's {args[1]}", "define a new function instead")
            return
        if event == "resource.prlimit" and (_len(args) < 3 or args[2] is None):
            return
        if event == "resource.setrlimit" and args[0] == _cpu:
            # the runner sets the CPU limit of each run; anyone may, but never beyond now + cpu_s
            usage = _getrusage(_self)
            soft, hard = args[1]
            if hard == _getrlimit(_cpu)[1] and 0 <= soft <= usage.ru_utime + usage.ru_stime + _cpu_s + 1:
                return
        if event.startswith("resource.") or event.startswith("sys.set"):
            raise _denied(event, "the sandbox's limits and tracing are fixed")

    return hook


# --------------------------------------------------------------------------------------------- tracebacks

_MAX_FRAMES = 40
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


class _Sources:
    """Source lines of the code blocks run so far, by internal filename (`<agent:N>`, `<preamble>`)."""

    def __init__(self):
        self.lines: dict = {}
        self.current = ""

    def label(self, filename: str) -> str:
        if filename == self.current:
            return "<agent>"
        if filename.startswith("<agent:"):
            return f"<agent, code block {filename[7:-1]}>"
        return filename

    def line(self, filename: str, lineno) -> str:
        lines = self.lines.get(filename)
        if lines is None or not isinstance(lineno, int) or not 1 <= lineno <= len(lines):
            return ""
        return lines[lineno - 1].strip()


def _exception_line(exc: BaseException) -> str:
    cls = type(exc)
    name = cls.__qualname__
    if cls.__module__ not in ("builtins", "__main__"):
        name = f"{cls.__module__}.{name}"
    try:
        message = str(exc)
    except BaseException:
        message = "<the exception's str() failed>"
    text = f"{name}: {message}" if message else name
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, (list, tuple)):
        text += "".join(f"\n{note}" for note in notes if isinstance(note, str))
    return text


def _frame_lines(exc: BaseException, sources: _Sources, all_frames: bool) -> list:
    entries = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = code.co_filename
        if all_frames or filename.startswith("<agent:"):
            entries.append((filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    out, last, repeats = [], None, 0
    for entry in entries:
        if entry == last:
            repeats += 1
            if repeats > 3:
                continue
        else:
            if repeats > 3:
                out.append(f"  [Previous line repeated {repeats - 3} more times]\n")
            last, repeats = entry, 1
        filename, lineno, name = entry
        text = f'  File "{sources.label(filename)}", line {lineno}, in {name}\n'
        source = sources.line(filename, lineno)
        out.append(text + (f"    {source}\n" if source else ""))
    if repeats > 3:
        out.append(f"  [Previous line repeated {repeats - 3} more times]\n")
    if len(out) > _MAX_FRAMES:
        half = _MAX_FRAMES // 2
        out = out[:half] + [f"  ... {len(out) - 2 * half} more frames ...\n"] + out[-half:]
    return out


def _syntax_lines(exc: SyntaxError, sources: _Sources) -> list:
    filename = exc.filename if isinstance(exc.filename, str) else "<string>"
    out = [f'  File "{sources.label(filename)}", line {exc.lineno}\n']
    text = exc.text if isinstance(exc.text, str) else ""
    if text.strip():
        stripped = text.rstrip("\n")
        indent = len(stripped) - len(stripped.lstrip())
        out.append(f"    {stripped.strip()}\n")
        if isinstance(exc.offset, int) and exc.offset >= 1:
            out.append("    " + " " * max(0, exc.offset - 1 - indent) + "^\n")
    out.append(f"{type(exc).__name__}: {exc.msg}\n")
    return out


def _format_one(exc: BaseException, sources: _Sources, all_frames: bool) -> str:
    frames = _frame_lines(exc, sources, all_frames)
    text = "Traceback (most recent call last):\n" + "".join(frames) if frames else ""
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return text + "".join(_syntax_lines(exc, sources))
    return text + _exception_line(exc) + "\n"


def format_exception(exc: BaseException, sources: _Sources, all_frames: bool = False) -> str:
    """A traceback showing only the agent's frames (all frames for trusted code), with causes/contexts."""
    chain, links, seen = [], [], set()
    current = exc
    while current is not None and id(current) not in seen and len(chain) < 8:
        seen.add(id(current))
        chain.append(current)
        if current.__cause__ is not None:
            links.append(_CAUSE)
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            links.append(_CONTEXT)
            current = current.__context__
        else:
            current = None
    parts = []
    for i in range(len(chain) - 1, -1, -1):
        parts.append(_format_one(chain[i], sources, all_frames))
        if i > 0:
            parts.append(links[i - 1])
    return "".join(parts)


# ---------------------------------------------------------------------------------------------- main loop


class _Runner:
    def __init__(self, channel: _Channel, capture: _Capture, namespace: dict, limit_cpu):
        self.channel, self.capture, self.namespace = channel, capture, namespace
        self.limit_cpu = limit_cpu
        self.sources = _Sources()
        self.blocks = 0
        self.stdout = _Stream(capture, "<stdout>")
        self.stderr = _Stream(capture, "<stderr>")

    def run(self, code: str, trusted: bool) -> dict:
        if trusted:
            filename = "<preamble>"
        else:
            self.blocks += 1
            filename = f"<agent:{self.blocks}>"
        self.sources.lines[filename] = code.splitlines()
        self.sources.current = "" if trusted else filename
        _, error = self._guarded(
            lambda: exec(compile(code, filename, "exec", dont_inherit=True), self.namespace), trusted
        )
        return {"op": "done", "error": error, "dropped": self.capture.dropped}

    def call(self, name: str, argument: str) -> dict:
        """Calls `name(argument)` from the session's globals (a function the preamble defined, e.g. a verifier's
        server); its string result is sent back as "value". Output is captured as for run()."""
        value, error = self._guarded(lambda: self.namespace[name](argument), True)
        if error is None and not isinstance(value, str):
            value, error = None, f"{name}() returned {type(value).__name__}, not str\n"
        return {"op": "done", "error": error, "dropped": self.capture.dropped, "value": value}

    def _guarded(self, fn, all_frames: bool) -> tuple:
        """(fn's result, None) or (None, its formatted exception), with output captured and the CPU limit set."""
        self.capture.reset()
        self.limit_cpu()
        sys.stdout, sys.stderr = self.stdout, self.stderr
        try:
            return fn(), None
        except BaseException as exc:  # everything the agent does becomes an observation
            try:
                return None, format_exception(exc, self.sources, all_frames=all_frames)
            except BaseException:
                return None, f"{type(exc).__name__} (the traceback could not be formatted)\n"
        finally:
            self.capture.active = False
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__

    def serve(self) -> None:
        while True:
            request = self.channel.recv()
            op = request.get("op")
            if op == "run":
                self.channel.send(self.run(str(request.get("code", "")), bool(request.get("trusted"))))
            elif op == "call":
                self.channel.send(self.call(str(request.get("name", "")), str(request.get("argument", ""))))
            elif op == "exit":
                return
            else:
                self.channel.send({"op": "done", "error": f"sandbox: unknown request {op!r}\n", "dropped": 0})


def main(config_json: str) -> None:
    cfg = json.loads(config_json)
    channel = _Channel(cfg["cmd_fd"], cfg["msg_fd"], cfg["max_frame"])
    try:
        workdir = os.path.realpath(cfg["workdir"])
        os.chdir(workdir)
        roots = [p for p in sys.path if p and os.path.isdir(p)]
        stdlib_dirs = tuple({d.rstrip("/") + "/" for p in roots for d in (p, os.path.realpath(p))})
        _apply_rlimits(cfg)
        layers = ["rlimits"]
        layers += _native_isolation(cfg, os.path.dirname(os.__file__))
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        if cfg.get("api"):
            namespace["apis"] = _make_apis(channel)
            namespace["ApiError"] = ApiError
        capture = _Capture(channel, cfg["output_chars"])
        runner = _Runner(channel, capture, namespace, _make_cpu_limiter(cfg["cpu_s"]))
        if cfg.get("audit_hook", True):
            sys.addaudithook(_make_hook(workdir, os.getpid(), stdlib_dirs, cfg["cpu_s"]))
            layers.append("audit-hook")
    except BaseException as exc:
        channel.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise
    channel.send({"op": "ready", "isolation": layers})
    runner.serve()


if __name__ == "__main__":
    main(sys.argv[1])
