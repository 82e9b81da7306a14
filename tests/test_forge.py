"""The second crafting world (forge): hidden rules over kinds, the four evaluation tiers and what each guarantees,
pretraining demonstrations that never meet a hidden rule, the control insight and the fix probe."""

import collections
import re

import numpy as np
import pytest

from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.envs import crafting, forge, get_spec, load_tasks, make_env
from rltldr_jax.envs.base import Task
from rltldr_jax.envs.registry import control_insight, demonstrations, uninformative_insight

HARD = ("train", "valid", "tier1", "tier2", "tier3", "tier4")
HELDIN = ("train", "valid", "tier1", "train_easy")
HELDOUT = set(forge.HELDOUT)
GATED = set(forge.GATED)


@pytest.fixture(scope="module")
def splits():
    return {split: load_tasks("forge", split, seed=0) for split in forge.SPLITS}


def run(task: Task, items) -> tuple[bool, str]:
    env = make_env("forge")
    env.reset(task)
    env.step(forge.plan_lines(items))
    verdict = env.verify()
    return verdict.success, verdict.report


def contents(items) -> set[str]:
    return {x for i in items for x in (i, *forge.closure(i))}


def public(task: Task) -> list[str]:
    return forge.plan(task.spec["target"], task.spec["inventory"])


def test_the_world_has_ruled_kinds_everywhere_and_public_tools():
    kinds = collections.defaultdict(list)
    for item, kind in forge.KINDS.items():
        kinds[kind].append(item)
    assert set(forge.RAW) == set(forge.KINDS) and len(forge.ITEMS) == len(set(forge.ITEMS))
    assert len(forge.HIDDEN_RULES) >= 4 and all(len(kinds[k]) >= 3 for k in forge.HIDDEN_RULES)
    assert set(kinds) - set(forge.HIDDEN_RULES)  # kinds without a rule (ungated raw items)
    assert forge.HELDOUT_KIND in forge.HIDDEN_RULES and {forge.KINDS[i] for i in forge.HELDOUT_ITEMS} == set(
        forge.HIDDEN_RULES
    ) - {forge.HELDOUT_KIND}
    for kind, tool in forge.HIDDEN_RULES.items():
        assert tool in forge.RECIPES and not contents([tool]) & GATED and len(forge.plan(tool)) == 4, tool
        assert not any(tool in ingredients for ingredients in forge.RECIPES.values()), tool
        trained = [i for i in kinds[kind] if i not in HELDOUT]
        assert kind == forge.HELDOUT_KIND or len(trained) >= 3
    # each gated item is in the tree of at least six recipes, and no recipe holds a held-out item and a fish
    for item in forge.GATED:
        assert sum(item in forge.closure(r) for r in forge.RECIPES) >= 6, item
    for target in forge.RECIPES:
        tree = contents([target])
        assert not (tree & set(forge.HELDOUT_ITEMS) and any(forge.KINDS.get(i) == forge.HELDOUT_KIND for i in tree))


def test_public_planner_fails_every_hard_task_and_the_oracle_solves_every_task(splits):
    for split in HARD:
        for task in splits[split]:
            target, inventory = task.spec["target"], task.spec["inventory"]
            items, oracle = public(task), forge.oracle_plan(target, inventory)
            success, report = run(task, items)
            assert not success, task
            # the public plan only fails on a hidden rule: a missing tool at a gated gather, never on line 1
            assert forge.execute(items, inventory, hidden=False).failed_line == 0
            insight = rule_insight(report)
            tool, item = insight.split('"')[1], insight.split('("')[1].split('")')[0]
            assert tool == forge.tool_for(item) and item in GATED, (task, insight)
            assert forge.first_gated_line(target, inventory) >= 2
            assert run(task, oracle)[0], task
            assert len(oracle) <= 20
    for split in ("train_easy", "eval_easy"):
        for task in splits[split]:
            assert run(task, public(task))[0], task


