"""A crafting world with hidden rules: the environment of the small-scale replication (`env.name = "craft"`).

The paper's claim needs tasks that plain RL cannot crack (Pass@k = 0 for the base policy) but that a policy can
solve once it is told *why* its last attempt failed. This world is built for a policy trained from scratch on a
CPU, and keeps the paper's structure: a public rulebook the policy learns in pretraining, hidden rules that only
the verifier's failed tests reveal, and held-out targets on which internalised rules must transfer.

**Items and actions.** Raw items are gathered (`gather("wood")`), the others crafted from ingredients that the
recipe consumes (`craft("torch")` needs a stick and coal). An attempt is one action: a Python code block with one
call per line, the plan. The block is *parsed*, never executed (`parse_plan`: each line must be exactly
`gather("item")` or `craft("item")`), so no sandbox is needed: agent code cannot run here at all.

**Hidden rules** (`HIDDEN_RULES`): three gathers need a tool the public rulebook never mentions — iron needs a torch
(the mine is dark), diamond a pickaxe, clay a shovel. Every tool has a public recipe of four actions and is no
ingredient of any gated recipe tree, so a fix is that short sub-plan before the gated gather (`oracle_plan` puts it
right before). The public planner (`plan`) knows only the public recipes, so its plan fails every task whose
recipe tree gathers a gated item without its tool: those are the *hard* tasks.

**Verifier and insights.** `CraftEnv.verify` replays the plan and reports the first failed requirement in the
SAPI/AppWorld report format (`>> Failed Requirement` / `assert ...`); the rule-based insight source
(`insight.source=rule`) turns it into the TL;DR sentence, e.g. ``Make sure that you have "torch" before
gather("iron").`` The insight names the missing item and the action it gates — with the same tokens the plan uses
for them — never the sub-plan.
Observations only say which line failed, never why: the reason is privileged, as the paper's failed unit tests.

**Splits** (`load_tasks(split)`): `train` and `eval` are the hard tasks of the training targets and of the held-out
targets (`HELDOUT_TARGETS`, never a training task); `train_easy` / `eval_easy` are tasks the public plan solves
(the base policy's sanity check). Tasks are generated deterministically per seed.

**Pretraining data** (`demonstration`): public plans for every target (held-out ones included: their public
recipes are world knowledge), a share of them with *made-up* requirements in context, written exactly like
insights (``you have "X" before gather("Y")``) and obeyed by the plan, which obtains X right before gathering Y.
This teaches the base policy to act on an insight in context, as the paper's pretrained LLM can; and as the fix
sits next to the gated action, a rule learnt on one target can apply wherever that action appears. The three
hidden (item, action) pairs are never used as a made-up requirement, so nothing about the hidden rules reaches
pretraining (tests/test_craft.py checks this). With `statement_prob`, some demonstrations instead state true public
rules of their plan as insights (the declarative-pretraining experiment).

**Controls.** `uninformative_insight` gives a sentence of the same form and token length as a real insight that
says nothing about the failure (`insight.source=uninformative`).

**What lives where.** This module holds the world's rules (`RAW`, `RECIPES`, `HIDDEN_RULES`, `HELDOUT_TARGETS`, at
the top), its `WORLD` (`envs/crafting.py`'s `World` over those tables), its task generation and splits, its choices
for the demonstrations (`CHEAP_ITEMS`, `made_up_requirements`), its control insight and its EnvSpec. The mechanism
it shares with forge (`envs/forge.py`) is in `envs/crafting.py` — the planner, the replay, the plan parser, task
records, the Env (`CraftEnv` is `CraftingEnv` on this world), the report format and the demonstrations' common
steps — and is bound to `WORLD` here under this module's names (`plan`, `execute`, `parse_plan`, `PlanError`, ...).
This world's behaviour is history: `_fingerprint()` must stay `9a9309ad58f1`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rltldr_jax.envs import crafting
from rltldr_jax.envs.base import Task
from rltldr_jax.envs.crafting import VERBS as VERBS  # (re-exported: craft.VERBS, craft.PlanError, ...)
from rltldr_jax.envs.crafting import Demonstration, insight_text
from rltldr_jax.envs.crafting import Outcome as Outcome
from rltldr_jax.envs.crafting import PlanError as PlanError
from rltldr_jax.envs.reports import requirement_failure
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import PLAN_PROMPT, EnvSpec, register

ENV = "craft"

#: Items gathered from the world.
RAW = ("wood", "stone", "coal", "iron", "gold", "sand", "clay", "wool", "reed", "flint", "diamond")

#: Public recipes: item -> ingredients, each consumed once, in the order the public planner obtains them.
RECIPES: dict[str, tuple[str, ...]] = {
    "plank": ("wood",),
    "stick": ("wood",),
    "torch": ("stick", "coal"),
    "pickaxe": ("stick", "stone"),
    "shovel": ("stick", "flint"),
    "ingot": ("iron", "coal"),
    "nugget": ("gold", "coal"),
    "glass": ("sand", "coal"),
    "brick": ("clay", "coal"),
    "paper": ("reed",),
    "book": ("paper", "wool"),
    "bed": ("wool", "plank"),
    "chest": ("plank", "stick"),
    "bow": ("stick", "wool"),
    "arrow": ("stick", "flint"),
    "bucket": ("ingot",),
    "shears": ("ingot", "flint"),
    "sword": ("ingot", "stick"),
    "anvil": ("ingot", "stone"),
    "lantern": ("torch", "glass"),
    "compass": ("ingot", "glass"),
    "clock": ("nugget", "glass"),
    "map": ("paper", "compass"),
    "crown": ("nugget", "diamond"),
    "drill": ("diamond", "ingot"),
    "kiln": ("brick", "stone"),
    "jar": ("clay", "glass"),
    "vase": ("brick", "glass"),
    "pot": ("clay", "ingot"),
    "ring": ("diamond", "gold"),
}

#: Hidden rules: gathering the key needs the value in the inventory (not consumed). Not in any public text.
HIDDEN_RULES: dict[str, str] = {"iron": "torch", "diamond": "pickaxe", "clay": "shovel"}

#: Targets whose tasks are held out: never trained on, evaluated to see internalised rules transfer. Each hidden
#: rule gates at least one of them.
HELDOUT_TARGETS = ("compass", "crown", "jar", "anvil", "map")

ITEMS = RAW + tuple(RECIPES)

#: The rulebook for the shared machinery (envs/crafting.py): a gather of a key of HIDDEN_RULES needs its value.
WORLD = crafting.World(ENV, RAW, RECIPES, tool_for=HIDDEN_RULES.get, goal_text=crafting.goal_text)

# The shared machinery on this world, under the names this module has always exported (crafting.py documents them).
action, requirement, goal_text = WORLD.action, WORLD.requirement, WORLD.goal_text
plan, oracle_plan, execute, is_hard = WORLD.plan, WORLD.oracle_plan, WORLD.execute, WORLD.is_hard
parse_plan, plan_lines, plan_code = WORLD.parse_plan, WORLD.plan_lines, WORLD.plan_code
public_statements, _task = WORLD.public_statements, WORLD.task


# ----------------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------------

SPLITS = ("train", "eval", "train_easy", "eval_easy")


def generate_tasks(split: str, *, seed: int = 0, per_target: int = 24) -> list[Task]:
    """The tasks of `split` (see the module docstring), deterministic per seed.

    For each target of the split's side (training or held-out targets), up to `per_target` distinct starting
    inventories are drawn: each item of the target's recipe tree is held with probability 0.3, plus up to two
    unrelated items; a task goes to the hard split when the public plan fails under the hidden rules, else to the
    easy one. Targets without a gated item in their tree have no hard tasks.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown craft split {split!r}; choose one of {', '.join(SPLITS)}")
    heldout = split.startswith("eval")
    want_hard = not split.endswith("_easy")
    targets = [t for t in RECIPES if (t in HELDOUT_TARGETS) == heldout]
    rng = np.random.default_rng([seed, 7919, int(heldout)])
    tasks: list[Task] = []
    for target in targets:
        seen: set[tuple[str, ...]] = set()
        for _ in range(per_target * 8):
            key = tuple(sorted(WORLD.draw_inventory(target, rng, ITEMS)))
            if key in seen or is_hard(target, key) != want_hard:
                continue
            seen.add(key)
            tasks.append(_task(target, key, split))
            if len(seen) == per_target:
                break
    return tasks


