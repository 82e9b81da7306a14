"""Runs in a workdir: a workdir the run creates is private (0700), one it cannot write is one clear line; a new run
never mixes with an old one (refused, or the old one moved aside); a resumed run
says what changed in its config and refuses changes to what it trains; it falls back past a damaged checkpoint,
moves aside what the stopped run wrote after its checkpoint, and TensorBoard shows redone phases once; a failed
checkpoint save stops the run before more compute; the README's first command works with relative paths from
any directory (launch/train.py, through a checkpoint and --resume)."""

from __future__ import annotations

import gc
import logging
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import tiny_run_config
from helpers import tiny_run_settings as _config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_checkpoint import _failing_writes, _orbax_data_files

from rltldr_jax.checkpoint import CheckpointSaveError, CorruptCheckpointError
from rltldr_jax.config import base
from rltldr_jax.settings import settings_of
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.resume import (
    ConfigChangeError,
    RunExistsError,
    WorkdirError,
    WorkdirInUseError,
    check_config_changes,
    claim_workdir,
    config_changes,
    lock_workdir,
    move_aside,
    prepare_workdir,
    rollouts_from,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _touch(path) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


# ----------------------------------------------------------------------------------------------------
# The workdir: refuse, restart, leftovers, config changes (no model needed)
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "part", ["checkpoints/3/x", "rollouts/phase_00000.jsonl", "tb/by_time/events.out.tfevents.1.h"]
)
def test_a_new_run_never_mixes_with_an_old_one(tmp_path, part):
    workdir = str(tmp_path / "run")
    _touch(os.path.join(workdir, part))
    refused = rf"^{re.escape(workdir)} already holds a run \(.*\): continue it with --resume, start over with --restart"
    with pytest.raises(RunExistsError, match=refused):
        Trainer(_config(workdir, 1))  # refused before anything is built or written (its lock file is removed)
    assert sorted(os.listdir(workdir)) == [part.split("/")[0]]
    moved = prepare_workdir(workdir, resume=False, restart=True)  # what Trainer(restart=True) does first
    assert moved.startswith(f"{workdir}.old-") and os.path.isfile(os.path.join(moved, part))
    assert os.listdir(workdir) == []
    _touch(os.path.join(workdir, part))
    again = prepare_workdir(workdir, resume=False, restart=True)  # the same second: a distinct name
    assert again != moved and os.path.isfile(os.path.join(again, part)) and os.path.isfile(os.path.join(moved, part))
    assert prepare_workdir(workdir, resume=True, restart=False) is None  # --resume uses it as it is
    with pytest.raises(ValueError, match="give one of them"):
        prepare_workdir(workdir, resume=True, restart=True)
    assert prepare_workdir(str(tmp_path / "other"), resume=False, restart=False) is None  # an empty workdir is fine


def test_a_failed_start_leaves_the_workdir_as_it_found_it(tmp_path, caplog):
    """A fresh start that fails while building (here: its tokenizer does not exist) removes its lock file and the
    empty directories it made, and the workdir itself when it made it; what holds files stays, named in a warning.
    A workdir in use by another process keeps that process's lock file."""
    bad = {"tokenizer": str(tmp_path / "no-such-tokenizer")}
    fresh = str(tmp_path / "fresh")
    with pytest.raises(Exception, match="no-such-tokenizer"):
        Trainer(settings_of(tiny_run_config(fresh, 1, bad)))
    assert not os.path.exists(fresh)
    existing = str(tmp_path / "existing")
    _touch(os.path.join(existing, "notes.txt"))
    with pytest.raises(Exception, match="no-such-tokenizer"):
        Trainer(settings_of(tiny_run_config(existing, 1, bad)))
    assert os.listdir(existing) == ["notes.txt"]
    from rltldr_jax.train.resume import start_undo

    undo = start_undo(existing, restart=False)
    lock = claim_workdir(existing, resume=False, restart=False)
    _touch(os.path.join(existing, "made", "data.bin"))
    os.makedirs(os.path.join(existing, "empty", "deeper"))
    with caplog.at_level(logging.WARNING, logger="rltldr_jax.train.resume"):
        undo(lock)
    assert sorted(os.listdir(existing)) == ["made", "notes.txt"]
    assert "the failed start left made in" in caplog.text
    held = lock_workdir(existing)  # another process's run: its lock file is not this start's to remove
    try:
        with pytest.raises(WorkdirInUseError):
            Trainer(settings_of(tiny_run_config(existing, 1)))
        assert os.path.isfile(os.path.join(existing, ".lock"))
    finally:
        held.close()


