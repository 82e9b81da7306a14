"""SIGTERM / SIGINT (train/stopping.py, rltldr_jax/cli/common.py's `run_launcher`): the first signal is deferred to a
safe point where asked, a second one (or one outside) raises at once, never lost where Python drops exceptions, and a
launcher says so in one line with exit status 128 + the signal's number. The training loop's safe points:
tests/test_train_loop.py."""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from helpers import TINY_RUN

from rltldr_jax.train.stopping import Interrupted, RunStopped, StopSignals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_first_signal_waits_for_a_safe_point_a_second_one_stops_at_once(caplog):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(Interrupted) as stopped:
        with StopSignals(defer=True) as signals:
            signal.raise_signal(signal.SIGTERM)
            assert signals.requested == signal.SIGTERM  # recorded, nothing raised: the work goes on
            assert "SIGTERM received: stopping at the next safe point" in caplog.text
            signal.raise_signal(signal.SIGINT)
            pytest.fail("a second signal must stop at once")
    assert type(stopped.value) is Interrupted and stopped.value.signum == signal.SIGINT
    assert stopped.value.exit_status == 130 and str(stopped.value) == "interrupted by SIGINT"
    assert isinstance(stopped.value, KeyboardInterrupt)  # `except Exception` does not swallow it
    assert {s: signal.getsignal(s) for s in before} == before  # the previous handlers are back
    with pytest.raises(Interrupted) as at_once, StopSignals(defer=False):
        signal.raise_signal(signal.SIGTERM)
    assert at_once.value.exit_status == 143


def test_a_signal_raised_where_python_drops_exceptions_is_raised_again():
    """An exception raised by a signal handler inside a `__del__` (or a garbage-collector callback, such as JAX's)
    cannot propagate: Python prints "Exception ignored" and goes on. The signal is raised again after it."""

    class SignalledWhileDeleted:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside __del__

    reached = []
    with pytest.raises(Interrupted, match="interrupted by SIGTERM"), StopSignals(defer=False):
        SignalledWhileDeleted()
        gc.collect()
        for _ in range(1000):
            time.sleep(0.001)
        reached.append("went on")
    assert reached == []


def test_ignored_signals_stay_ignored_and_other_threads_install_nothing():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals(defer=False):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)  # ignored, as the process asked
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_stop_crosses_process_boundaries_intact():
    """A run in a worker process (the replication driver's) hands its stop back to the parent unchanged."""
    stop = pickle.loads(pickle.dumps(RunStopped(signal.SIGTERM, "stopped by SIGTERM at phase 3; checkpoint saved")))
    assert type(stop) is RunStopped and stop.signum == signal.SIGTERM and stop.exit_status == 143
    assert str(stop) == "stopped by SIGTERM at phase 3; checkpoint saved"


def test_ctrl_c_during_start_up_is_one_line(tmp_path):
    """Ctrl-C while the trainer is being built (engines, compilation): "interrupted by SIGINT; resume with --resume"
    (valid with or without a checkpoint), exit status 130, no traceback (was: KeyboardInterrupt tracebacks, or the
    signal lost in JAX's garbage-collector callback)."""
    workdir = tmp_path / "run"
    flags = [f"--config.{k}={v}" for k, v in TINY_RUN.items()]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), "--config=configs/sapi.py:tiny", *flags]
        + [f"--config.workdir={workdir}", "--config.train.max_phases=1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (workdir / ".lock").exists():  # the Trainer has claimed the workdir: it is being built
            assert child.poll() is None and time.time() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGINT; resume with --resume" and "Traceback" not in err, err
    assert not (workdir / "checkpoints").exists() or os.listdir(workdir / "checkpoints") == []


ISOLATED_GRID = """
import functools, os, signal, sys, time
from rltldr_jax.cli.common import run_launcher
from rltldr_jax.replication.driver import Task, isolated, run_tasks
from rltldr_jax.train.stopping import RunStopped, StopSignals


def phases(report):
    with StopSignals(defer=True) as signals:
        for phase in range(600):
            with open(report, "a") as f:
                f.write(f"{os.getpid()} {phase}\\n")
            time.sleep(0.1)
            if signals.requested:
                raise RunStopped(signals.requested, f"stopped by signal {signals.requested} after phase {phase}")
    return "finished"


def main(argv):
    jobs = int(os.environ["GRID_JOBS"])
    if jobs == 0:  # the piece in the main thread
        isolated(phases, sys.argv[1])
    else:  # two pieces at once, from run_tasks' threads
        piece = functools.partial(isolated, phases, sys.argv[1])
        run_tasks([Task("a", piece), Task("b", piece)], jobs=jobs)


if __name__ == "__main__":
    sys.argv = sys.argv[:2]
    run_launcher(main)
"""


@pytest.mark.parametrize("whole_group,jobs", [(False, 0), (True, 0), (False, 2), (True, 2)])
def test_a_launchers_signal_reaches_the_run_in_its_worker_process(tmp_path, whole_group, jobs):
    """The replication runs each Trainer in a worker process. SIGTERM to the launcher (Kubernetes' PID 1, `kill
    <pid>`) is passed on, so the run stops at its next safe point and the launcher ends with the run's own line (it
    used to wait for the whole run); a signal to the launcher's process group (Ctrl-C in a terminal) reaches the
    worker once too (it leads a group of its own), so it stops at a safe point, not at once. With two pieces at once
    (`run_tasks`, jobs=2: signals reach the main thread, the workers run from others) both workers stop so."""
    script, report = tmp_path / "grid.py", tmp_path / "phases.txt"
    script.write_text(ISOLATED_GRID)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, GRID_JOBS=str(jobs))
    workers = max(jobs, 1)
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(report)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not report.exists() or not _each_wrote(report.read_text(), workers, 3):
            assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
            time.sleep(0.05)
        start = time.time()
        if whole_group:
            os.killpg(launcher.pid, signal.SIGTERM)
        else:
            launcher.send_signal(signal.SIGTERM)
        err = launcher.communicate(timeout=30)[1]
        took = time.time() - start
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    assert launcher.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"stopped by signal {int(signal.SIGTERM)} after phase ") and "Traceback" not in err, err
    assert took < 10
    lines = report.read_text().splitlines()
    worker = {line.split()[0] for line in lines}
    assert len(worker) == workers and str(launcher.pid) not in worker  # the phases ran in the workers
    time.sleep(0.5)
    assert report.read_text().splitlines() == lines  # which then stopped


def _each_wrote(text, workers, lines):
    """Whether `workers` processes each wrote at least `lines` lines of the report."""
    counts = collections.Counter(line.split()[0] for line in text.splitlines())
    return len(counts) == workers and min(counts.values()) >= lines