def test_split_sizes_and_what_the_plans_look_like(splits):
    assert all(len(splits[s]) >= 120 for s in ("valid", "tier1", "tier2", "tier3", "tier4"))
    assert len(splits["train"]) >= 300 and len(load_tasks("forge", "train", seed=1)) >= 300
    stats = forge.world_stats()
    first = stats["first_gated_line"]
    assert 1 not in first and len(first) >= 4 and max(first.values()) < 0.5 * sum(first.values())
    assert max(s["oracle_len"][2] for s in stats["splits"].values()) <= 20
    assert min(stats["recipes_holding"].values()) >= 6
    assert stats["tools_needed"].get(2, 0) > 0.2 * sum(stats["tools_needed"].values())


def test_tiers_hold_what_they_promise(splits):
    trained = set(forge.TRAINED_GATED)
    for split in forge.SPLITS:
        for task in splits[split]:
            target, inventory = task.spec["target"], task.spec["inventory"]
            assert task.split == split and task.env == "forge"
            # no tool is held, nor named by a task that is not about crafting it
            assert not set(inventory) & set(forge.TOOLS)
            assert not any(f'"{t}"' in task.goal for t in forge.TOOLS if t != target)
            tree, held = contents([target]), contents(inventory)
            gathered = {i for i in public(task) if i in GATED}
            if split in HELDIN:  # nothing held out anywhere: tree (so task text), inventory, trees of held items
                assert not (tree | held) & HELDOUT, task
                assert not any(f'"{i}"' in task.goal for i in HELDOUT), task
                assert forge.target_tier(target) in (("train", "easy") if split == "train_easy" else ("train",))
            elif split == "tier2":
                assert target in forge.TIER2_TARGETS and tree & GATED <= trained and not held & HELDOUT, task
            elif split == "tier3":
                assert gathered & set(forge.HELDOUT_ITEMS), task
                assert not any(forge.KINDS.get(i) == forge.HELDOUT_KIND for i in tree | held), task
                for item in tree & set(forge.HELDOUT_ITEMS):  # the only item of its kind in the tree
                    assert [i for i in tree if forge.KINDS.get(i) == forge.KINDS[item]] == [item], task
            elif split == "tier4":
                assert any(forge.KINDS[i] == forge.HELDOUT_KIND for i in gathered), task
                assert not (tree | held) & set(forge.HELDOUT_ITEMS), task
    # held-out targets are never trained on; every trained gated item is gathered in training, every held-out one
    # in its tier, every trained kind in tier 2
    trained_targets = {t.spec["target"] for s in HELDIN for t in splits[s]}
    assert not trained_targets & {t.spec["target"] for s in ("tier2", "tier3", "tier4", "eval_easy") for t in splits[s]}
    assert set(forge.TIER2_TARGETS) == {t.spec["target"] for t in splits["tier2"]}
    gathered = {s: {i for t in splits[s] for i in public(t) if i in GATED} for s in HARD}
    assert gathered["train"] == gathered["tier1"] == trained
    assert gathered["tier3"] & HELDOUT == set(forge.HELDOUT_ITEMS)
    assert {i for i in gathered["tier4"] if forge.KINDS[i] == forge.HELDOUT_KIND} == HELDOUT - set(forge.HELDOUT_ITEMS)
    assert {forge.KINDS[i] for i in gathered["tier2"]} == {forge.KINDS[i] for i in trained}


def test_splits_are_deterministic_disjoint_and_eval_tiers_ignore_the_seed(splits):
    for split in forge.SPLITS:
        tasks = splits[split]
        assert [t.to_json() for t in forge._generate(split, 0)] == [t.to_json() for t in tasks]  # (not the cache)
        keys = [forge.plan_key(t.spec["target"], t.spec["inventory"]) for t in tasks]
        assert len(set(keys)) == len(keys) and len({t.task_id for t in tasks}) == len(tasks)
        if split not in forge.SEEDED_SPLITS:
            assert [t.to_json() for t in forge._generate(split, 7)] == [t.to_json() for t in tasks], split
    assert {t.task_id for t in load_tasks("forge", "train", seed=1)} != {t.task_id for t in splits["train"]}
    fixed = {forge.plan_key(t.spec["target"], t.spec["inventory"]) for s in ("valid", "tier1") for t in splits[s]}
    assert len(fixed) == len(splits["valid"]) + len(splits["tier1"])
    for seed in (0, 1):
        train = {forge.plan_key(t.spec["target"], t.spec["inventory"]) for t in load_tasks("forge", "train", seed=seed)}
        assert not train & fixed
    assert load_tasks("forge", "tier2+tier3") == splits["tier2"] + splits["tier3"]
    with pytest.raises(ValueError, match="unknown forge split 'eval'; choose one of train, valid, tier1"):
        load_tasks("forge", "eval")


