"""The real AppWorld (Trivedi et al., 2024) behind the Env protocol, run in its own virtualenv.

PyPI `appworld` pins pydantic<2, so it cannot live in the main environment. Everything AppWorld runs in a separate
virtualenv (made by `scripts/setup_appworld.sh`; found through $APPWORLD_PYTHON or ~/.venvs/appworld/bin/python):
`AppWorldServer` starts the package's own HTTP environment server (`appworld.serve.environment:app`, the app behind
`appworld serve environment`) with that venv's python, bound to 127.0.0.1, and `AppWorldEnv` talks to it with the
standard library only (urllib + json). An already running server can be used instead (`server_url=`).

Server endpoints used (all JSON; every POST names the server's active `task_id`; answers are `{"output": ...}`):
  GET  /                 liveness ("Welcome to AppWorld Server!")
  POST /initialize       {task_id, experiment_name, ...AppWorldInitDefaults fields}
                         -> {task_id, instruction, supervisor, datetime}
  POST /execute          {task_id, code} -> observation text
  POST /task_completed   {task_id} -> bool (the supervisor's active task has status success/fail)
  POST /evaluate         {task_id, suppress_errors, report: false} -> TestTracker.to_dict(): {success, difficulty,
                         num_tests, passes: [{requirement, label}], failures: [{requirement, trace, label}]}
  POST /close            {task_id}
The server holds ONE world at a time, so each AppWorldEnv needs its own server (one process, ~2 s to start).

Task data (tasks, databases, ground truth) is not in the package: it comes only from AWS S3 (`appworld download
data`) and must be placed at $APPWORLD_ROOT/data, default ~/appworld/data (see `scripts/setup_appworld.sh`).
Never commit it or the decrypted apps: AppWorld's licence allows redistribution only in encrypted form.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from rltldr_jax.envs.base import StepResult, Task, Verdict
from rltldr_jax.envs.reports import requirement_failure
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import API_PROMPT, EnvSpec, register, source_fingerprint

SPLITS = ("train", "dev", "test_normal", "test_challenge")
DEFAULT_VENV = Path.home() / ".venvs" / "appworld"
DEFAULT_ROOT = Path.home() / "appworld"  # outside the repository: the decrypted data must never be committed
SETUP_HINT = (
    "create it with `bash scripts/setup_appworld.sh` (or set APPWORLD_PYTHON to the python of a venv that has "
    "appworld==0.1.3.post1 installed and `appworld install` run)"
)


class AppWorldError(RuntimeError):
    """Any failure of the AppWorld adapter."""


class AppWorldNotInstalled(AppWorldError):
    """The separate AppWorld virtualenv is missing or incomplete."""


class AppWorldDataMissing(AppWorldError):
    """The AppWorld task data is not at $APPWORLD_ROOT/data."""


class AppWorldServerError(AppWorldError):
    """The AppWorld server failed to start or a call to it failed."""


def appworld_python() -> Path:
    """The AppWorld venv's python: $APPWORLD_PYTHON, else ~/.venvs/appworld/bin/python (may not exist)."""
    return Path(os.environ.get("APPWORLD_PYTHON") or DEFAULT_VENV / "bin" / "python")


def appworld_root(root: str | os.PathLike | None = None) -> Path:
    """The AppWorld root (data at <root>/data, outputs at <root>/experiments/outputs): `root`, else $APPWORLD_ROOT,
    else ~/appworld (AppWorld itself defaults to the current folder; a fixed folder keeps the data out of git)."""
    return Path(root or os.environ.get("APPWORLD_ROOT") or DEFAULT_ROOT).expanduser().absolute()


def data_missing_message(root: Path, missing: Path | str) -> str:
    return (
        f"AppWorld task data is missing: {missing} does not exist (AppWorld root {root}; data expected under "
        f"{root / 'data'}: datasets/<split>.txt, tasks/<task_id>/, base_dbs/, api_docs/). The data is not in the pip "
        "package: `appworld download data` fetches it from AWS S3 and so needs internet access to S3. On a machine "
        "that has it, run `appworld download data --root DIR` (in the AppWorld venv) and copy DIR/data to "
        f"{root / 'data'} (or point APPWORLD_ROOT at a folder holding data/)."
    )


