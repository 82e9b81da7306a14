"""The crafting world of the small-scale replication: planner, hidden rules, verifier reports, insights, tasks,
pretraining demonstrations and the control insights."""

import collections

import numpy as np
import pytest

from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.envs import craft, load_tasks, make_env
from rltldr_jax.envs.base import Task

HIDDEN = [(tool, item) for item, tool in craft.HIDDEN_RULES.items()]


@pytest.fixture(scope="module")
def splits():
    return {split: load_tasks("craft", split, seed=0) for split in craft.SPLITS}


def run(task: Task, items) -> tuple[bool, str]:
    env = make_env("craft")
    env.reset(task)
    env.step(craft.plan_lines(items))
    verdict = env.verify()
    return verdict.success, verdict.report


def test_public_planner_fails_every_hard_task_and_the_oracle_solves_every_task(splits):
    for split in ("train", "eval"):
        assert len(splits[split]) >= 100
        for task in splits[split]:
            target, inventory = task.spec["target"], task.spec["inventory"]
            public, oracle = craft.plan(target, inventory), craft.oracle_plan(target, inventory)
            assert not run(task, public)[0], task
            assert run(task, oracle)[0], task
    for split in ("train_easy", "eval_easy"):
        for task in splits[split]:
            assert run(task, craft.plan(task.spec["target"], task.spec["inventory"]))[0], task


def test_splits_are_deterministic_and_held_out_targets_are_never_trained(splits):
    again = load_tasks("craft", "train", seed=0)
    assert [t.to_json() for t in again] == [t.to_json() for t in splits["train"]]
    other = load_tasks("craft", "train", seed=1)
    assert {t.task_id for t in other} != {t.task_id for t in splits["train"]}
    train_targets = {t.spec["target"] for t in splits["train"] + splits["train_easy"]}
    eval_targets = {t.spec["target"] for t in splits["eval"] + splits["eval_easy"]}
    assert eval_targets <= set(craft.HELDOUT_TARGETS) and not train_targets & eval_targets
    assert not {t.task_id for t in splits["train"]} & {t.task_id for t in splits["eval"]}
    # every hidden rule gates some training task and some held-out task
    for item in craft.HIDDEN_RULES:
        for split in ("train", "eval"):
            assert any(item in craft.plan(t.spec["target"], t.spec["inventory"]) for t in splits[split]), (item, split)


def test_the_insight_names_the_violated_rule_never_the_solution():
    task = craft._task("compass", [], "train")  # compass <- ingot (iron + coal), glass (sand + coal)
    success, report = run(task, craft.plan("compass", []))
    assert not success
    assert report == '>> Failed Requirement\nassert you have "torch" before gather("iron")'
    insight = rule_insight(report)
    assert insight == 'Make sure that you have "torch" before gather("iron").'
    # the tool's recipe (the sub-plan that fixes the plan) is not in it
    assert "stick" not in insight and "coal" not in insight and "craft(" not in insight
    # the observation the policy sees says where the plan stopped, not why
    env = make_env("craft")
    env.reset(task)
    observation = env.step(craft.plan_lines(craft.plan("compass", []))).observation
    assert observation == 'Line 1 failed: gather("iron"). The plan stopped there.' and "torch" not in observation


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        ('```python\ncraft("stick")\n```', 'you have "wood" before craft("stick")'),
        ('gather("wood")\nprint(1)', 'line 2 is a gather("item") or craft("item") call with a known item'),
        ('craft("wood")', 'line 1 is a gather("item") or craft("item") call with a known item'),
        ('gather("wood")', 'you have "plank" at the end of the plan'),
        ("\n\n", 'the plan is one Python code block with one gather("item") or craft("item") call per line'),
    ],
)
def test_every_failure_is_one_requirement(code, failure):
    env = make_env("craft")
    env.reset(craft._task("plank", [], "train_easy"))
    env.step(code.replace("```python\n", "").replace("\n```", ""))
    verdict = env.verify()
    assert not verdict.success and verdict.failures == (failure,)
    assert rule_insight(verdict.report) == f"Make sure that {failure}."


def test_plans_are_parsed_never_executed():
    env = make_env("craft")
    env.reset(craft._task("plank", [], "train_easy"))
    result = env.step('__import__("os").system("touch /tmp/pwned")')
    assert result.done and "Error on line 1" in result.observation
    assert env.verify().success is False


def test_demonstrations_obey_their_insights_and_never_state_a_hidden_rule():
    rng = np.random.default_rng(0)
    hidden = {craft.requirement(tool, item) for tool, item in HIDDEN}
    with_insights = 0
    for _ in range(500):
        demo = craft.demonstration(rng)
        target, inventory = demo.task.spec["target"], demo.task.spec["inventory"]
        outcome = craft.execute(demo.plan, inventory, hidden=False)
        assert outcome.failed_line == 0 and outcome.inventory.get(target, 0) > 0  # solves under the public rules
        for text, _ in demo.insights:
            req = text.removeprefix("Make sure that ").removesuffix(".")
            assert req not in hidden
            item, before = req.split('"')[1], req.split('("')[1].split('")')[0]
            at = demo.plan.index(before)  # the requirement holds when the gated action runs
            assert craft.execute(demo.plan[:at], inventory, hidden=False).inventory.get(item, 0) > 0, (demo, text)
        with_insights += bool(demo.insights)
    assert 200 < with_insights < 400  # insight_prob = 0.6, less the plans that gather nothing


def test_uninformative_insights_have_the_form_and_length_of_real_ones(splits):
    from rltldr_jax.tokenization import train_chatml_tokenizer

    rng = np.random.default_rng(0)
    texts = []
    for _ in range(500):
        demo = craft.demonstration(rng, insight_prob=1.0)
        texts += [craft.plan_code(demo.plan), *(t for t, _ in demo.insights), demo.task.goal]
    tokenizer = train_chatml_tokenizer(texts, 512)
    real, control = collections.Counter(), collections.Counter()
    for task in splits["train"][:100]:
        _, report = run(task, craft.plan(task.spec["target"], task.spec["inventory"]))
        insight = rule_insight(report)
        fake = craft.uninformative_insight(insight, task, seed=3)
        assert fake == craft.uninformative_insight(insight, task, seed=3) and fake != insight
        assert fake.startswith("Make sure that you have ") and " before gather(" in fake
        assert not any(tool in fake for tool in craft.HIDDEN_RULES.values())
        real[len(tokenizer.encode(insight))] += 1
        control[len(tokenizer.encode(fake))] += 1
    assert real == control