def test_the_insight_names_the_violated_rule_never_the_solution():
    task = forge._task("steel", [], "train")  # steel <- brick (clay + coal), iron, tin
    success, report = run(task, public(task))
    assert not success
    assert report == '>> Failed Requirement\nassert you have "pickaxe" before gather("iron")'
    assert rule_insight(report) == 'Make sure that you have "pickaxe" before gather("iron").'
    assert task.goal == 'Craft "steel". Inventory: nothing. Raw: "clay" earth, "coal" fuel, "iron" ore, "tin" ore.'
    env = make_env("forge")
    env.reset(task)
    observation = env.step(forge.plan_lines(public(task))).observation
    assert observation == 'Line 4 failed: gather("iron"). The plan stopped there.'
    # two kinds: the oracle fixes each right before its first gather, not first
    sword = forge.oracle_plan("sword", [])
    assert sword.index("pickaxe") == sword.index("iron") - 1 and sword.index("chisel") == sword.index("ruby") - 1
    assert sword[:2] == ["wood", "stick"]


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        ('craft("stick")', 'you have "wood" before craft("stick")'),
        ('gather("wood")\nprint(1)', 'line 2 is a gather("item") or craft("item") call with a known item'),
        ('craft("wood")', 'line 1 is a gather("item") or craft("item") call with a known item'),
        ('gather("diamond")', 'line 1 is a gather("item") or craft("item") call with a known item'),  # craft's item
        ('gather("wood")', 'you have "plank" at the end of the plan'),
        ("\n\n", 'the plan is one Python code block with one gather("item") or craft("item") call per line'),
    ],
)
def test_every_failure_is_one_requirement(code, failure):
    env = make_env("forge")
    env.reset(forge._task("plank", [], "train_easy"))
    env.step(code)
    verdict = env.verify()
    assert not verdict.success and verdict.failures == (failure,)
    assert rule_insight(verdict.report) == f"Make sure that {failure}."


def test_plans_are_parsed_never_executed():
    env = make_env("forge")
    env.reset(forge._task("plank", [], "train_easy"))
    result = env.step('__import__("os").system("touch /tmp/pwned")')
    assert result.done and "Error on line 1" in result.observation
    assert env.verify().success is False
    with pytest.raises(ValueError, match="ForgeEnv got a task of environment 'craft'"):
        env.reset(Task("craft/x", "g", "craft", "train", {"target": "plank", "inventory": []}))


