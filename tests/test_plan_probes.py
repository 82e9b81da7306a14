"""The probes over training (analysis/plan_probes.py): teacher-forced log-probabilities of the oracle and the public
plan on fixed tasks, and parameter drift from the base policy, for every kept checkpoint of a run."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rltldr_jax.analysis.plan_probes import drift, plan_rows, plan_scores, probe_run, world_plans
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.envs import forge, load_tasks
from rltldr_jax.models import save_pretrained


def test_rows_hold_each_plan_as_the_action_of_a_no_insight_context(builder):
    tasks = load_tasks("forge", "tier3")[:2]
    plans = world_plans("forge")
    rows = plan_rows(builder, tasks, plans["oracle"])
    tok = builder.tokenizer
    for task, (ids, mask) in zip(tasks, rows, strict=True):
        action = tok.decode(ids[mask].tolist())
        oracle = forge.oracle_plan(task.spec["target"], task.spec["inventory"])
        assert action.startswith(forge.plan_code(oracle)) and mask[-1]  # (+ <|im_end|>)
        assert "Make sure" not in tok.decode(ids.tolist())  # no insight in context
    with pytest.raises(ValueError, match="no reference plans"):
        world_plans("sapi")


def test_drift_by_hand():
    base = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    moved = {"a": np.array([3.0, 1.0]), "b": np.array([[4.0]])}
    assert drift(moved, base) == pytest.approx(1 / 5) and drift(base, base) == 0.0


def test_a_run_is_probed_at_the_base_policy_and_every_kept_checkpoint(tiny_policy, builder, tmp_path):
    model, _ = tiny_policy
    base_dir = str(tmp_path / "base")
    save_pretrained(model, base_dir)
    workdir = tmp_path / "run"
    graphdef, state = nnx.split(model)
    ckpt = Checkpointer(str(workdir / "checkpoints"), keep=None, async_save=False)
    scaled = jax.tree.map(lambda x: x * 1.1, state)  # every parameter 10 % larger: drift 0.1
    ckpt.save(5, params=scaled, opt_state=None, rng=None, model_config=model.config)
    ckpt.close()
    (workdir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "phase": 5, "env_steps": 320}) + "\n")
    tasks = {"tier3": load_tasks("forge", "tier3")[:2]}
    rows = probe_run(str(workdir), base_dir, tasks, builder, plans=world_plans("forge"), batch_size=2)
    assert [(r["step"], r["env_steps"], r["set"], r["tasks"]) for r in rows] == [
        (0, 0, "tier3", 2),
        (5, 320, "tier3", 2),
    ]
    assert rows[0]["drift"] == 0 and rows[1]["drift"] == pytest.approx(0.1, rel=1e-5)
    expected = plan_scores(model, builder, tasks["tier3"], world_plans("forge"), batch_size=2)
    gap = expected["oracle"] - expected["public"]
    assert rows[0]["oracle_logprob"] == pytest.approx(expected["oracle"].mean(), rel=1e-5)
    assert rows[0]["oracle_minus_public"] == pytest.approx(gap.mean(), rel=1e-5, abs=1e-4)
    assert rows[0]["oracle_preferred"] == float((gap > 0).mean())
    assert rows[1]["oracle_logprob"] != rows[0]["oracle_logprob"]  # the scaled policy scores differently
    with pytest.raises(ValueError, match=r"no checkpoint of step\(s\) \[7\]"):
        probe_run(str(workdir), base_dir, tasks, builder, plans=world_plans("forge"), steps=[7])
    assert os.path.isdir(workdir / "checkpoints")


@pytest.mark.slow  # 27 CPU s: a tiny LoRA run
def test_a_lora_runs_checkpoints_are_probed_as_the_merged_policy(tiny_policy, builder, tmp_path):
    from rltldr_jax.models.lora import LoraSpec, attach, linear_layers, merged

    model, _ = tiny_policy
    base_dir = str(tmp_path / "base")
    save_pretrained(model, base_dir)
    graphdef, state = nnx.split(model)
    adapted = attach(nnx.merge(graphdef, state), LoraSpec(rank=2))
    for _, layer in linear_layers(adapted):  # (B = 0 at start: give the adapters an update to measure)
        if layer.lora is not None:
            layer.lora.lora_b.value = jnp.full_like(layer.lora.lora_b.value, 0.05)
    workdir = tmp_path / "run"
    ckpt = Checkpointer(str(workdir / "checkpoints"), keep=None, async_save=False)
    run_config = {"model": {"lora": {"rank": 2, "alpha": 16.0, "targets": "", "dropout": 0.0}}}
    ckpt.save(
        5, params=nnx.state(adapted), opt_state=None, rng=None, model_config=model.config, meta={"config": run_config}
    )
    ckpt.close()
    tasks = {"tier3": load_tasks("forge", "tier3")[:2]}
    rows = probe_run(str(workdir), base_dir, tasks, builder, plans=world_plans("forge"), batch_size=2)
    expected = drift(nnx.state(merged(adapted), nnx.Param), nnx.state(model, nnx.Param))
    assert expected > 0 and rows[1]["drift"] == pytest.approx(expected, rel=1e-5)
    scores = plan_scores(adapted, builder, tasks["tier3"], world_plans("forge"), batch_size=2)
    assert rows[1]["oracle_logprob"] == pytest.approx(scores["oracle"].mean(), rel=1e-5)


def test_the_launcher_refuses_what_is_not_a_grid(tmp_path):
    from helpers import launch

    done = launch("probe_plans", f"--grid={tmp_path}")
    assert done.returncode != 0 and "is not a replication grid's directory" in done.stderr.strip().splitlines()[-1]
