"""`train.overlap_phases`: phase n + 1 collected in a background thread with the weights of version n while the
trainer updates on phase n. The version gap is recorded; the budget never collects a phase for nothing; a
checkpoint saves the cursor before the prefetched phase and a resumed run collects it again synchronously; an error
in the background collection surfaces in the main thread; the NaN guard cancels the prefetched phase; no thread
outlives the run and the engine is closed."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

import pytest
from helpers import tiny_run_config as _config

from rltldr_jax.agent.collector import Collector
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.config import base
from rltldr_jax.envs import TaskSource, load_tasks, make_env
from rltldr_jax.envs.sapi.tasks import generate_tasks
from rltldr_jax.settings import settings_of
from rltldr_jax.train import loop
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.step import NonFiniteError


def _overlapped(workdir: str, phases: int):
    c = _config(workdir, phases)
    base.override(c, {"train.overlap_phases": True, "train.keep_checkpoints": 5, "eval.every": 2})
    return settings_of(base.validate(c))


def _records(workdir: str, kind: str = "phase") -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def _rollouts(workdir: str, phase: int) -> list[dict]:
    with open(os.path.join(workdir, "rollouts", f"phase_{phase:05d}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _collection_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("collect-phase-")]


def _cursor_after(config, phases: int) -> dict[str, int]:
    """The task cursor after `phases` phases' tasks were taken (what the trainer's TaskSource does)."""
    tasks = TaskSource(load_tasks(config.env.name, config.env.train_split, seed=config.env.seed), seed=config.seed)
    tasks.take(phases * config.rollout.tasks_per_phase)
    return tasks.state()


@pytest.fixture(scope="module")
def overlapped_run(tmp_path_factory):
    """Three overlapped phases through `run()` (evaluation after phase 2 and at the end): (config, trainer)."""
    workdir = str(tmp_path_factory.mktemp("overlap") / "run")
    config = _overlapped(workdir, 3)
    trainer = Trainer(config)
    trainer.run()
    return config, trainer


def test_an_overlapped_run_records_a_version_gap_of_one(overlapped_run):
    config, trainer = overlapped_run
    workdir = trainer.workdir
    phases = _records(workdir)
    assert [r["phase"] for r in phases] == [1, 2, 3]
    # The first phase is collected with the trainer's weights; each later one with the previous version.
    assert [r["rollout/weight_version_gap/max"] for r in phases] == [0.0, 1.0, 1.0]
    assert [r["rollout/weight_version_gap/mean"] for r in phases] == [0.0, 1.0, 1.0]
    for phase, version in ((0, 0), (1, 0), (2, 1)):  # what the engine reported for every sampled step
        assert {s["weight_version"] for a in _rollouts(workdir, phase) for s in a["steps"]} == {version}
    assert all(r["time/phase_s"] > 0 and r["time/prefetch_wait_s"] >= 0 for r in phases)
    # The update still ran on every phase, and the lagged phases' importance ratios were measured.
    assert all(r["update/optimizer_steps"] >= 1 for r in phases)
    assert phases[1]["update/first_minibatch/importance_ratio"] > 0
    # Evaluations after phase 2 (eval.every) and at the end, with the weights pushed after those phases.
    assert [r["phase"] for r in _records(workdir, "eval")] == [2, 3]
    # max_phases = 3: phase 3 is never collected (no rollout file), and the counters hold three phases.
    assert sorted(os.listdir(os.path.join(workdir, "rollouts"))) == [f"phase_0000{i}.jsonl" for i in range(3)]
    assert trainer.phase == 3 and trainer.version == 3
    assert trainer.env_steps == sum(r["rollout/counts/env_steps"] for r in phases)
    # Clean shutdown: no collection thread left, the engine closed.
    assert _collection_threads() == [] and not trainer.engine.running


@pytest.mark.slow  # 41 CPU s: a second overlapped run
def test_a_checkpoint_saves_the_cursor_before_the_prefetched_phase(overlapped_run, tmp_path):
    """Checkpoint 2 was saved while phase index 2 was being collected: its cursor excludes that phase's tasks, and a
    resumed run collects that phase again (same tasks), synchronously, with the checkpoint's weights."""
    config, trainer = overlapped_run
    checkpoints = Checkpointer(os.path.join(trainer.workdir, "checkpoints"), keep=5)
    try:
        assert checkpoints.all_steps() == [1, 2, 3]
        cursors = {step: checkpoints.read_state(step)[2]["task_cursor"] for step in (1, 2, 3)}
    finally:
        checkpoints.close()
    assert cursors == {step: _cursor_after(config, step) for step in (1, 2, 3)}
    # Resume a copy of the run from checkpoint 2 (the original stays for the other tests).
    import shutil

    workdir = str(tmp_path / "run")
    shutil.copytree(trainer.workdir, workdir, ignore=shutil.ignore_patterns(".lock"))
    resumed = Trainer(_overlapped(workdir, 3), resume_step=2)
    try:
        assert (resumed.phase, resumed.version, resumed.tasks.state()) == (2, 2, cursors[2])
        resumed.run()
    finally:
        resumed.close()
    redone = _records(workdir)[-1]
    assert redone["phase"] == 3 and redone["rollout/weight_version_gap/max"] == 0.0
    assert {s["weight_version"] for a in _rollouts(workdir, 2) for s in a["steps"]} == {2}
    task_ids = [{a["task"]["task_id"] for a in _rollouts(d, 2)} for d in (trainer.workdir, workdir)]
    assert task_ids[0] == task_ids[1]
    assert _collection_threads() == []