def test_demonstrations_obey_their_insights_and_never_meet_a_hidden_rule():
    draw = demonstrations("forge", statement_prob=0.1)
    rng = np.random.default_rng(0)
    hidden = {forge.requirement(tool, item) for item in forge.GATED for tool in [forge.tool_for(item)]}
    targets, named_tools, heldout_plans = collections.Counter(), collections.Counter(), 0
    with_insights = statements = 0
    for _ in range(3000):
        task, insights, code, stated = draw(rng)
        items = forge.parse_plan(code.removeprefix("```python\n").removesuffix("```"))
        target, inventory = task.spec["target"], task.spec["inventory"]
        outcome = forge.execute(items, inventory, hidden=False)
        assert outcome.failed_line == 0 and outcome.inventory.get(target, 0) > 0  # solves under the public rules
        assert not set(inventory) & set(forge.TOOLS)
        # no gated gather with its kind's tool held: no demonstration meets a hidden rule, by design or by chance
        assert forge.chance_fixes(items, inventory) == [], (task, items)
        for text, _ in insights:
            req = text.removeprefix("Make sure that ").removesuffix(".")
            assert req not in hidden
            item, before = req.split('"')[1], req.split('("')[1].split('")')[0]
            if stated:
                assert req.startswith(f'you have "{item}" before craft(') and item in forge.RECIPES[before]
                continue
            assert item in forge.CHEAP_ITEMS and before in forge.RAW
            assert not (item in forge.TOOLS and any(forge.tool_for(i) == item for i in items))
            at = items.index(before)  # the requirement holds when the gated action runs
            assert forge.execute(items[:at], inventory, hidden=False).inventory.get(item, 0) > 0, (task, text)
            if item in forge.TOOLS:
                named_tools[item] += 1
        targets[target] += 1
        heldout_plans += bool(set(items) & HELDOUT)
        with_insights += bool(insights) and not stated
        statements += stated
    assert set(targets) == set(forge.RECIPES)  # public recipes of every tier's targets are taught
    assert heldout_plans > 500  # held-out items and fish are gathered in pretraining (never with their tool)
    assert set(named_tools) == set(forge.TOOLS)  # tools are required (for other kinds), so their sub-plans are shown
    assert 1200 < with_insights < 2000 and 150 < statements < 450


def _parse(sentence: str) -> tuple[str, str, str, int]:
    """(item, verb, raw, wording) of a requirement in any of `crafting.WORDINGS`; asserts it is one of them."""
    (item,) = re.findall(r'"([a-z]+)"(?!\))', sentence)
    ((verb, before),) = re.findall(r'(gather|craft)\("([a-z]+)"\)', sentence)
    forms = [w.format(item=item, action=f'{verb}("{before}")') for w in crafting.WORDINGS]
    assert sentence in forms, sentence
    return item, verb, before, forms.index(sentence)


def test_written_and_reworded_insights_are_targets_in_every_wording_and_never_a_hidden_rule():
    """`write_prob`: made-up insights trained as targets too; `reword_prob`: other wordings than the verifier's (a
    requirement keeps its wording in its repeats); none states a hidden (tool, item) pair in any wording. (With both
    0 the draws are round one's: the shipped craft base policies' keys hash the world's demonstrations,
    test_replication.py.)"""
    draw = demonstrations("forge", statement_prob=0.1, write_prob=0.5, reword_prob=0.5)
    rng = np.random.default_rng(1)
    counts, wordings = collections.Counter(), collections.Counter()
    for _ in range(2000):
        task, insights, code, targets = draw(rng)
        pairs = {}
        for text, _ in insights:
            item, verb, before, wording = _parse(text)
            assert forge.tool_for(before) != item  # never a hidden rule
            assert pairs.setdefault((item, before), wording) == wording
            wordings[wording] += 1
        stated = bool(insights) and all(_parse(t)[1] == "craft" for t, _ in insights)
        counts["insights"] += bool(insights) and not stated
        counts["written"] += targets and not stated
        counts["stated"] += stated
        assert targets or not stated
    assert set(wordings) == set(range(len(crafting.WORDINGS)))
    assert 0.4 < wordings[0] / sum(wordings.values()) < 0.6  # half reworded, into five others
    assert 0.4 < counts["written"] / counts["insights"] < 0.6 and 100 < counts["stated"] < 300
    assert forge.WORLD.phrase("shears", "wool") == rule_insight(crafting.report([forge.requirement("shears", "wool")]))


