"""The training loop end to end on the tiny preset: collection with insights, the update, weight push, logs,
checkpoints, evaluation, and `--resume` reproducing an uninterrupted run exactly (after a checkpoint, and after
SIGTERM / SIGINT, which stop at a safe point with a checkpoint; an evaluation the stopped run missed is redone)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers import TINY_RUN, tiny_run_config
from helpers import tiny_run_settings as _config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from configs import sapi
from rltldr_jax.config import base
from rltldr_jax.settings import settings_of
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.resume import lock_workdir
from rltldr_jax.train.stopping import Interrupted, RunStopped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Every scalar a phase and an evaluation must log (App. D.1's diagnostics: deconfounded metrics, entropy, clip
#: fractions, engine-vs-trainer gap, SFT NLL and token counts, parse failures, weight-sync time).
REQUIRED_TAGS = (
    "rollout/pass@1/all",
    "rollout/pass@1/no_insight",
    "rollout/pass@1/insight",
    "rollout/pass@all/all",
    "rollout/insight/advantage",
    "rollout/insight/too_easy_ratio",
    "rollout/insight/too_hard_ratio",
    "rollout/counts/env_steps",
    "rollout/counts/tokens",
    "rollout/malformed_fraction",
    "update/entropy",
    "update/clip_fraction",
    "update/first_minibatch/clip_fraction",
    "update/logprob_gap",
    "update/sft_nll",
    "update/sft_tokens",
    "update/grpo_tokens",
    "update/grad_norm",
    "update/loss",
    "insight/parse_failures",
    "insight/written",
    "time/weight_sync_s",
    "time/collect_s",
    "time/update_s",
    "eval/pass@1/all",
    "eval/pass@2/all",
)


def _host(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _drop_times(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Two phases in one process, then an evaluation: (workdir, per-phase metrics, final params, opt state)."""
    workdir = str(tmp_path_factory.mktemp("uninterrupted") / "run")
    trainer = Trainer(_config(workdir, 2))
    try:
        metrics = [trainer.run_phase(), trainer.run_phase()]
        metrics.append(trainer.evaluate())
        return workdir, metrics, _host(trainer.params), _host(trainer.opt_state)
    finally:
        trainer.close()


def test_tiny_run_updates_logs_and_checkpoints(uninterrupted):
    workdir, (first, second, evaluation), _, _ = uninterrupted
    # A random policy fails both attempts; the second had the rule-based insight in context, so L_SFT trained it.
    assert first["rollout/counts/attempts"] == 2 and first["insight/written"] == 2
    assert first["update/optimizer_steps"] >= 1 and first["update/sft_tokens"] > 0 and first["update/grad_norm"] > 0
    assert first["update/grpo_tokens"] > 0 and first["filter/kept_attempts"] == 2
    # Sync phases are sampled with the trainer's own weights (train.overlap_phases off).
    assert first["rollout/weight_version_gap/max"] == second["rollout/weight_version_gap/max"] == 0.0
    assert (
        first["time/phase_s"] >= first["time/collect_s"] + first["time/update_s"]
        and first["time/prefetch_wait_s"] == 0.0
    )
    # Every action is an environment interaction (the malformed last one too): the x-axis advances.
    assert first["rollout/counts/env_steps"] >= 2
    # Before any update the engine's and the trainer's logprobs agree: ratio 1, nothing clipped.
    assert first["update/first_minibatch/clip_fraction"] == 0.0
    assert (
        abs(first["update/first_minibatch/importance_ratio"] - 1.0) < 1e-3
        and abs(first["update/first_minibatch/logprob_gap"]) < 1e-3
    )
    assert evaluation["eval/counts/attempts"] == 2 and evaluation["eval/insight/attempt_fraction"] == 0.0
    checkpoints = os.path.join(workdir, "checkpoints")
    assert sorted(os.listdir(checkpoints)) == ["1", "2"]
    lines = open(os.path.join(workdir, "rollouts", "phase_00000.jsonl")).read().splitlines()
    assert len(lines) == 2 and [len(json.loads(x)["insights"]) for x in lines] == [0, 1]

    runs = {
        axis: EventAccumulator(os.path.join(workdir, "tb", axis)) for axis in ("", "by_tokens", "by_time")
    }  # one run per x-axis
    tags = {axis: set(run.Reload().Tags()["scalars"]) for axis, run in runs.items()}
    missing = [
        t
        for t in REQUIRED_TAGS
        if t not in tags[""] or f"by_tokens/{t}" not in tags["by_tokens"] or f"by_time/{t}" not in tags["by_time"]
    ]
    assert not missing, f"not logged: {missing}"
    # The x-axis is the environment-step count: the phase-2 point sits at both phases' steps.
    events = runs[""]
    steps = [e.step for e in events.Scalars("update/sft_nll")]
    total = first["rollout/counts/env_steps"] + second["rollout/counts/env_steps"]
    assert steps == [first["rollout/counts/env_steps"], total]
    assert [e.value for e in events.Scalars("update/sft_nll")] == pytest.approx(
        [first["update/sft_nll"], second["update/sft_nll"]]
    )
    assert [e.step for e in runs["by_tokens"].Scalars("by_tokens/update/sft_nll")] == [
        first["rollout/counts/tokens"],
        first["rollout/counts/tokens"] + second["rollout/counts/tokens"],
    ]