@pytest.mark.slow  # 26 CPU s
def test_an_error_in_the_background_collection_surfaces(tmp_path, monkeypatch):
    workdir = str(tmp_path / "run")
    trainer = Trainer(_overlapped(workdir, 3))
    real = trainer.collector.collect_async

    async def failing(tasks, phase):
        if phase == 1:
            raise OSError("the sandbox of phase 1 could not start (simulated)")
        return await real(tasks, phase)

    monkeypatch.setattr(trainer.collector, "collect_async", failing)
    with pytest.raises(OSError, match=r"the sandbox of phase 1 could not start \(simulated\)") as raised:
        trainer.run()
    assert any("phase 1 in a background thread" in note for note in raised.value.__notes__)
    # The phase being trained when it failed was finished, logged and checkpointed; the failed one counts nothing.
    assert [r["phase"] for r in _records(workdir)] == [1] and trainer.phase == 1
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
    assert trainer.tasks.state() == _cursor_after(trainer.config, 1)
    assert _collection_threads() == [] and not trainer.engine.running


def test_the_nan_guard_cancels_the_prefetched_phase(tmp_path, monkeypatch, caplog):
    workdir = str(tmp_path / "run")
    trainer = Trainer(_overlapped(workdir, 3))
    real = trainer.collector.collect_async
    started, events = threading.Event(), []

    async def watched(tasks, phase):
        events.append(("start", phase))
        if phase == 1:
            started.set()
        try:
            result = await real(tasks, phase)
        except asyncio.CancelledError:
            events.append(("cancelled", phase))
            raise
        events.append(("end", phase))
        return result

    def nonfinite_update(*args, **kwargs):
        started.wait(30)
        time.sleep(0.3)  # phase 1's attempts are generating now
        raise NonFiniteError("5 optimizer steps in a row had a non-finite loss or gradient norm (simulated)")

    monkeypatch.setattr(trainer.collector, "collect_async", watched)
    monkeypatch.setattr(loop, "update_phase", nonfinite_update)
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteError, match=r"non-finite loss .*\(simulated\)"):
        trainer.run()
    assert events == [("start", 0), ("end", 0), ("start", 1), ("cancelled", 1)]
    # Nothing of either phase was counted, the prefetched tasks went back to the cursor, the thread is gone.
    assert trainer.phase == 0 and trainer.env_steps == 0 and trainer.tasks.state() == _cursor_after(trainer.config, 1)
    assert _collection_threads() == [] and not trainer.engine.running
    # The cancelled attempts' engine requests were aborted and dropped quietly.
    assert "done-callback" not in caplog.text and "Exception in callback" not in caplog.text


def test_a_pending_phase_is_collected_in_its_own_thread(tiny_policy, builder):
    """`Collector.start` gives the same attempts as `collect` (exact group size: a deterministic phase)."""
    _, engine = tiny_policy
    tasks = generate_tasks("train", seed=0, n=60)[4:6]
    collector = Collector(
        engine,
        lambda: make_env("sapi", step_timeout_s=5.0),
        builder,
        EpisodeConfig(max_steps=2, max_think_tokens=3, max_action_tokens=3, max_context_tokens=4096, seed=3),
        InsightSchedule("never"),
        None,
        group_size=2,
        exact_group_size=True,
    )
    pending = collector.start(tasks, phase=5)
    assert pending.phase == 5 and pending.tasks == tuple(tasks)
    background = pending.wait()
    assert pending.done and pending.seconds > 0 and _collection_threads() == []
    foreground = collector.collect(tasks, phase=5)
    for task_id, group in foreground.groups().items():
        assert [[s.action_ids for s in a.steps] for a in group] == [
            [s.action_ids for s in a.steps] for a in background.groups()[task_id]
        ]
    with pytest.raises(ValueError, match="the tasks of a phase must be distinct"):
        collector.start([tasks[0], tasks[0]], phase=6)
    # A phase cancelled at once ends (whether or not it had begun), and waiting on it says it was cancelled.
    cancelled = collector.start(tasks, phase=7)
    cancelled.cancel()
    assert cancelled.done and _collection_threads() == []
    with pytest.raises(asyncio.CancelledError):
        cancelled.wait()