def test_one_process_per_workdir(tmp_path):
    """The workdir lock refuses a second holder (naming the first's pid) and is free once the holder closes or dies."""
    workdir = str(tmp_path / "run")
    held = lock_workdir(workdir)
    with pytest.raises(
        WorkdirInUseError, match=rf"^{re.escape(workdir)} is in use by another process \(pid {os.getpid()}\)"
    ):
        lock_workdir(workdir)
    held.close()
    lock_workdir(workdir).close()
    # A process that holds it and is killed leaves no stale lock.
    code = f"from rltldr_jax.train.resume import lock_workdir; held = lock_workdir({workdir!r}); print('held', flush=True); input()"  # noqa: E501
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirInUseError, match=rf"\(pid {child.pid}\)"):
            lock_workdir(workdir)
    finally:
        child.kill()
        child.wait()
    lock_workdir(workdir).close()


def test_a_workdir_the_run_creates_is_private(tmp_path, caplog):
    """Agent code in the sandbox runs as another user: it must not read the run's rollouts and checkpoints. A
    workdir the run creates (a fresh one, or the fresh one of --restart) is 0700; an existing one keeps its mode,
    with a warning when other users may enter it."""
    workdir = str(tmp_path / "runs" / "new")
    claim_workdir(workdir, resume=False, restart=False).close()
    assert os.stat(workdir).st_mode & 0o777 == 0o700
    _touch(os.path.join(workdir, "rollouts", "phase_00000.jsonl"))
    claim_workdir(workdir, resume=False, restart=True).close()  # the old run moved aside, a fresh workdir made
    assert os.stat(workdir).st_mode & 0o777 == 0o700
    shared = str(tmp_path / "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o755)
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        claim_workdir(shared, resume=True, restart=False).close()
    assert os.stat(shared).st_mode & 0o777 == 0o755  # not the run's to change
    assert f"{shared} can be read by other users (mode 0755)" in caplog.text and "chmod 700" in caplog.text


def test_a_workdir_that_cannot_be_written_is_one_clear_line(tmp_path):
    """A workdir that cannot be created (here: under a file; likewise read-only or not permitted) is a WorkdirError
    naming it and the reason; launch/train.py prints it as one line (was: an OSError traceback)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    workdir = str(blocker / "run")
    with pytest.raises(WorkdirError, match=rf"^cannot use {re.escape(workdir)} as the workdir: Not a directory: "):
        claim_workdir(workdir, resume=False, restart=False)
    if os.geteuid() != 0:  # (root may write anywhere)
        readonly = tmp_path / "read-only"
        readonly.mkdir(mode=0o555)
        with pytest.raises(WorkdirError, match="Permission denied"):
            claim_workdir(str(readonly / "run"), resume=False, restart=False)
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), "--config=configs/sapi.py:tiny"]
        + [f"--config.workdir={workdir}"],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: cannot use {workdir} as the workdir: Not a directory: {workdir!r}; give a --config.workdir this "
        "user can write"
    )


def test_leftovers_are_moved_aside(tmp_path, caplog):
    workdir = str(tmp_path)
    for phase in range(4):
        _touch(os.path.join(workdir, "rollouts", f"phase_{phase:05d}.jsonl"))
    _touch(os.path.join(workdir, "rollouts", "notes.jsonl"))
    stale = rollouts_from(workdir, 2)
    assert [os.path.basename(p) for p in stale] == ["phase_00002.jsonl", "phase_00003.jsonl"]
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        target = move_aside(workdir, stale, "resume from phase 2")
    assert sorted(os.listdir(os.path.join(target, "rollouts"))) == ["phase_00002.jsonl", "phase_00003.jsonl"]
    assert sorted(os.listdir(os.path.join(workdir, "rollouts"))) == [
        "notes.jsonl",
        "phase_00000.jsonl",
        "phase_00001.jsonl",
    ]
    assert "resume from phase 2: moved rollouts/phase_00002.jsonl, rollouts/phase_00003.jsonl to" in caplog.text
    assert move_aside(workdir, [], "nothing") is None


def test_config_changes_on_resume_are_logged_and_refused(caplog):
    saved = tiny_run_config("/w", 1).to_dict()
    current = tiny_run_config("/w", 5)
    base.override(current, {"loss.lam": 0.1, "optim.learning_rate": 1e-3, "eval.num_tasks": 3, "engine.max_batch": 4})
    saved["loss"]["retired_key"] = 1  # a key the code no longer has: logged, not refused
    changes = {k: (o, n) for k, o, n in config_changes(saved, current.to_dict())}
    assert (
        changes["loss.lam"] == (0.5, 0.1)
        and changes["train.max_phases"] == (1, 5)
        and changes["eval.num_tasks"] == (1, 3)
    )
    assert len(changes) == 6
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"), pytest.raises(ConfigChangeError) as e:
        check_config_changes(saved, current.to_dict(), allow=False, step=4)
    assert str(e.value).startswith(
        "resuming checkpoint step 4 with a changed config would change what the run trains (loss.lam: 0.5 -> 0.1; "
        "optim.learning_rate: 0.0001 -> 0.001): resume with the checkpoint's values, pass --allow_config_change"
    )
    for line in (
        "config loss.lam changed: 0.5 -> 0.1",
        "config train.max_phases changed: 1 -> 5",
        "config engine.max_batch changed: 8 -> 4",
        "config loss.retired_key changed: 1 -> (no such key)",
    ):
        assert line in caplog.text
    check_config_changes(saved, current.to_dict(), allow=True, step=4)  # --allow_config_change
    base.override(current, {"loss.lam": 0.5, "optim.learning_rate": 1e-4})
    check_config_changes(saved, current.to_dict(), allow=False, step=4)  # only keys free to change
    base.override(current, {"rollout.group_size": 4})
    with pytest.raises(ConfigChangeError, match=r"rollout\.group_size: 2 -> 4"):
        check_config_changes(saved, current.to_dict(), allow=False, step=4)


# ----------------------------------------------------------------------------------------------------
# A killed run, resumed: fallback past a damaged checkpoint, leftovers, TensorBoard, a failed save
# ----------------------------------------------------------------------------------------------------


def _scalars(workdir: str) -> dict[str, list[int]]:
    """Each scalar tag's steps as TensorBoard reads them (purges applied), over the three x-axis runs."""
    out = {}
    for axis in ("", "by_tokens", "by_time"):
        events = EventAccumulator(os.path.join(workdir, "tb", axis)).Reload()
        out |= {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return out


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's reads orphaned by the error
@pytest.mark.slow  # 57 CPU s; resume == uninterrupted: test_train_loop.py
def test_resume_after_a_kill(tmp_path, monkeypatch, caplog):
    workdir = str(tmp_path / "run")
    stopped = Trainer(_config(workdir, 1))
    try:
        stopped.save()  # step 0: the initial policy
        first = stopped.run_phase()  # checkpoint 1, rollouts of phase 0, events at its step counts
    finally:
        stopped.close()
    before = _scalars(workdir)
    assert before["update/sft_nll"] == [first["rollout/counts/env_steps"]]
    # Checkpoint 1 is damaged (as if the disk garbled it): asked for with resume_step it is an error; resume falls
    # back to step 0, and what the stopped run wrote after step 0 moves aside.
    data = _orbax_data_files(tmp_path / "run" / "checkpoints" / "1")[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint step 1 in .*: cannot read its arrays"):
        Trainer(_config(workdir, 1), resume_step=1)
    changed = settings_of(base.override(tiny_run_config(workdir, 1), {"loss.lam": 0.25}))
    with pytest.raises(ConfigChangeError, match=r"loss\.lam: 0\.5 -> 0\.25"):  # refused before anything is built
        Trainer(changed, resume=True)
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        resumed = Trainer(_config(workdir, 1), resume=True)
    try:
        with pytest.raises(
            WorkdirInUseError, match=r"is in use by another process"
        ):  # refused before anything is built
            Trainer(_config(workdir, 1), resume=True)
        assert "checkpoint step 1 in" in caplog.text and "falling back to step 0" in caplog.text
        assert (resumed.phase, resumed.env_steps, resumed.version) == (0, 0, 0)
        [discarded] = [d for d in os.listdir(workdir) if d.startswith("discarded-")]
        assert os.listdir(os.path.join(workdir, discarded, "checkpoints")) == ["1"]
        assert os.listdir(os.path.join(workdir, discarded, "rollouts")) == ["phase_00000.jsonl"]
        assert os.listdir(os.path.join(workdir, "rollouts")) == [] and os.listdir(
            os.path.join(workdir, "checkpoints")
        ) == ["0"]
        # The redone phase's checkpoint save fails (a full disk): the next phase stops before collecting anything.
        with monkeypatch.context() as m:
            _failing_writes(m)
            redone = resumed.run_phase()
            while resumed.checkpoints.saving():
                time.sleep(0.05)
        collected = []
        monkeypatch.setattr(resumed.collector, "collect", lambda *a, **k: collected.append(1))
        failed = r"saving checkpoint step 1 .* No space left on device.*newest saved checkpoint is step 0"
        with pytest.raises(CheckpointSaveError, match=failed):
            resumed.run_phase()
        assert collected == [] and os.listdir(os.path.join(workdir, "checkpoints")) == ["0"]  # no temporary directory
    finally:
        resumed.close()
    # TensorBoard: the stopped run's points are purged (without the purge every tag would have its step twice).
    after = _scalars(workdir)
    assert after.keys() == before.keys() and all(len(steps) == 1 for steps in after.values()), after
    assert after["update/sft_nll"] == [redone["rollout/counts/env_steps"]]
    assert after["by_tokens/update/sft_nll"] == [redone["rollout/counts/tokens"]]
    # --restart moves the run (its lock file with it) aside and holds the lock of the fresh workdir.
    restarted = Trainer(_config(workdir, 1), restart=True)
    try:
        with pytest.raises(WorkdirInUseError):
            lock_workdir(workdir)
        [old] = [d for d in os.listdir(tmp_path) if d.startswith("run.old-")]
        lock_workdir(str(tmp_path / old)).close()
    finally:
        restarted.close()
    lock_workdir(workdir).close()
    gc.collect()  # orbax's reads orphaned by the damaged checkpoint end here (their warning is filtered), not later


# ----------------------------------------------------------------------------------------------------
# The README's first command, from another directory, with relative paths
# ----------------------------------------------------------------------------------------------------


@pytest.mark.slow  # 65 CPU s: two launcher processes
def test_train_launcher_with_relative_paths_from_any_directory(tmp_path):
    """launch/train.py run from a temporary directory with a relative config path and workdir: saves checkpoints
    (orbax needs absolute paths), and --resume continues the same run."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    config = os.path.relpath(os.path.join(ROOT, "configs", "sapi.py"), cwd) + ":tiny"
    overrides = [
        "--config.workdir=runs/rel",
        "--config.rollout.tasks_per_phase=1",
        "--config.rollout.group_size=2",
        "--config.rollout.exact_group_size=True",
        "--config.rollout.max_steps=2",
        "--config.rollout.max_think_tokens=4",
        "--config.rollout.max_action_tokens=8",
        "--config.batch.ppo_epochs=1",
        "--config.eval.num_tasks=1",
        "--config.eval.attempts_per_task=1",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cache = os.environ.get("RLTLDR_TEST_XLA_CACHE", os.path.join(ROOT, ".pytest_cache", "xla"))
    env |= {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}
    script = os.path.relpath(os.path.join(ROOT, "launch", "train.py"), cwd)
    runs = []
    for extra in (["--config.train.max_phases=1"], ["--config.train.max_phases=2", "--resume"]):
        out = subprocess.run(
            [sys.executable, script, f"--config={config}", *overrides, *extra],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(out)
    checkpoints = cwd / "runs" / "rel" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["1", "2"]
    assert sorted(os.listdir(cwd / "runs" / "rel" / "rollouts")) == ["phase_00000.jsonl", "phase_00001.jsonl"]
    assert "resumed from checkpoint step 1: phase 1" in runs[1].stderr