def check_python(python: str | os.PathLike | None = None) -> Path:
    """The AppWorld venv's python, checked to exist; raises AppWorldNotInstalled with how to create it."""
    path = Path(python) if python is not None else appworld_python()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AppWorldNotInstalled(f"AppWorld venv python not found at {path}: {SETUP_HINT}")
    return path


def load_tasks(split: str | Sequence[str], root: str | os.PathLike | None = None) -> list[Task]:
    """The tasks of an AppWorld split (or several, e.g. "train+dev+test_normal"), read from
    <root>/data/datasets/<split>.txt, goals from <root>/data/tasks/<id>/specs.json (plain JSON: no venv needed)."""
    splits = split.split("+") if isinstance(split, str) else list(split)
    base = appworld_root(root)
    tasks = []
    for name in splits:
        if name not in SPLITS:
            raise ValueError(f"unknown AppWorld split {name!r}; known: {', '.join(SPLITS)}")
        listing = base / "data" / "datasets" / f"{name}.txt"
        if not listing.is_file():
            raise AppWorldDataMissing(data_missing_message(base, listing))
        ids = [line.split(":")[0].strip() for line in listing.read_text().splitlines() if line.strip()]
        for task_id in ids:
            specs = base / "data" / "tasks" / task_id / "specs.json"
            if not specs.is_file():
                raise AppWorldDataMissing(data_missing_message(base, specs))
            goal = json.loads(specs.read_text())["instruction"]
            tasks.append(Task(task_id=task_id, goal=goal, env="appworld", split=name, spec={"task_id": task_id}))
    return tasks


# The server process: the package's FastAPI app under uvicorn, bound to localhost (the CLI's `appworld serve
# environment` binds 0.0.0.0, and its /execute runs arbitrary code). The apps must have been decrypted.
_SERVER_MAIN = """
import sys
try:
    import appworld.apps.api_docs  # noqa: F401
except Exception as exc:
    sys.exit(f"appworld is installed but its apps are not unpacked ({exc!r}): run `appworld install` in its venv")
import uvicorn
from appworld.serve.environment import app
uvicorn.run(app, host=sys.argv[1], port=int(sys.argv[2]), log_level="warning")
"""