# ----------------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------------


class CraftEnv(crafting.CraftingEnv):
    """The Env of craft tasks (`crafting.CraftingEnv` on this world): one step per attempt (the whole plan).

    `step(code)` parses the plan and replays it; the observation says how far it got (which line failed, not
    why) and the attempt is done. `verify()` checks that the target is in the inventory at the end and reports
    the first failed requirement (privileged: only the insight writer reads it).
    """

    def __init__(self) -> None:
        super().__init__(WORLD)


# ----------------------------------------------------------------------------------------------------
# Pretraining demonstrations and control insights
# ----------------------------------------------------------------------------------------------------

#: Items whose public plan from an empty inventory has at most four actions (every hidden rule's tool is one): the
#: items a made-up requirement names, so that obeying it inserts a short sub-plan, as fixing a hidden rule does.
CHEAP_ITEMS = tuple(i for i in ITEMS if len(plan(i)) <= 4)


def made_up_requirements(
    target: str, inventory: Sequence[str], rng: np.random.Generator, n: int
) -> list[tuple[str, str]]:
    """Up to `n` requirements (item, raw) for a demonstration, shaped like the hidden rules: `raw` is gathered by the
    public plan, `item` is one of `CHEAP_ITEMS` outside the target's recipe tree whose own recipe does not gather
    `raw`; no two interfere (neither recipe uses or gathers the other's items); the hidden rules' (tool, gated
    item) pairs are never drawn."""
    return crafting.made_up_requirements(
        WORLD, target, inventory, rng, n, items=CHEAP_ITEMS, allowed=lambda item, raw, _: HIDDEN_RULES.get(raw) != item
    )