def test_uninformative_insights_name_no_tool_nor_gated_item_and_have_the_length_of_real_ones(splits):
    from rltldr_jax.tokenization import train_chatml_tokenizer

    control = uninformative_insight("forge")
    rng = np.random.default_rng(0)
    texts = []
    for _ in range(500):
        demo = forge.demonstration(rng, insight_prob=1.0)
        texts += [forge.plan_code(demo.plan), *(t for t, _ in demo.insights), demo.task.goal]
    tokenizer = train_chatml_tokenizer(texts, 512)
    real, fake_lengths = collections.Counter(), collections.Counter()
    for split in HARD:
        for task in splits[split][:40]:
            insight = rule_insight(run(task, public(task))[1])
            fake = control(insight, task, 3)
            assert fake == control(insight, task, 3) and fake != insight
            item, before = fake.split('"')[1], fake.split('("')[1].split('")')[0]
            assert fake == f'Make sure that you have "{item}" before gather("{before}").'
            assert item not in forge.TOOLS and before not in GATED and before in forge.RAW
            real[len(tokenizer.encode(insight))] += 1
            fake_lengths[len(tokenizer.encode(fake))] += 1
    assert real == fake_lengths


def test_shuffled_insights_are_real_rules_about_another_kind(splits):
    """The shuffled control: a true hidden rule (a tool before an item of its kind), never about a kind the task
    gathers, never naming a held-out item; deterministic."""
    control = control_insight("forge", "shuffled")
    named_kinds = collections.Counter()
    for task in splits["train"][:200]:
        insight = rule_insight(run(task, public(task))[1])
        fake = control(insight, task, 3)
        assert fake == control(insight, task, 3) and fake != insight
        tool, item = fake.split('"')[1], fake.split('("')[1].split('")')[0]
        assert fake == f'Make sure that you have "{tool}" before gather("{item}").'
        assert item in forge.TRAINED_GATED and tool == forge.HIDDEN_RULES[forge.KINDS[item]]  # a real rule
        gathered = {forge.KINDS[i] for i in public(task) if i in GATED}
        assert forge.KINDS[item] not in gathered  # ...not about this task's failure
        named_kinds[forge.KINDS[item]] += 1
    assert set(named_kinds) == {"ore", "fibre", "gem", "herb"}  # every trained kind appears
    with pytest.raises(ValueError, match="no shuffled control insights; insight.source='shuffled' needs"):
        control_insight("craft", "shuffled")


def test_classify_fix_tells_where_the_tools_are():
    task = forge._task("sword", [], "train")  # sword <- stick, steel (brick, iron, tin), ruby: ore and gem
    oracle = forge.oracle_plan("sword", [])
    assert forge.classify_fix(oracle, task) == {"iron": "right_tool", "tin": "right_tool", "ruby": "right_tool"}
    assert forge.classify_fix(public(task), task) == {"iron": "none", "tin": "none", "ruby": "none"}
    every = [i for t in forge.TOOLS for i in forge.plan(t)] + public(task)
    assert forge.classify_fix(every, task) == dict.fromkeys(("iron", "tin", "ruby"), "every_tool")
    wrong = forge.plan("sword", [], [("shears", "iron"), ("chisel", "ruby")])
    assert forge.classify_fix(wrong, task) == {"iron": "wrong_tool", "tin": "wrong_tool", "ruby": "right_tool"}
    # a tool crafted without its ingredients is not held; a tool in the inventory is
    broken = ["pickaxe", *public(task)]
    assert forge.classify_fix(broken, task)["iron"] == "none"
    held = forge._task("sword", ["chisel"], "train")
    assert forge.classify_fix(public(held), held) == {"iron": "wrong_tool", "tin": "wrong_tool", "ruby": "right_tool"}


def test_the_spec_is_registered_like_crafts():
    spec, craft_spec = get_spec("forge"), get_spec("craft")
    assert spec.name == "forge" and spec.task_prompt == craft_spec.task_prompt
    assert spec.writer_prompt == "device" and spec.rule_failure is craft_spec.rule_failure
    assert spec.demonstrations is not None and spec.uninformative_insight is forge.uninformative_insight
    assert spec.world_fingerprint() == spec.world_fingerprint() and len(spec.world_fingerprint()) == 12
    description = forge.world_description()
    assert description["hidden_rules"] == forge.HIDDEN_RULES and set(description["targets"]["tier2"]) == set(
        forge.TIER2_TARGETS
    )