_MISSING_RE = re.compile(r"Exception: The [\w ]+ \((/\S+)\) doesn't exist")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppWorldServer:
    """An AppWorld environment server in the AppWorld venv, owned by this object (a subprocess in its own process
    group, its log in a temporary file).

    Args:
      python: the AppWorld venv's python (default `appworld_python()`).
      root: the AppWorld root (default `appworld_root()`); <root>/data must exist.
      port: default a free port.
      startup_timeout: seconds to wait for GET / to answer.
    """

    def __init__(self, python=None, root=None, *, port: int | None = None, startup_timeout: float = 60.0):
        self.python = check_python(python)
        self.root = appworld_root(root)
        if not (self.root / "data").is_dir():
            raise AppWorldDataMissing(data_missing_message(self.root, self.root / "data"))
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._logdir = tempfile.mkdtemp(prefix="appworld-server-")
        self.log_path = Path(self._logdir) / "server.log"
        env = dict(os.environ, APPWORLD_ROOT=str(self.root), PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # nothing of the main environment may leak into the AppWorld venv
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.python), "-c", _SERVER_MAIN, "127.0.0.1", str(self.port)],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(startup_timeout)
        except BaseException:
            self.close(keep_log=True)
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AppWorldServerError(
                    f"AppWorld server exited with code {self.proc.returncode} while starting "
                    f"({self.python}); log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AppWorldServerError(
                    f"AppWorld server at {self.url} did not answer within {timeout:.0f} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def settle_log(self, timeout: float = 2.0) -> None:
        """Waits (briefly) until the log stops growing: uvicorn logs a request's traceback after sending the 500."""
        deadline, size = time.monotonic() + timeout, -1
        while time.monotonic() < deadline:
            new = self.log_size()
            if new == size:
                return
            size = new
            time.sleep(0.15)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_tail(self, num_lines: int = 30, since: int = 0) -> str:
        """The last lines of the server's log (from byte `since` on)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(lines[-num_lines:]) or "(nothing new in the server log)"

    def close(self, keep_log: bool = False) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if not keep_log:
            shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _render_rule(title: str) -> str:
    return f" {title} ".center(80, "─")


def verdict_from_tracker_dict(tracker: Mapping[str, Any], *, include_traces: bool = True) -> Verdict:
    """A Verdict from AppWorld's `TestTracker.to_dict(stats_only=False)`; the report is laid out like
    `TestTracker.report(colorize=False)` (stats, passed requirements, failed requirements each with its trace).

    The traces are AppWorld's own failure messages; they can show expected values from the ground truth (e.g.
    "AssertionError: 1592.0 == 1538.0"). `include_traces=False` keeps only the requirement texts."""
    passes = list(tracker.get("passes", []))
    failures = list(tracker.get("failures", []))
    num_tests = int(tracker.get("num_tests", len(passes) + len(failures)))
    lines = [
        _render_rule("Overall Stats"),
        f"Num Passed Tests : {len(passes)}",
        f"Num Failed Tests : {len(failures)}",
        f"Num Total  Tests : {num_tests}",
        _render_rule("Passes"),
    ]
    for p in passes:
        lines += [">> Passed Requirement", p["requirement"]]
    if not passes:
        lines.append("None")
    lines.append(_render_rule("Fails"))
    for f in failures:
        lines += [">> Failed Requirement", f["requirement"]]
        if include_traces and f.get("trace"):
            lines.append(f["trace"])
    if not failures:
        lines.append("None")
    report = "\n".join(line.rstrip() for line in "\n".join(lines).splitlines())
    success = bool(tracker.get("success", len(passes) == num_tests))
    return Verdict(
        success=success,
        report=report,
        num_passed=len(passes),
        num_tests=num_tests,
        failures=tuple(f["requirement"] for f in failures),
    )


class AppWorldEnv:
    """The Env protocol on a real AppWorld world (one attempt at a time).

    Args:
      server_url: an AppWorld environment server already running (e.g. `appworld serve environment` in the AppWorld
        venv); None starts an own `AppWorldServer` at the first reset (restarted by a later reset if it died; stopped
        by close).
      python, root: for the own server (defaults: $APPWORLD_PYTHON or ~/.venvs/appworld; $APPWORLD_ROOT or ~/appworld).
      experiment_name: AppWorld writes each attempt to <root>/experiments/outputs/<experiment_name>/tasks/<id>/ and
        evaluates from there, so concurrent attempts at one task must not share it: a unique suffix per instance
        is added (`unique_experiment=False` turns that off). `Task.spec["experiment_name"]` overrides the base name.
      keep_outputs: with an own server and unique experiment names, close() deletes this instance's output folders
        unless True (else they pile up: one per instance).
      init_kwargs: further `AppWorldInitDefaults` fields for /initialize (e.g. max_interactions, timeout_seconds).
      include_traces: keep AppWorld's failure traces in the Verdict report (see verdict_from_tracker_dict).
      request_timeout: HTTP timeout of each call, seconds (AppWorld's own execute timeout defaults to 100 s).
    """

    def __init__(
        self,
        server_url: str | None = None,
        *,
        python: str | os.PathLike | None = None,
        root: str | os.PathLike | None = None,
        experiment_name: str = "rltldr",
        unique_experiment: bool = True,
        init_kwargs: Mapping[str, Any] | None = None,
        include_traces: bool = True,
        keep_outputs: bool = False,
        request_timeout: float = 300.0,
        startup_timeout: float = 60.0,
    ):
        self.server_url = server_url.rstrip("/") if server_url else None
        self.python, self.root = python, root
        self.experiment_name = experiment_name
        self.suffix = f"__{os.getpid()}_{uuid.uuid4().hex[:8]}" if unique_experiment else ""
        self.init_kwargs = dict(init_kwargs or {})
        self.include_traces = include_traces
        self.keep_outputs = keep_outputs
        self.experiments: set[str] = set()  # experiment names this instance used
        self.request_timeout = request_timeout
        self.startup_timeout = startup_timeout
        self.server: AppWorldServer | None = None
        self.task_id: str | None = None  # the server's active world
        self.done = False

    # -- HTTP ------------------------------------------------------------------------------------------------
    def _ensure_server(self) -> None:
        if self.server_url or (self.server is not None and self.server.alive()):
            return
        if self.server is not None:
            self.server.close()
            self.server = None
        self.server = AppWorldServer(self.python, self.root, startup_timeout=self.startup_timeout)

    def _url(self) -> str:
        if self.server_url:
            return self.server_url
        if self.server is None:
            raise AppWorldError("no AppWorld server: call reset() first")
        return self.server.url

    def _server_context(self, since: int = 0) -> str:
        if self.server is not None:
            self.server.settle_log()
            state = "running" if self.server.alive() else f"exited with code {self.server.proc.returncode}"
            return f"\nAppWorld server ({state}) log tail:\n{self.server.log_tail(since=since)}"
        return f"\n(the traceback is in the log of the AppWorld server at {self.server_url})"

    def _call(self, method: str, **payload: Any) -> Any:
        url = self._url()
        mark = self.server.log_size() if self.server is not None else 0
        request = urllib.request.Request(
            f"{url}/{method}", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return json.loads(response.read())["output"]
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")[:2000]
            context = self._server_context(since=mark)
            message = f"AppWorld call /{method} failed (HTTP {exc.code}): {body}{context}"
            missing = _MISSING_RE.findall(context)
            if missing:  # Task.load's "The task directory (...) doesn't exist." and the like
                root = self.server.root if self.server is not None else appworld_root(self.root)
                raise AppWorldDataMissing(data_missing_message(root, missing[-1]) + "\n" + message) from None
            raise AppWorldServerError(message) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise AppWorldServerError(
                f"AppWorld server at {url} unreachable on /{method}: {exc}{self._server_context(since=mark)}"
            ) from None

    def _require_task(self, what: str) -> str:
        if self.task_id is None:
            raise AppWorldError(f"{what}() before reset(): no AppWorld task is initialized")
        return self.task_id

    # -- Env protocol ----------------------------------------------------------------------------------------
    def reset(self, task: Task) -> str:
        """Initializes the task's world (task id from `task.spec["task_id"]`, else `task.task_id`); returns
        AppWorld's instruction for it."""
        self._close_world()
        self._ensure_server()
        task_id = str(task.spec.get("task_id", task.task_id))
        experiment = str(task.spec.get("experiment_name", self.experiment_name)) + self.suffix
        self.experiments.add(experiment)
        output = self._call("initialize", task_id=task_id, experiment_name=experiment, **self.init_kwargs)
        self.task_id, self.done = task_id, False
        return output["instruction"]

    def step(self, code: str) -> StepResult:
        """Runs one code block in the world; `done` once the supervisor's task is marked complete."""
        task_id = self._require_task("step")
        observation = self._call("execute", task_id=task_id, code=code)
        self.done = bool(self._call("task_completed", task_id=task_id))
        return StepResult(observation=str(observation), done=self.done)

    def verify(self) -> Verdict:
        """Evaluates the world against the task's tests (AppWorld's evaluate, errors inside tests count as failures)."""
        task_id = self._require_task("verify")
        tracker = self._call("evaluate", task_id=task_id, suppress_errors=True, report=False)
        return verdict_from_tracker_dict(tracker, include_traces=self.include_traces)

    def _close_world(self) -> None:
        if self.task_id is not None:
            task_id, self.task_id = self.task_id, None
            try:
                self._call("close", task_id=task_id)
            except AppWorldError:
                pass

    def close(self) -> None:
        """Closes the world and stops the own server (an external one keeps running)."""
        if self.server is not None and not self.server.alive():
            self.task_id = None
        self._close_world()
        if self.server is not None:
            if self.suffix and not self.keep_outputs:
                for name in self.experiments:
                    shutil.rmtree(self.server.root / "experiments" / "outputs" / name, ignore_errors=True)
                self.experiments.clear()
            self.server.close()
            self.server = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Our split names → AppWorld's (the paper trains on train+dev+test_normal filtered to hard tasks, §4.1, and
# evaluates on test_challenge).
OUR_SPLITS = {"train": "train+dev+test_normal", "eval": "test_challenge"}


def _make_env(limits: SandboxLimits) -> AppWorldEnv:
    return AppWorldEnv(init_kwargs={"timeout_seconds": int(limits.wall_s)})


#: AppWorld (§4.1): an agent acting through the apps' APIs; the AppWorld package is imported only by its server.
SPEC = register(
    EnvSpec(
        name="appworld",
        load_tasks=lambda split, seed: load_tasks(OUR_SPLITS.get(split, split).split("+")),  # fixed data
        make_env=_make_env,
        task_prompt=API_PROMPT,
        writer_prompt="device",
        rule_failure=requirement_failure,
        world_fingerprint=lambda: source_fingerprint(__name__),
    )
)