def demonstration(rng: np.random.Generator, **options: Any) -> Demonstration:
    """A random pretraining example (module docstring; `crafting.demonstration`): any target, a random inventory,
    and with probability `insight_prob` one or two made-up requirements shown as up to `max_insights` insight
    messages (repeats included, as a run's consecutive failures write them) that the plan obeys: each required item
    is obtained right before the gather that needs it. With probability `statement_prob` (drawn first) the insights
    instead state one or two true public rules of the public plan (`statements=True`), which pretraining can train
    as targets. `options`: `crafting.demonstration`'s (insight_prob, max_insights, statement_prob, write_prob,
    reword_prob)."""
    return crafting.demonstration(
        WORLD,
        rng,
        made_up=made_up_requirements,
        extras=ITEMS,
        **options,
    )


def uninformative_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight (not in the paper) of the form and token length of a real one but with no information:
    `you have "X" before gather("Y")` for a random raw item Y and a random cheap item X that is not a hidden
    rule's tool (a tool named by chance could fix a gated gather elsewhere in the plan). Deterministic per
    (insight, task, seed)."""
    rng = crafting.hashed_rng(f"{seed}|{task.task_id}|{insight}")
    items = [i for i in CHEAP_ITEMS if i not in HIDDEN_RULES.values()]
    while True:
        before, item = str(rng.choice(RAW)), str(rng.choice(items))
        if item != before:
            return insight_text(requirement(item, before))


def world_description() -> dict[str, Any]:
    """The public rulebook and the hidden rules, for reports and notebooks."""
    return {
        "raw": list(RAW),
        "recipes": {k: list(v) for k, v in RECIPES.items()},
        "hidden_rules": dict(HIDDEN_RULES),
        "heldout_targets": list(HELDOUT_TARGETS),
    }


# ----------------------------------------------------------------------------------------------------
# The environment's spec
# ----------------------------------------------------------------------------------------------------


def _fingerprint() -> str:
    """A hash of every split's tasks and of a fixed sample of demonstrations (with and without statements)."""
    return crafting.fingerprint(SPLITS, generate_tasks, demonstration)


def _make_env(limits: SandboxLimits) -> CraftEnv:
    return CraftEnv()  # plans are parsed, never executed: no sandbox


#: The small-scale replication's first world: plans are parsed, never executed; it and forge (envs/forge.py, the
#: second world) have pretraining demonstrations and the uninformative control insights.
SPEC = register(
    EnvSpec(
        name="craft",
        load_tasks=lambda split, seed: generate_tasks(split, seed=seed),
        make_env=_make_env,
        task_prompt=PLAN_PROMPT,
        writer_prompt="device",
        rule_failure=requirement_failure,
        demonstrations=crafting.pretrain_examples(WORLD, demonstration),
        uninformative_insight=uninformative_insight,
        world_fingerprint=_fingerprint,
        reference_plans=WORLD.reference_plans,
    )
)