def test_resume_continues_exactly(uninterrupted, tmp_path):
    """Stop after phase 1, resume in a new Trainer, run phase 2: same rollouts, metrics, parameters, optimizer state."""
    ref_dir, (_, ref_second, _), ref_params, ref_opt = uninterrupted
    workdir = str(tmp_path / "run")
    stopped = Trainer(_config(workdir, 1))
    try:
        stopped.run_phase()
    finally:
        stopped.close()
    resumed = Trainer(_config(workdir, 2), resume=True)
    try:
        assert resumed.phase == 1 and resumed.version == 1 and resumed.engine.weight_version == 1
        second = resumed.run_phase()
        params, opt = _host(resumed.params), _host(resumed.opt_state)
    finally:
        resumed.close()
    rollouts = [open(os.path.join(d, "rollouts", "phase_00001.jsonl")).read() for d in (ref_dir, workdir)]
    assert rollouts[0] == rollouts[1]
    np.testing.assert_equal(_drop_times(second), _drop_times(ref_second))  # NaN == NaN (e.g. no-insight Pass@2)
    for a, b in zip(params + opt, ref_params + ref_opt, strict=True):
        np.testing.assert_array_equal(a, b)


def _records(workdir: str) -> list[dict]:
    """metrics.jsonl's records without the wall-clock times."""
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in f]


@pytest.mark.slow  # ~100 s on 2 cores (a launcher subprocess); the in-process Ctrl-C test below covers the loop
def test_sigterm_stops_at_a_safe_point_and_the_resumed_run_equals_an_uninterrupted_one(uninterrupted, tmp_path, caplog):
    """launch/train.py gets SIGTERM (preemption) during phase 1's update: it finishes the update, writes checkpoint 1
    (which train.checkpoint_every=2 would not have written), skips the evaluation due after phase 1, says so in one
    line and exits 143 (was: killed silently, phase lost). The resumed run first redoes the missing evaluation, then
    trains phase 2 exactly as the uninterrupted run did; resuming the finished run adds nothing (was: a duplicate
    final evaluation)."""
    ref_dir, _, ref_params, ref_opt = uninterrupted
    workdir = str(tmp_path / "run")
    overrides = {"eval.every": 1, "train.checkpoint_every": 2}  # (free to change on resume: the training is the same)
    flags = [f"--config.{k}={v}" for k, v in {**TINY_RUN, **overrides}.items()]
    child = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), "--config=configs/sapi.py:tiny", *flags]
        + [f"--config.workdir={workdir}", "--config.train.max_phases=2"],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        collected = os.path.join(workdir, "rollouts", "phase_00000.jsonl")  # written before the phase's update
        deadline = time.time() + 600
        while not os.path.exists(collected):
            assert child.poll() is None and time.time() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=300)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 143, err
    said = "stopped by SIGTERM at phase 1; checkpoint saved (step 1); resume with --resume"
    assert err.strip().splitlines()[-1] == said
    assert "Traceback" not in err, err
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
    assert [(r["kind"], r["phase"]) for r in _records(workdir)] == [("phase", 1)]

    config = _config(workdir, 2, overrides)
    resumed = Trainer(config, resume=True)
    with caplog.at_level(logging.INFO, logger="rltldr_jax"):
        resumed.run()
    assert "the evaluation after phase 1 is not in metrics.jsonl: running it first" in caplog.text
    records, reference = _records(workdir), _records(ref_dir)  # the reference: phases 1 and 2, then one evaluation
    assert [(r["kind"], r["phase"]) for r in records] == [("phase", 1), ("eval", 1), ("phase", 2), ("eval", 2)]
    assert [records[0], records[2], records[3]] == reference
    for a, b in zip(_host(resumed.params) + _host(resumed.opt_state), ref_params + ref_opt, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2"]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rltldr_jax"):
        Trainer(config, resume=True).run()
    assert "the run is finished: phase 2" in caplog.text and "nothing to do" in caplog.text
    assert _records(workdir) == records  # no second final evaluation


