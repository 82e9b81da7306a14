"""The AppWorld adapter (rltldr_jax/envs/appworld.py) against the real `appworld` package in its own venv.

Tests that need the venv (scripts/setup_appworld.sh; $APPWORLD_PYTHON or ~/.venvs/appworld) skip without it; tests
that need the task data (only downloadable from AWS S3) skip without $APPWORLD_ROOT/data.
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import textwrap
import urllib.request

import pytest

from rltldr_jax.envs.appworld import (
    AppWorldDataMissing,
    AppWorldEnv,
    AppWorldError,
    AppWorldNotInstalled,
    AppWorldServer,
    AppWorldServerError,
    appworld_python,
    appworld_root,
    load_tasks,
    verdict_from_tracker_dict,
)
from rltldr_jax.envs.base import Task

PYTHON = appworld_python()
HAVE_VENV = PYTHON.is_file() and os.access(PYTHON, os.X_OK)
needs_venv = pytest.mark.skipif(
    not HAVE_VENV,
    reason=f"AppWorld venv not found at {PYTHON}: run `bash scripts/setup_appworld.sh` or set APPWORLD_PYTHON",
)
HAVE_DATA = (appworld_root() / "data" / "datasets" / "train.txt").is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="AppWorld task data is not downloadable on this machine (S3)")


def _task(task_id: str) -> Task:
    return Task(task_id=task_id, goal="", env="appworld", split="train", spec={"task_id": task_id})


@pytest.fixture
def empty_root(tmp_path):
    """An AppWorld root with an empty data/ (so the server starts, but no task exists)."""
    (tmp_path / "data" / "tasks").mkdir(parents=True)
    return tmp_path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("awroot")
    (root / "data" / "tasks").mkdir(parents=True)
    with AppWorldServer(root=root) as srv:
        yield srv


# -- no venv needed ----------------------------------------------------------------------------------------------
def test_main_venv_has_no_appworld():
    """AppWorld (pydantic<2) must not be importable here: it only runs in its own venv."""
    assert importlib.util.find_spec("appworld") is None
    if importlib.util.find_spec("pydantic") is not None:
        assert int(importlib.metadata.version("pydantic").split(".")[0]) >= 2


def test_missing_venv_says_how_to_create_it(tmp_path):
    with pytest.raises(AppWorldNotInstalled, match="setup_appworld.sh"):
        AppWorldServer(python=tmp_path / "nope" / "python", root=tmp_path)
    env = AppWorldEnv(python=tmp_path / "nope" / "python", root=tmp_path)
    with pytest.raises(AppWorldNotInstalled, match="APPWORLD_PYTHON"):
        env.reset(_task("abc_1"))
    env.close()


def test_missing_data_root_names_s3(tmp_path):
    executable = tmp_path / "python"  # any executable passes the venv check; the data check comes next
    executable.write_text("#!/bin/sh\nexit 1\n")
    executable.chmod(0o755)
    with pytest.raises(AppWorldDataMissing, match="S3") as info:
        AppWorldServer(python=executable, root=tmp_path)
    assert str(tmp_path / "data") in str(info.value)


def test_server_start_failure_shows_log_tail(empty_root, tmp_path):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\necho 'boom: the server could not start' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(AppWorldServerError, match="boom: the server could not start") as info:
        AppWorldServer(python=fake, root=empty_root, startup_timeout=20)
    assert "exited with code 3" in str(info.value)


def test_load_tasks_errors_without_data(tmp_path):
    with pytest.raises(AppWorldDataMissing, match="appworld download data") as info:
        load_tasks("train", root=tmp_path)
    assert str(tmp_path / "data" / "datasets" / "train.txt") in str(info.value)
    with pytest.raises(ValueError, match="unknown AppWorld split"):
        load_tasks("training", root=tmp_path)


def test_load_tasks_reads_the_split_files(tmp_path):
    """The files' layout as AppWorld's load_task_ids/Task.load read it (content made up here)."""
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    (data / "datasets" / "train.txt").write_text("aaa_1\nbbb_2:tag\n\n")
    (data / "datasets" / "dev.txt").write_text("ccc_1\n")
    for task_id in ("aaa_1", "bbb_2", "ccc_1"):
        (data / "tasks" / task_id).mkdir(parents=True)
        specs = {"instruction": f"do {task_id}", "db_version": "x"}
        (data / "tasks" / task_id / "specs.json").write_text(json.dumps(specs))
    tasks = load_tasks("train+dev", root=tmp_path)
    assert [(t.task_id, t.split, t.goal, dict(t.spec)) for t in tasks] == [
        ("aaa_1", "train", "do aaa_1", {"task_id": "aaa_1"}),
        ("bbb_2", "train", "do bbb_2", {"task_id": "bbb_2"}),
        ("ccc_1", "dev", "do ccc_1", {"task_id": "ccc_1"}),
    ]
    assert all(t.env == "appworld" for t in tasks)


def test_verdict_from_dict_handles_all_pass():
    passes = [{"requirement": "r1", "label": None}]
    verdict = verdict_from_tracker_dict(
        {"success": True, "difficulty": 1, "num_tests": 1, "passes": passes, "failures": []}
    )
    assert verdict.success and verdict.num_passed == verdict.num_tests == 1 and verdict.failures == ()
    assert verdict.report.rstrip().endswith("None")


# -- the AppWorld venv -----------------------------------------------------------------------------------------
@needs_venv
def test_appworld_venv_is_the_pydantic1_world():
    code = "import importlib.metadata as m, appworld.apps.api_docs; print(m.version('appworld'), m.version('pydantic'))"
    out = subprocess.run(
        [str(PYTHON), "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[0] == "0.1.3.post1" and out[1].startswith("1.")


@needs_venv
def test_server_answers_and_has_the_endpoints_used(server):
    with urllib.request.urlopen(server.url + "/", timeout=10) as r:
        assert "Welcome to AppWorld Server" in json.loads(r.read())["message"]
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=10) as r:
        spec = json.loads(r.read())
    for path in ("/initialize", "/execute", "/task_completed", "/evaluate", "/close"):
        assert "post" in spec["paths"][path], path
    schemas = json.dumps(spec["components"]["schemas"])
    for field in ("task_id", "experiment_name", "code", "suppress_errors", "report"):
        assert f'"{field}"' in schemas, field


@needs_venv
def test_reset_without_task_data_names_the_missing_task(empty_root):
    env = AppWorldEnv(root=empty_root)
    with pytest.raises(AppWorldDataMissing) as info:
        env.reset(_task("abc_1"))
    message = str(info.value)
    assert str(empty_root / "data" / "tasks" / "abc_1") in message and "S3" in message
    assert "Exception: The task directory" in message  # the package's own error, from the server log
    with pytest.raises(AppWorldError, match="before reset"):
        env.step("print(1)")
    with pytest.raises(AppWorldError, match="before reset"):
        env.verify()
    proc = env.server.proc
    proc.kill()  # a dead server is replaced at the next reset
    proc.wait()
    with pytest.raises(AppWorldDataMissing):
        env.reset(_task("abc_1"))
    assert env.server.alive() and env.server.proc.pid != proc.pid
    proc = env.server.proc
    env.close()
    assert proc.poll() is not None and env.server is None


@needs_venv
def test_external_server_url(server):
    env = AppWorldEnv(server_url=server.url)
    with pytest.raises(AppWorldServerError, match="HTTP 500") as info:
        env.reset(_task("abc_2"))
    assert server.url in str(info.value)
    env.close()
    assert server.alive()  # an external server is not ours to stop
    with pytest.raises(AppWorldServerError, match="unreachable"):
        AppWorldEnv(server_url="http://127.0.0.1:9", request_timeout=5).reset(_task("abc_3"))


_EVALUATION = '''
def evaluate(test, predicted_answer, ground_truth_answer):
    with test("""
        assert no model changes.
    """):
        test.case(1, "==", 1)
    with test("""
        assert answers match.
    """):
        test.case(ground_truth_answer, "==", predicted_answer, normalize=float, tolerance=0.51)
    with test("""
        assert the playlist holds the songs.
    """):
        test.case([1, 2], "==", [1, 3])
'''

_MAKE_TRACKER = """
import json, sys
sys.path.insert(0, ".")
from appworld.evaluator import TestTracker
import evaluation
requirements = ["assert no model changes.", "assert answers match.", "assert the playlist holds the songs."]
tracker = TestTracker(test_data=[{"requirement": r, "label": "no_op_fail"} for r in requirements], difficulty=2)
evaluation.evaluate(tracker, 1538.0, 1592.0)
print(json.dumps({"dict": tracker.to_dict(stats_only=False), "report": tracker.report(print_it=False, colorize=False)}))
"""


def _normalise(report: str) -> str:
    """Rule lines to their titles, whitespace dropped (rich wraps long lines at 80 columns)."""
    lines = [line.strip("─ ") if "───" in line else line for line in report.splitlines()]
    return "".join("".join(lines).split())


@needs_venv
def test_verdict_from_a_real_test_tracker(tmp_path):
    (tmp_path / "evaluation.py").write_text(textwrap.dedent(_EVALUATION))
    out = subprocess.run(
        [str(PYTHON), "-c", _MAKE_TRACKER],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    real = json.loads(out.stdout)
    verdict = verdict_from_tracker_dict(real["dict"])
    assert not verdict.success
    assert (verdict.num_passed, verdict.num_tests) == (1, 3)
    assert verdict.failures == ("assert answers match.", "assert the playlist holds the songs.")
    assert _normalise(verdict.report) == _normalise(real["report"])  # same content as TestTracker.report()
    assert "AssertionError:  1592.0 ± 0.51 == 1538.0 ± 0.51" in verdict.report
    short = verdict_from_tracker_dict(real["dict"], include_traces=False)
    assert "AssertionError" not in short.report and "assert answers match." in short.report
    assert short.failures == verdict.failures


# -- the task data (S3 only) -----------------------------------------------------------------------------------
@needs_data
def test_real_splits():
    sizes = {split: len(load_tasks(split)) for split in ("train", "dev", "test_normal", "test_challenge")}
    assert sizes == {"train": 90, "dev": 57, "test_normal": 168, "test_challenge": 417}


@needs_venv
@needs_data
def test_real_attempt():
    task = load_tasks("dev")[0]
    with AppWorldEnv() as env:
        goal = env.reset(task)
        assert goal == task.goal
        first = env.step("print(apis.api_docs.show_app_descriptions())")
        assert not first.done and "supervisor" in first.observation
        bad = env.step("1/0")
        assert bad.observation.startswith("Execution failed.") and not bad.done
        end = env.step("apis.supervisor.complete_task(answer=None)")
        assert end.done
        verdict = env.verify()
        assert verdict.num_tests > 0 and verdict.num_passed <= verdict.num_tests
        assert len(verdict.failures) == verdict.num_tests - verdict.num_passed
        assert "Overall Stats" in verdict.report
