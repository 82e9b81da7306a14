"""More evaluation sets (`eval.splits`): fixed per world (the same tasks for every run seed), validated at start,
each logged under `eval_<split>/`."""

from __future__ import annotations

import pytest
from helpers import tiny_run_settings

from rltldr_jax.agent.eval_set import split_eval_tasks, split_names
from rltldr_jax.config import base
from rltldr_jax.settings import Settings, replace
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.report import eval_line


def test_split_names_are_checked_in_one_line():
    assert split_names("") == () and split_names(" valid, tier1 ") == ("valid", "tier1")
    for bad, why in (
        ("valid,,tier1", "''"),
        ("Tier1", "'Tier1'"),
        ("a/b", "'a/b'"),
        ("x,x", "twice"),
        ("train", "eval.train_num_tasks"),
    ):
        with pytest.raises(ValueError, match=why):
            split_names(bad)
    config = base.get_config()
    base.override(config, {"eval.splits": "valid,valid"})
    with pytest.raises(base.ConfigError, match="eval.splits='valid,valid' names a split twice"):
        base.validate(config)
    base.override(config, {"eval.splits": "valid,tier2", "eval.select_on": "tier3"})
    with pytest.raises(base.ConfigError, match="eval.select_on='tier3' is not one of eval.splits='valid,tier2'"):
        base.validate(config)
    base.validate(base.override(config, {"eval.select_on": "valid"}))


def _craft(seed: int, splits: str, split_tasks: int) -> Settings:
    return replace(
        Settings(),
        {"env.name": "craft", "seed": seed, "eval.splits": splits, "eval.split_tasks": split_tasks},
    )


def test_the_sets_are_fixed_by_the_world_not_by_the_run_seed():
    sets = [split_eval_tasks(_craft(seed, "eval,eval_easy", 5)) for seed in (0, 7)]
    assert list(sets[0]) == ["eval", "eval_easy"] and all(len(tasks) == 5 for tasks in sets[0].values())
    assert sets[0] == sets[1]  # the same tasks, in the same order, for every run seed
    whole = split_eval_tasks(_craft(0, "eval", 0))["eval"]
    assert len(whole) > 5 and {t.task_id for t in sets[0]["eval"]} <= {t.task_id for t in whole}
    with pytest.raises(ValueError, match="unknown craft split 'tier9'"):
        split_eval_tasks(_craft(0, "eval,tier9", 0))


def test_the_trainer_evaluates_every_set_and_refuses_an_unknown_split_before_building(tmp_path):
    with pytest.raises(ValueError, match="unknown SAPI split 'nope'"):  # before the model or the engine exist
        Trainer(tiny_run_settings(str(tmp_path / "bad"), 1, {"eval.splits": "nope"}))
    config = tiny_run_settings(str(tmp_path / "run"), 1, {"eval.splits": "eval", "eval.split_tasks": 1})
    trainer = Trainer(config)
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.close()
    assert metrics["eval_eval/counts/tasks"] == 1 == metrics["eval/counts/tasks"]  # TINY_RUN evaluates 1 task
    assert metrics["eval_eval/counts/attempts"] == config.eval.attempts_per_task == 2
    # The same task and sampling seeds as the held-out evaluation's (eval.num_tasks=1 of the same split is the
    # run seed's first task; split_tasks=1 is env.seed's: both seeds are 0 here), so the same numbers.
    assert metrics["eval_eval/pass@1/all"] == metrics["eval/pass@1/all"]
    line = eval_line(0, metrics, attempts_per_task=2, seconds=1.0)
    assert line.endswith(f" | eval {metrics['eval_eval/pass@1/all']:.3f}, 1.0 s)"), line


def test_evaluate_all_runs_every_evaluation_of_a_run(tiny_policy, builder):
    """What the trainer and the offline SFT baselines evaluate: eval/, eval_train/ and every eval.splits set."""
    from rltldr_jax.envs import make_env
    from rltldr_jax.train.evaluation import evaluate_all

    _, engine = tiny_policy
    config = tiny_run_settings("/unused", 1, {"eval.train_num_tasks": 1, "eval.splits": "eval", "eval.split_tasks": 2})
    metrics = evaluate_all(engine, builder, config, make_env=lambda: make_env("sapi"))
    assert {k.split("/")[0] for k in metrics} == {"eval", "eval_train", "eval_eval"}
    assert [metrics[f"{p}/counts/tasks"] for p in ("eval", "eval_train", "eval_eval")] == [1, 1, 2]


def test_a_set_equal_to_the_held_out_one_is_not_evaluated_twice(tiny_policy, builder, monkeypatch):
    """A set of the held-out set's tasks (env.eval_split listed in eval.splits with all its tasks in both, as the
    second replication round's tier 2): one evaluation, logged under both prefixes; another set is evaluated."""
    from rltldr_jax.agent.eval_set import eval_tasks
    from rltldr_jax.envs import load_tasks, make_env
    from rltldr_jax.train import evaluation

    _, engine = tiny_policy
    ran, real = [], evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: ran.append(k.get("prefix", "eval")) or real(*a, **k))
    config = tiny_run_settings("/unused", 1)
    held_out = eval_tasks(config)
    other = [t for t in load_tasks("sapi", "eval") if t.task_id != held_out[0].task_id][:1]
    metrics = evaluation.evaluate_all(
        engine, builder, config, make_env=lambda: make_env("sapi"), sets={"same": held_out[::-1], "other": other}
    )
    assert ran == ["eval", "eval_other"]
    same = {k.removeprefix("eval_same/"): v for k, v in metrics.items() if k.startswith("eval_same/")}
    assert same == {k.removeprefix("eval/"): v for k, v in metrics.items() if k.startswith("eval/")} and same
    assert metrics["eval_other/counts/tasks"] == len(other) == 1