@pytest.mark.slow  # 29 CPU s; signals to a launcher: test_stopping.py
def test_ctrl_c_stops_after_the_phase_and_twice_stops_at_once(tmp_path, monkeypatch):
    """SIGINT during a phase's collection: the phase is finished and checkpointed (train.checkpoint_every=2 would
    not have), then `run` raises RunStopped (exit status 130). Twice during the next phase: it stops at once,
    Interrupted naming the lost phase, nothing written past checkpoint 1, the workdir released."""
    workdir = str(tmp_path / "run")
    config = _config(workdir, 2, {"train.checkpoint_every": 2})

    def collect_with(trainer: Trainer, signals: int) -> None:
        collect = trainer.collector.collect

        def ctrl_c(tasks, phase):
            for _ in range(signals):
                signal.raise_signal(signal.SIGINT)
            return collect(tasks, phase)

        monkeypatch.setattr(trainer.collector, "collect", ctrl_c)

    trainer = Trainer(config)
    collect_with(trainer, 1)
    with pytest.raises(RunStopped, match=r"^stopped by SIGINT at phase 1; checkpoint saved \(step 1\)$") as stopped:
        trainer.run()
    assert stopped.value.exit_status == 130
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
    assert [(r["kind"], r["phase"]) for r in _records(workdir)] == [("phase", 1)]

    resumed = Trainer(config, resume=True)
    assert resumed.phase == 1
    collect_with(resumed, 2)
    with pytest.raises(Interrupted, match=r"^stopped at once by a second SIGINT during phase 2, which is lost$") as e:
        resumed.run()
    assert not isinstance(e.value, RunStopped) and e.value.exit_status == 130
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
    assert [(r["kind"], r["phase"]) for r in _records(workdir)] == [("phase", 1)]
    assert not os.path.exists(os.path.join(workdir, "rollouts", "phase_00001.jsonl"))
    lock_workdir(workdir).close()  # run() closed the trainer


@pytest.mark.slow  # 34 CPU s
def test_concurrent_attempt_chains_through_the_trainer(tmp_path):
    """rollout.workers_per_task = 2 (without exact_group_size): two chains per task, ≥ K attempts per task, numbered
    1..n without gaps or repeats, all trained on."""
    c = tiny_run_config(str(tmp_path / "run"), 1)
    base.override(c, {"rollout.workers_per_task": 2, "rollout.exact_group_size": False, "rollout.tasks_per_phase": 2})
    trainer = Trainer(settings_of(base.validate(c)))
    try:
        assert trainer.collector.workers_per_task == 2
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    lines = [json.loads(x) for x in open(os.path.join(trainer.workdir, "rollouts", "phase_00000.jsonl"))]
    per_task: dict[str, list[int]] = {}
    for line in lines:
        per_task.setdefault(line["task"]["task_id"], []).append(line["attempt"])
    assert len(per_task) == 2
    assert all(len(a) >= 2 and sorted(a) == list(range(1, len(a) + 1)) for a in per_task.values()), per_task
    assert metrics["rollout/counts/attempts"] == len(lines) and metrics["filter/kept_attempts"] == len(lines)
    assert metrics["update/optimizer_steps"] >= 1 and metrics["rollout/weight_version_gap/max"] == 0.0


def test_paper_preset_without_weights_fails_fast(tmp_path):
    c = sapi.get_config("paper")
    base.override(c, {"workdir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"needs model.checkpoint.*Qwen/Qwen3.5-9B"):
        Trainer(settings_of(base.validate(c)))


def test_eval_script_repeats_the_trainers_evaluation(uninterrupted, tmp_path):
    """launch/eval.py on training checkpoint 2 reproduces the trainer's evaluation after phase 2 and writes a JSON."""
    from rltldr_jax.train.evaluation import evaluate_checkpoint  # what launch/eval.py runs

    workdir, (_, _, evaluation), _, _ = uninterrupted
    out = str(tmp_path / "eval.json")
    report = evaluate_checkpoint(_config(workdir, 2), os.path.join(workdir, "checkpoints") + ":2", out)
    saved = json.load(open(out))
    assert saved["policy"].endswith("step 2") and saved["attempts_per_task"] == 2
    assert [len(v) for v in saved["per_task"].values()] == [2]
    np.testing.assert_equal(report["metrics"], evaluation)  # same weights, same seeds: same tokens, same results
    assert saved["metrics"]["eval/counts/tokens"] == evaluation["eval/counts/tokens"] > 0
