"""The training loop end to end on the tiny preset: collection with insights, the update, weight push, logs,
checkpoints, resume, and evaluation."""

from __future__ import annotations

import glob
import json
import os

import pytest

from configs import base, sapi
from rltldr_jax.train.loop import Trainer


def _config(workdir: str, phases: int):
    c = sapi.get_config("tiny")
    base.override(c, {
        "workdir": workdir, "train.max_phases": phases, "rollout.tasks_per_phase": 1, "rollout.group_size": 2,
        "rollout.max_steps": 2, "rollout.max_think_tokens": 4, "rollout.max_action_tokens": 8, "batch.ppo_epochs": 1,
        "eval.num_tasks": 1, "eval.attempts_per_task": 1,
    })  # fmt: skip
    return base.validate(c)


def test_tiny_run_updates_logs_checkpoints_and_resumes(tmp_path):
    workdir = str(tmp_path / "run")
    trainer = Trainer(_config(workdir, 1))
    before = trainer.engine.weight_version
    metrics = trainer.run_phase()
    assert trainer.phase == 1 and trainer.engine.weight_version == before + 1 == 1
    # A random policy fails both attempts; the second one had the rule-based insight in context, so L_SFT trained it.
    assert metrics["rollout/counts/attempts"] >= 2 and metrics["insight/written"] >= 1
    assert metrics["update/optimizer_steps"] >= 1 and metrics["update/sft_tokens"] > 0 and metrics["update/grad_norm"] > 0
    evaluation = trainer.evaluate()
    assert "eval/pass@1/all" in evaluation
    trainer.close()
    assert os.listdir(os.path.join(workdir, "checkpoints")) and glob.glob(os.path.join(workdir, "tb", "events.*"))
    lines = open(os.path.join(workdir, "rollouts", "phase_00000.jsonl")).read().splitlines()
    assert len(lines) == metrics["rollout/counts/attempts"] and json.loads(lines[-1])["insights"]

    resumed = Trainer(_config(workdir, 2), resume=True)
    try:
        assert resumed.phase == 1 and resumed.version == 1 and resumed.tasks.state() == trainer.tasks.state()
        assert resumed.engine.weight_version == 1
        resumed.run_phase()
        assert resumed.phase == 2
    finally:
        resumed.close()


def test_paper_preset_without_weights_fails_fast(tmp_path):
    c = sapi.get_config("paper")
    base.override(c, {"workdir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"needs model.checkpoint.*Qwen/Qwen3.5-9B"):
        Trainer(base.validate(c))
