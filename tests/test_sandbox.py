"""Sandbox: persistent sessions, observations, limits and containment of hostile agent code."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from rltldr_jax.envs.sandbox import Sandbox, SandboxError, SandboxLimits, _others_can, _stdlib_readable_by_others

FAST = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=1024, output_chars=2_000)
RESTARTED = "the Python session was restarted, so earlier variables are gone."


@pytest.fixture
def sandbox():
    with Sandbox(FAST) as sb:
        yield sb


def _children(pid: int) -> list[int]:
    """Live (non-zombie) child processes of `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------------------------------- sessions


def test_globals_persist_and_success_message(sandbox):
    assert sandbox.run("x = 41") == "Execution successful."
    assert sandbox.run("x += 1\nprint(x)") == "42\n"
    assert sandbox.run("import sys\nprint('out'); print('err', file=sys.stderr)") == "out\nerr\n"
    assert "audit-hook" in sandbox.isolation and "rlimits" in sandbox.isolation


def test_traceback_shows_only_agent_frames(sandbox):
    sandbox.run("def f(a):\n    return a / 0")
    obs = sandbox.run("print('before')\ny = 2\nf(y)")
    assert obs == (
        "before\n"
        "Traceback (most recent call last):\n"
        '  File "<agent>", line 3, in <module>\n'
        "    f(y)\n"
        '  File "<agent, code block 1>", line 2, in f\n'
        "    return a / 0\n"
        "ZeroDivisionError: division by zero"
    )
    assert "sandbox" not in obs and "_sandbox_child" not in obs


def test_syntax_error_names_line_and_message(sandbox):
    obs = sandbox.run("x = 1\nprint(x\n")
    assert 'File "<agent>", line 2' in obs and "SyntaxError: '(' was never closed" in obs
    assert sandbox.run("print(1)") == "1\n"


# -------------------------------------------------------------------------------------- hostile code


def test_network_is_blocked(sandbox):
    obs = sandbox.run("import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))")
    assert "PermissionError: network access (socket.__new__) is not allowed in the sandbox" in obs
    obs = sandbox.run("import socket\nsocket.create_connection(('example.com', 80), timeout=1)")
    assert "PermissionError: network access" in obs


def test_fork_bomb_and_subprocess_are_blocked(sandbox):
    obs = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert "line 3, in <module>\n    os.fork()\nPermissionError: starting processes (os.fork) is not allowed" in obs
    assert "PermissionError" in sandbox.run("import os\nos.system('touch /tmp/x')")
    assert "PermissionError: importing _posixsubprocess" in sandbox.run("import subprocess")
    assert "PermissionError" in sandbox.run("import ctypes")
    assert sandbox.restarts == 0


def test_memory_bombs_raise_memory_error(sandbox):
    obs = sandbox.run("x = bytearray(10**11)")
    assert obs.endswith("    x = bytearray(10**11)\nMemoryError")
    obs = sandbox.run("big = []\nwhile True:\n    big.append('a' * 10**6)")
    assert obs.endswith("MemoryError") or RESTARTED in obs
    assert sandbox.run("big = None\nprint('alive')") == "alive\n"


def test_infinite_loop_times_out_and_restarts(sandbox):
    sandbox.run("kept = 1")
    start = time.monotonic()
    obs = sandbox.run("while True:\n    pass")
    assert time.monotonic() - start < FAST.wall_s + 2.5
    assert obs == f"Execution timed out after 2 s; {RESTARTED}"
    assert sandbox.restarts == 1
    assert "NameError: name 'kept' is not defined" in sandbox.run("kept")
    assert sandbox.run("print('works')") == "works\n"


def test_cpu_limit():
    with Sandbox(SandboxLimits(wall_s=10.0, cpu_s=1.0)) as sb:
        start = time.monotonic()
        obs = sb.run("while True:\n    pass")
        assert obs == f"Execution exceeded the CPU time limit of 1 s; {RESTARTED}"
        assert time.monotonic() - start < 5.0
        assert sb.restarts == 1 and sb.run("print(1)") == "1\n"


def test_writing_to_the_control_pipe_restarts(sandbox):
    code = (
        "import sys, json, os\nfd = json.loads(sys.argv[1])['msg_fd']\nos.write(fd, (5).to_bytes(4, 'big') + b'Jnull')"
    )
    obs = sandbox.run(code)
    assert obs == f"The Python process broke the sandbox's control protocol (it wrote to the control pipe); {RESTARTED}"
    obs = sandbox.run("import sys, json, os\nos.write(json.loads(sys.argv[1])['msg_fd'], b'\\xff' * 8)")
    assert "control protocol" in obs and sandbox.run("print('ok')") == "ok\n"


def test_crash_restarts_with_clear_message(sandbox):
    obs = sandbox.run("import faulthandler\nfaulthandler._sigsegv()")
    assert obs == f"The Python process crashed (SIGSEGV); {RESTARTED}"
    assert sandbox.run("import os\nos._exit(3)") == f"The Python process exited (status 3); {RESTARTED}"
    assert sandbox.restarts == 2 and sandbox.run("print('ok')") == "ok\n"


def test_writes_outside_the_sandbox_are_blocked(sandbox):
    evil = f"/tmp/evil_{uuid.uuid4().hex}"
    try:
        attempts = [
            f"open({evil!r}, 'w').write('x')",
            f"import os\nos.close(os.open({evil!r}, os.O_WRONLY | os.O_CREAT))",
            f"import os\nos.symlink({evil!r}, 'link')\nopen('link', 'w').write('x')",
            f"open('inside.txt', 'w').close()\nimport os\nos.rename('inside.txt', {evil!r})",
            f"import os\nos.mkdir({evil!r})",
            "open('/proc/self/mem', 'wb')",
            f"open('../{Path(evil).name}', 'w')",
        ]
        for code in attempts:
            obs = sandbox.run(code)
            assert "PermissionError" in obs and "is not allowed in the sandbox" in obs, (code, obs)
            assert not os.path.lexists(evil), code
        obs = sandbox.run("open('/proc/1/environ').read()")
        assert "PermissionError: reading '/proc/1/environ' is not allowed" in obs
        # inside the working directory everything works, including fd-relative removal (shutil.rmtree)
        code = (
            "import os, shutil\nos.makedirs('a/b')\nopen('a/b/f.txt', 'w').write('hi')\nprint(open('a/b/f.txt').read())"
        )
        assert sandbox.run(code) == "hi\n"
        assert (Path(sandbox.workdir) / "a/b/f.txt").read_text() == "hi"
        assert sandbox.run("shutil.rmtree('a')\nprint(os.path.exists('a'))") == "False\n"
    finally:
        if os.path.lexists(evil):
            os.unlink(evil)


def test_environment_is_empty(monkeypatch):
    monkeypatch.setenv("RLTLDR_SECRET_TOKEN", "hunter2")
    with Sandbox(FAST) as sb:
        obs = sb.run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('RLTLDR_SECRET_TOKEN'))")
    assert obs == "['HOME', 'LANG', 'PATH', 'TMPDIR']\nNone\n"


def test_cannot_kill_the_parent(sandbox):
    me = os.getpid()
    for code in [
        "import os\nos.kill(os.getppid(), 9)",
        f"import os\nos.kill({me}, 9)",
        f"import os\nos.killpg(os.getpgid({me}), 9)",
        "import os\nos.kill(-1, 9)",
    ]:
        obs = sandbox.run(code)
        assert "PermissionError: sending signals to other processes" in obs, obs
    assert sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").startswith(
        "The Python process crashed (SIGKILL"
    )
    assert os.getpid() == me  # still here


def test_printing_gigabytes_is_truncated_and_bounded():
    rss = _rss_mb()
    with Sandbox(FAST) as sb:
        start = time.monotonic()
        obs = sb.run("while True:\n    print('x' * 10**6)")
        assert time.monotonic() - start < FAST.wall_s + 2.0
        assert obs.startswith("x" * 2_000 + "\n[output truncated: more output was dropped]\nExecution timed out")
    # 1 GB string: room for it in memory, and wall time for a loaded machine to fill the pages
    with Sandbox(SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048, output_chars=2_000)) as sb:
        obs = sb.run("print('x' * 10**9)")
        assert obs == "x" * 2_000 + f"\n[output truncated: {10**9 + 1 - 2_000} more characters]\n"
        assert sb.run("print('small')") == "small\n"
    assert _rss_mb() - rss < 100


# ---------------------------------------------------------------------------------------------- APIs


def test_api_handler_round_trip():
    calls = []

    def handler(app, fn, args, kwargs):
        calls.append((app, fn, args, kwargs))
        if fn == "fail":
            raise ValueError(f"song {args[0]} does not exist")
        return {"app": app, "fn": fn, "sum": sum(args), "kw": kwargs, "list": [1, None, "s"]}

    with Sandbox(FAST, api_handler=handler) as sb:
        obs = sb.run("r = apis.spotify.play(1, 2, volume=3)\nprint(r['sum'], r['kw'], r['list'])")
        assert obs == "3 {'volume': 3} [1, None, 's']\n"
        assert calls == [("spotify", "play", [1, 2], {"volume": 3})]
        obs = sb.run("x = 1\napis.spotify.fail(7)")
        assert obs == (
            "Traceback (most recent call last):\n"
            '  File "<agent>", line 2, in <module>\n'
            "    apis.spotify.fail(7)\n"
            "ApiError: song 7 does not exist"
        )
        assert (
            sb.run("try:\n    apis.a.fail(1)\nexcept ApiError as e:\n    print('caught', e)")
            == "caught song 1 does not exist\n"
        )
        obs = sb.run("apis.a.b(object())")
        assert "TypeError: apis.a.b(): arguments must be JSON-serialisable" in obs
        start = time.perf_counter()
        assert sb.run("for i in range(300):\n    apis.a.b(i)") == "Execution successful."
        # A generous bound (300 relayed calls take ~0.1 s): it catches a per-call wait or poll, not jitter.
        assert time.perf_counter() - start < 10.0
    with Sandbox(FAST) as sb:
        assert "NameError: name 'apis' is not defined" in sb.run("apis.a.b()")


def test_a_deeply_nested_api_frame_is_a_protocol_error_not_an_exception():
    """Agent code that bypasses the `apis` proxy and writes a 5,000-deep API call to the control pipe: the parent's
    JSON decoder would raise RecursionError; the session restarts instead, with the protocol message."""
    deep = "[" * 5000 + "]" * 5000
    frame = f'J{{"op": "api", "app": "a", "fn": "b", "args": [{deep}], "kwargs": {{}}}}'
    code = (
        f"import sys, json, os\nframe = {frame!r}.encode()\n"
        "os.write(json.loads(sys.argv[1])['msg_fd'], len(frame).to_bytes(4, 'big') + frame)"
    )
    with Sandbox(FAST, api_handler=lambda app, fn, args, kwargs: None) as sb:
        assert "broke the sandbox's control protocol" in sb.run(code)
        assert sb.run("print('ok')") == "ok\n"


def test_preamble_runs_after_every_restart():
    preamble = "def helper():\n    return 'from preamble'"
    with Sandbox(FAST, preamble=preamble) as sb:
        assert sb.run("print(helper())") == "from preamble\n"
        assert "timed out" in sb.run("while True:\n    pass")
        assert sb.run("print(helper())") == "from preamble\n"
    with pytest.raises(SandboxError, match="preamble failed"):
        Sandbox(FAST, preamble="1 / 0")


def test_close_kills_child_and_removes_workdir():
    sb = Sandbox(FAST)
    sb.run("open('f.txt', 'w').write('x')")
    pid, workdir = sb._res.child.proc.pid, sb.workdir
    assert os.path.exists(os.path.join(workdir, "f.txt"))
    sb.close()
    sb.close()
    assert not os.path.exists(workdir)
    assert pid not in _children(os.getpid())
    with pytest.raises(SandboxError, match="closed"):
        sb.run("1")


def test_close_from_another_thread_interrupts_a_run():
    sb = Sandbox(SandboxLimits(wall_s=20.0, cpu_s=20.0))
    errors = []

    def spin():
        try:
            sb.run("while True:\n    pass")
        except SandboxError as e:
            errors.append(str(e))

    thread = threading.Thread(target=spin)
    start = time.monotonic()
    thread.start()
    time.sleep(0.3)
    sb.close()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - start < 3
    assert errors == ["the sandbox was closed during run()"]
    assert not os.path.exists(sb.workdir) and sb._res.child is None


def test_many_runs_do_not_leak_processes_or_fds():
    before, fds = _children(os.getpid()), len(os.listdir("/proc/self/fd"))
    with Sandbox(FAST) as sb:
        for i in range(40):
            sb.run(f"v = {i}\nprint(v)")
        for _ in range(3):
            sb.run("import os\nos._exit(1)")
        assert len(_children(os.getpid())) == len(before) + 1
    for _ in range(5):
        Sandbox(FAST).close()
    assert _children(os.getpid()) == before
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_works_for_an_unprivileged_parent(tmp_path):
    """The trainer may run without root: no privilege drop, the other layers still contain the code."""
    module = Path(__file__).resolve().parents[1] / "rltldr_jax" / "envs" / "sandbox.py"
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if _stdlib_readable_by_others(p)), None)
    if python is None or subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 9)"]).returncode:
        pytest.skip("no system python3 >= 3.9 that uid 65534 can run")
    if not _others_can(str(module), stat.S_IROTH) or not _others_can(
        str(module.with_name("_sandbox_child.py")), stat.S_IROTH
    ):
        pytest.skip("the repository is not readable by uid 65534")
    script = textwrap.dedent(f"""
        import importlib.util, os, sys
        spec = importlib.util.spec_from_file_location("sandbox", {str(module)!r})
        sb_mod = importlib.util.module_from_spec(spec)
        sys.modules["sandbox"] = sb_mod
        spec.loader.exec_module(sb_mod)
        with sb_mod.Sandbox(sb_mod.SandboxLimits(wall_s=2)) as sb:
            print(sb.isolation)
            print(sb.run("import os\\nos.kill(os.getppid(), 9)").splitlines()[-1])
            print(sb.run("open('/tmp/evil_' + str(os.getpid()), 'w')").splitlines()[-1])
            print(sb.run("x = 5\\nprint(x * 2)").strip())
        # the laptop case: the trainer's own files, with no audit hook to help (as in a subinterpreter)
        os.makedirs("ckpt", exist_ok=True)
        open("ckpt/meta.json", "w").write("good")
        with sb_mod.Sandbox(sb_mod.SandboxLimits(wall_s=2), audit_hook=False) as sb:
            print(sb.isolation)
            print(sb.run("open(" + repr(os.path.abspath("ckpt/meta.json")) + ", 'w').write('pwned')").splitlines()[-1])
            print(sb.run("import os\\nos.kill(os.getppid(), 0)").splitlines()[-1])
        print(open("ckpt/meta.json").read())
    """)
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    os.chmod(tmp_path, 0o777)
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=str(tmp_path),
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr
    assert "audit-hook" in lines[0] and "uid:" not in lines[0]
    assert lines[1].startswith("PermissionError: sending signals to other processes")
    assert lines[2].startswith("PermissionError: writing to '/tmp/evil_")
    assert lines[3] == "10"
    if "landlock:" in lines[4] and "seccomp" in lines[4]:
        assert "audit-hook" not in lines[4]
        assert lines[5].startswith("PermissionError: [Errno 13] Permission denied") and "meta.json" in lines[5]
        assert lines[6].startswith("PermissionError: [Errno 1] Operation not permitted")
    assert lines[7] == "good"


# ------------------------------------------------------------------------ OS layers (issue: audit-hook bypasses)

SUBINTERPRETER = "_interpreters" if hasattr(__import__("sys"), "_is_gil_enabled") else "_xxsubinterpreters"


def _need(sb: Sandbox, *layers: str) -> None:
    have = " ".join(sb.isolation)
    missing = [layer for layer in layers if layer not in have]
    if missing:
        pytest.skip(f"this kernel/user lacks {missing} (have {sb.isolation})")


def test_subinterpreters_and_hook_bypasses_are_refused(sandbox):
    """A subinterpreter runs without the parent interpreter's audit hook: refused, as are the garbage collector's
    object walks and other threads' frames (ways to reach the hook's state)."""
    evil = f"/tmp/evil_{uuid.uuid4().hex}"
    code = f"import {SUBINTERPRETER} as i\ni.run_string(i.create(), \"open({evil!r}, 'w')\")"
    assert f"PermissionError: importing {SUBINTERPRETER} is not allowed in the sandbox" in sandbox.run(code)
    probes = ("import gc\ngc.get_objects()", "import gc\ngc.get_referrers(len)", "import sys\nsys._current_frames()")
    for probe in probes:
        assert "is not allowed in the sandbox" in sandbox.run(probe), probe
    assert "is not allowed" in sandbox.run("import _testcapi")
    assert not os.path.exists(evil)


def test_os_layers_contain_code_without_the_audit_hook(tmp_path):
    """With no audit hook at all (what a subinterpreter or native code sees), the kernel still refuses: no
    processes, no signals to others, no sockets, no writes outside the working directory, no reads of the trainer's
    files (a checkpoint's meta.json here)."""
    meta = tmp_path / "checkpoints" / "3" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text('{"step": 3}')
    os.chmod(tmp_path, 0o755)
    for d in (tmp_path / "checkpoints", meta.parent):
        os.chmod(d, 0o755)
    os.chmod(meta, 0o666)  # even a world-writable file of the trainer's stays out of reach
    evil = f"/tmp/evil_{uuid.uuid4().hex}"
    with Sandbox(FAST, audit_hook=False) as sb:
        assert "audit-hook" not in sb.isolation
        _need(sb, "seccomp")
        probes = {
            "os.system": f"import os\nprint(os.system('touch {evil}'))",
            "posix_spawn": "import os\nos.posix_spawn('/bin/true', ['true'], {})",
            "fork": "import os\nos.fork()",
            "subprocess": "import subprocess\nsubprocess.run(['true'])",
            "kill parent": "import os\nos.kill(os.getppid(), 0)",
            "kill all": "import os\nos.kill(-1, 0)",
            "pidfd": "import os, signal\nsignal.pidfd_send_signal(os.open('/proc/%d' % os.getppid(), os.O_RDONLY), 0)",
            "socket": "import socket\nsocket.socket(socket.AF_UNIX)",
            "ctypes execve": "import ctypes\nprint(ctypes.CDLL(None).execv(b'/bin/true', None))",
        }
        for what, code in probes.items():
            obs = sb.run(code)
            assert "PermissionError" in obs or obs.strip() in ("32512", "-1"), (what, obs)
        _need(sb, "landlock")
        for what, code in {
            "write /tmp": f"open({evil!r}, 'w')",
            "overwrite meta.json": f"open({str(meta)!r}, 'w').write('pwned')",
            "read meta.json": f"print(open({str(meta)!r}).read())",
        }.items():
            obs = sb.run(code)
            assert "PermissionError" in obs, (what, obs)
        assert sb.run("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())") == "ok\n"
    assert meta.read_text() == '{"step": 3}' and not os.path.exists(evil)


def test_concurrent_sandboxes_cannot_reach_each_other():
    """A sibling's files (by path or through an fd-relative open) and its process (kill, or a pidfd made from its
    /proc directory) are out of reach, with or without the audit hook."""
    with Sandbox(FAST) as victim:
        victim.run("open('secret.txt', 'w').write('s3cret')")
        pid = victim._res.child.proc.pid
        for hook in (True, False):
            with Sandbox(FAST, audit_hook=hook) as attacker:
                _need(attacker, "seccomp")
                if victim.uid is None:
                    _need(attacker, "landlock")
                reads = [
                    f"print(open({victim.workdir + '/secret.txt'!r}).read())",
                    f"import os\nd = os.open({victim.workdir!r}, os.O_RDONLY)\n"
                    "print(os.read(os.open('secret.txt', os.O_RDONLY, dir_fd=d), 99))",
                    f"open({victim.workdir + '/planted.txt'!r}, 'w')",
                ]
                for code in reads:
                    obs = attacker.run(code)
                    assert "s3cret" not in obs and "PermissionError" in obs, (hook, code, obs)
                for code in [
                    f"import os\nos.kill({pid}, 9)",
                    f"import os, signal\nproc = os.open('/proc', os.O_RDONLY)\n"
                    f"signal.pidfd_send_signal(os.open('{pid}', os.O_RDONLY, dir_fd=proc), 9)",
                ]:
                    obs = attacker.run(code)
                    assert "PermissionError" in obs, (hook, code, obs)
            assert victim.run("print(open('secret.txt').read())") == "s3cret\n"
        assert not os.path.exists(os.path.join(victim.workdir, "planted.txt"))
        assert victim._res.child.proc.pid == pid and victim.restarts == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="own uids need a root trainer")
@pytest.mark.filterwarnings("ignore:sandbox. agent code is weakly contained")
def test_each_sandbox_has_its_own_uid_and_close_kills_everything_of_it():
    """Without seccomp a process can escape the process group (setsid); close() kills every process of the
    sandbox's own uid, so nothing outlives it."""
    with Sandbox(FAST) as a, Sandbox(FAST) as b:
        assert a.uid is not None and b.uid is not None and a.uid != b.uid
        assert f"uid:{a.uid}" in a.isolation and a.run("import os\nprint(os.getuid())") == f"{a.uid}\n"
        assert stat.S_IMODE(os.stat(a.workdir).st_mode) == 0o700 and os.stat(a.workdir).st_uid == a.uid
    sb = Sandbox(FAST, audit_hook=False, confine=False)
    uid = sb.uid
    assert sb.run("import os\nprint(os.system('setsid sleep 60 > /dev/null 2>&1 &'))") == "0\n"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _processes_of(uid):
        time.sleep(0.05)
    assert _processes_of(uid), "the escaped process did not start"
    sb.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _processes_of(uid):
        time.sleep(0.05)
    assert _processes_of(uid) == []


def _processes_of(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
            state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
            if int(uids[0]) == uid and state != "Z":
                out.append(int(entry))
    return out


def test_a_killed_trainer_leaves_no_sandbox_process_and_its_workdir_is_swept(tmp_path):
    """SIGKILL of the trainer: its sandbox child dies with it (PR_SET_PDEATHSIG); the working directory it leaves is
    deleted by the next Sandbox on the host (stale: named after a dead pid)."""
    script = textwrap.dedent("""
        import sys, time
        from rltldr_jax.envs.sandbox import Sandbox, SandboxLimits
        sb = Sandbox(SandboxLimits(wall_s=30))
        sb.run("open('x.txt', 'w').write('x')")
        print(sb._res.child.proc.pid, sb.workdir, flush=True)
        time.sleep(60)
    """)
    trainer = subprocess.Popen(
        [shutil.which("python") or "python3", "-c", script], stdout=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    try:
        child_pid, workdir = trainer.stdout.readline().split()
    finally:
        trainer.kill()
        trainer.wait(10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child_pid}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child_pid}"), "the sandbox child outlived its killed trainer"
    assert os.path.isdir(workdir)
    from rltldr_jax.envs import sandbox as sandbox_module

    alive = Path(os.path.dirname(workdir)) / f"rltldr_sandbox_{os.getpid()}_mine"
    alive.mkdir()
    try:
        sandbox_module._remove_stale_workdirs.cache_clear()
        with Sandbox(FAST):
            pass
        assert not os.path.exists(workdir) and alive.is_dir()
    finally:
        shutil.rmtree(alive)


def test_call_returns_a_string_and_restarts_after_a_timeout():
    preamble = "def echo(s):\n    print('dropped')\n    return s.upper()\ndef spin(s):\n    while True:\n        pass\n"
    with Sandbox(FAST, preamble=preamble) as sb:
        sb.run("kept = 1")
        result = sb.call("echo", "abc", 1.0)
        assert (result.status, result.value, result.message) == ("ok", "ABC", "")
        assert sb.call("missing", "", 1.0).status == "error" and "KeyError" in sb.call("missing", "", 1.0).message
        sb.run("def number(s):\n    return 5")
        assert sb.call("number", "", 1.0).message == "number() returned int, not str\n"
        start = time.monotonic()
        result = sb.call("spin", "", 0.5)
        assert time.monotonic() - start < 3 and result.status == "timeout" and result.value is None
        assert result.message.startswith("Execution") and RESTARTED in result.message
        assert sb.restarts == 1 and "NameError" in sb.run("kept") and sb.call("echo", "x", 1.0).value == "X"