def test_the_writer_replaces_the_rule_insight_with_the_control(splits, tokenizer):
    """insight.source = shuffled / uninformative: the rule writer's insight, replaced by the world's control; the
    config's validation knows which worlds have which control."""
    import asyncio

    from rltldr_jax.agent.insight import InsightWriter
    from rltldr_jax.agent.writer_prompt import FailedAttempt
    from rltldr_jax.config import base

    task = splits["train"][0]
    ok, report = run(task, public(task))
    failed = FailedAttempt(task, ((forge.plan_code(public(task)), ""),), report, attempt=1)
    for source in ("shuffled", "uninformative"):
        written = asyncio.run(InsightWriter(tokenizer, None, source=source, thinking=False).write(failed, seed=5))
        assert not ok and written.insight == control_insight("forge", source)(rule_insight(report), task, 5)
        assert written.fields["hint"] == written.insight != rule_insight(report)
    config = base.override(base.get_config(), {"env.name": "craft", "insight.source": "shuffled"})
    with pytest.raises(base.ConfigError, match="environment 'craft' has no shuffled control insights"):
        base.validate(config)


def test_evaluation_probes_per_rule_and_where_the_fix_is():
    """Per-rule success for each ruled kind the public plan gathers; the class of every gated gather's fix, and of
    each held-out gated item's; nothing of a plan that does not parse."""
    task = forge._task("sword", ["chisel"], "train")  # iron, tin (ore) and ruby (gem); a chisel held throughout
    probes = forge.evaluation_probes(task, forge.plan_lines(public(task)), True)
    assert probes == {
        "rule_gem/pass@1": 1.0,
        "rule_ore/pass@1": 1.0,
        "fix/right_tool": pytest.approx(1 / 3),
        "fix/wrong_tool": pytest.approx(2 / 3),
        "fix/every_tool": 0.0,
        "fix/none": 0.0,
    }
    coin = forge._task("coin", [], "tier3")  # gold: a held-out gated item of the ore kind
    plain = forge.evaluation_probes(coin, forge.plan_lines(public(coin)), False)
    assert plain["rule_ore/pass@1"] == 0.0 and plain["fix/none"] == 1.0
    assert {k: v for k, v in plain.items() if k.startswith("fix_gold/")} == {
        "fix_gold/right_tool": 0.0,
        "fix_gold/wrong_tool": 0.0,
        "fix_gold/every_tool": 0.0,
        "fix_gold/none": 1.0,
    }
    fixed = forge.evaluation_probes(coin, forge.plan_lines(forge.oracle_plan("coin", [])), True)
    assert fixed["fix_gold/right_tool"] == 1.0 and fixed["rule_ore/pass@1"] == 1.0
    assert forge.evaluation_probes(coin, "print(1)", False) == {"rule_ore/pass@1": 0.0}
    assert forge.evaluation_probes(coin, None, False) == {"rule_ore/pass@1": 0.0}


def test_an_evaluation_logs_the_probes_of_the_world(tiny_policy, builder):
    from helpers import tiny_run_settings

    from rltldr_jax.settings import replace
    from rltldr_jax.train.evaluation import evaluate

    _, engine = tiny_policy
    config = replace(tiny_run_settings("/unused", 1), {"env.name": "forge", "env.eval_split": "tier3"})
    tasks = load_tasks("forge", "tier3")[:2]
    metrics, result = evaluate(engine, builder, config, make_env=lambda: make_env("forge"), tasks=tasks)
    kinds = {forge.KINDS[i] for t in tasks for i in public(t) if i in GATED}
    assert {k for k in metrics if k.startswith("eval/probe/rule_")} == {f"eval/probe/rule_{k}/pass@1" for k in kinds}
    for kind in kinds:  # the success rate of the attempts at the tasks that need the kind's tool
        needing = [a.success for a in result.attempts if kind in {forge.KINDS[i] for i in public(a.task) if i in GATED}]
        assert metrics[f"eval/probe/rule_{kind}/pass@1"] == pytest.approx(np.mean(needing))
