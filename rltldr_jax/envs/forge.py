"""A second crafting world with hidden rules over item *kinds*: `env.name = "forge"`.

Round one's world (`envs/craft.py`, kept as it is) had three hidden rules on three single items, each gated item in
few recipes and always first in the public plan of a hard training task, and held-out *targets* that reused trained
gated subtrees: its held-out split tested new targets, not new rules. This world keeps craft's mechanics (plans of
one `gather("item")` / `craft("item")` per line, parsed and never executed; the same planner, verifier report,
insights, demonstrations and controls: `envs/crafting.py`, shared by both worlds) and changes what the rules are
about and what the evaluation holds out.

**Items and kinds.** Every raw item has a public *kind* (`KINDS`): ungated kinds (plant, rock, fuel, earth) and five
ruled kinds — ore, fibre, gem, herb and fish, with three or four items each. The task text states the kind of every
raw item of the target's recipe tree (`Craft "sword". Inventory: nothing. Raw: "coal" fuel, "iron" ore, ...`), so
a policy can see that "gold" is an ore without ever having gathered it.

**Hidden rules** (`HIDDEN_RULES`, kind -> tool): gathering any item of a ruled kind needs that kind's tool in the
inventory (not consumed): ores a pickaxe, fibres shears, gems a chisel, herbs a sickle, fish a net. Which tool is in
no public text. Tools have public four-action recipes from ungated items and are ingredients of nothing, so a fix is
that short sub-plan, and `oracle_plan` puts it right before the first gathered item of the kind. Gated items are
everywhere: each is in the recipe tree of at least six recipes, after other lines — components (`steel = brick +
iron + tin`) hold two items of one kind after an ungated intermediate, and most targets combine an ungated
ingredient, a component and a raw item of another kind (`sword = stick + steel + ruby`), so a hard task needs one or
two tools, each at its own place in the plan. No hard task's public plan starts with a gated gather (it comes on
line 2 or later; `world_stats` gives the distribution), so the oracle's fix is never on line 1. A fix placed earlier
(every tool first) works too, tools not being consumed: where a policy puts its fixes is measured (`classify_fix`),
not enforced.

**Verifier and insights** as craft's: `ForgeEnv.verify` reports the first failed requirement
(`>> Failed Requirement` / `assert you have "pickaxe" before gather("iron")`), the rule source turns it into
``Make sure that you have "pickaxe" before gather("iron").`` The observation says which line failed, not why.

**Tiers** (`load_tasks(split, seed)`, also `"tier2+tier3"`; only `train` and `train_easy` depend on the seed, every
other split is drawn from the fixed `WORLD_SEED`; there is no `eval` split: name a tier). Trained items: three of
each of ore, fibre, gem and herb. Held out: one item of each of those kinds (`HELDOUT_ITEMS`: gold, hemp, onyx,
basil) and the whole fish kind (`HELDOUT_KIND`). A task's *plan key* is its target and the held items that change
its public or oracle plan (items of the target's or a tool's recipe tree); tasks of one split have distinct plan
keys.

- `train`, `valid`, `tier1` (held-in): hard tasks of the training targets — recipes whose tree holds trained gated
  items only and that are not tier-2 targets. `valid` (checkpoint selection) and `tier1` (evaluation) are fixed;
  the three splits share no plan key, for every seed.
- `tier2` (held-out targets): hard tasks of `TIER2_TARGETS`, recipes no training task has as target, whose trees hold
  trained gated items only, and no held-out item anywhere (tree or inventory). Each combines a trained component (a
  training target itself) with a trained raw item of another kind in a new way: new targets, not new rules.
- `tier3` (held-out items of trained kinds): targets whose tree holds a held-out item and no fish; the public plan
  gathers at least one held-out item, and no other item of that item's kind is in the tree, so the task needs "ores
  need a pickaxe" applied to an ore that no training task contains. Most also gather trained items of one other
  kind (a trained rule too); four targets hold two held-out items of two kinds.
- `tier4` (held-out kind, the negative control): targets whose tree holds a fish and no held-out item of a trained
  kind; the public plan gathers a fish (some also a trained item). Training never shows the net's rule, so only a
  policy that gets every tool (`classify_fix` tells) or guesses can pass.
- `train_easy` / `eval_easy`: tasks the public plan solves (training-side targets, including the tools and ungated
  intermediates; held-out targets with their gated items held), the base policy's sanity check.

No task of `train`, `valid`, `tier1` or `train_easy` contains a held-out item or a fish anywhere: not in the
target's recipe tree (so not in its task text), not in the inventory, not in the tree of any held item. No task's
inventory holds a tool.

**Pretraining data** (`demonstration`): public plans for every recipe, held-out ones included (the public recipes of
every tier's targets are world knowledge, so pretraining teaches them; demonstrations do mention held-out items and
fish, always gathered without their tool), a share with *made-up* requirements written exactly like insights and
obeyed by the plan (`you have "X" before gather("Y")`: X a cheap ungated item or a tool, Y a raw item the plan
gathers). A tool X is only required in a demonstration whose plan gathers no item of X's kind, and inventories never
hold a tool, so no demonstration gathers a gated item while holding its kind's tool: no demonstration plan meets a
hidden rule, by design or by chance (`chance_fixes`; tests/test_forge.py checks thousands). With `statement_prob`,
some demonstrations state true public rules of their plan instead (about crafts, never gathers); with `write_prob`,
some made-up insights are trained as the policy's own output (it learns to write insights, never a hidden rule);
with `reword_prob`, a share of the sentences is phrased in other wordings than the verifier's (`crafting.WORDINGS`).

**Controls.** `uninformative_insight` gives a sentence of the same form and token length as a real insight that
names neither a tool nor a gated item (`you have "plank" before gather("sand")`). `classify_fix` is the probe for
analyses: for each gated gather of a plan, whether the right tool, only a wrong one, every tool or none is held.

**What lives where.** This module holds the world's rules (`KINDS`, `HIDDEN_RULES`, what is held out, `RECIPES`, at
the top), its `WORLD` (`envs/crafting.py`'s `World` over those tables, gathers gated by `tool_for` and the task text
stating the raw items' kinds), the tiers and their task generation, the probes (`gated_gathers`, `chance_fixes`,
`classify_fix`, `world_stats`), its choices for the demonstrations (`CHEAP_ITEMS`, `made_up_requirements`, which
never names a needed tool, inventories without tools, the `chance_fixes` check), its control insights and its
EnvSpec. The mechanism it shares with craft — the planner, the replay, the plan parser, task records, the Env
(`ForgeEnv` is `CraftingEnv` on this world), the report format and the demonstrations' common steps — is in
`envs/crafting.py`, bound to `WORLD` here under this module's names (`plan`, `execute`, `parse_plan`, ...). The
shipped base policies are keyed on `_fingerprint()` (`f190025142f0`): changing what the world generates breaks them.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from rltldr_jax.envs import crafting
from rltldr_jax.envs.base import Task
from rltldr_jax.envs.crafting import VERBS as VERBS  # (re-exported: forge.VERBS, forge.PlanError, ...)
from rltldr_jax.envs.crafting import Demonstration, insight_text
from rltldr_jax.envs.crafting import Outcome as Outcome
from rltldr_jax.envs.crafting import PlanError as PlanError
from rltldr_jax.envs.reports import requirement_failure
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import PLAN_PROMPT, EnvSpec, register

ENV = "forge"

#: The public kind of every raw item (the rulebook states it; task texts state it for the items of the target's
#: recipe tree). Ruled kinds are the keys of HIDDEN_RULES; the others gate nothing.
KINDS: dict[str, str] = {
    "wood": "plant",
    "reed": "plant",
    "stone": "rock",
    "sand": "rock",
    "flint": "rock",
    "coal": "fuel",
    "clay": "earth",
    "iron": "ore",
    "tin": "ore",
    "lead": "ore",
    "gold": "ore",
    "wool": "fibre",
    "silk": "fibre",
    "flax": "fibre",
    "hemp": "fibre",
    "ruby": "gem",
    "jade": "gem",
    "opal": "gem",
    "onyx": "gem",
    "mint": "herb",
    "sage": "herb",
    "dill": "herb",
    "basil": "herb",
    "cod": "fish",
    "eel": "fish",
    "carp": "fish",
}

#: Hidden rules: gathering an item of the kind needs the tool in the inventory (not consumed). In no public text.
HIDDEN_RULES: dict[str, str] = {"ore": "pickaxe", "fibre": "shears", "gem": "chisel", "herb": "sickle", "fish": "net"}

#: Tier 3: one item of each trained ruled kind that no training task contains.
HELDOUT_ITEMS = ("gold", "hemp", "onyx", "basil")
#: Tier 4: the ruled kind none of whose items any training task contains.
HELDOUT_KIND = "fish"

#: Public recipes: item -> ingredients, each consumed once, in the order the public planner obtains them.
RECIPES: dict[str, tuple[str, ...]] = {
    # ungated intermediates
    "stick": ("wood",),
    "plank": ("wood",),
    "rope": ("reed",),
    "glass": ("sand", "coal"),
    "brick": ("clay", "coal"),
    # tools (ingredients of nothing)
    "pickaxe": ("stick", "stone"),
    "shears": ("stick", "flint"),
    "chisel": ("plank", "stone"),
    "sickle": ("plank", "flint"),
    "net": ("rope", "flint"),
    # components of trained items: two items of one kind after an ungated ingredient
    "steel": ("brick", "iron", "tin"),
    "bronze": ("stick", "tin", "lead"),
    "pewter": ("plank", "lead", "iron"),
    "yarn": ("stick", "wool", "silk"),
    "cloth": ("rope", "silk", "flax"),
    "felt": ("glass", "flax", "wool"),
    "jewel": ("plank", "ruby", "jade"),
    "charm": ("glass", "jade", "opal"),
    "prism": ("rope", "opal", "ruby"),
    "tea": ("brick", "mint", "sage"),
    "salve": ("stick", "sage", "dill"),
    "tonic": ("rope", "dill", "mint"),
    # training targets: an ungated ingredient, a component and a raw item of another kind
    "sword": ("stick", "steel", "ruby"),
    "anvil": ("stone", "bronze", "mint"),
    "armor": ("pewter", "plank", "wool"),
    "kite": ("reed", "yarn", "iron"),
    "quilt": ("cloth", "clay", "dill"),
    "boots": ("coal", "felt", "opal"),
    "crown": ("jewel", "coal", "lead"),
    "lamp": ("plank", "charm", "sage"),
    "flute": ("prism", "reed", "flax"),
    "mask": ("sand", "tea", "jade"),
    "drum": ("salve", "plank", "tin"),
    "harp": ("wood", "tonic", "silk"),
    "belt": ("stick", "mint", "yarn"),
    "cloak": ("tonic", "sand", "iron"),
    "bowl": ("clay", "wool", "jewel"),
    "chest": ("plank", "pewter", "sage"),
    # tier-2 targets: trained components and items, combined anew
    "scarf": ("reed", "steel", "silk"),
    "vase": ("clay", "charm", "iron"),
    "fan": ("tea", "stick", "opal"),
    "urn": ("coal", "salve", "wool"),
    "box": ("plank", "prism", "mint"),
    "glove": ("felt", "sand", "lead"),
    "cup": ("glass", "bronze", "jade"),
    "comb": ("stone", "ruby", "cloth"),
    # tier 3: components of held-out items, and targets with one (rarely two) of them
    "coin": ("brick", "gold"),
    "twine": ("stick", "hemp"),
    "cameo": ("glass", "onyx"),
    "pesto": ("plank", "basil"),
    "medal": ("stick", "coin", "wool"),
    "badge": ("coin", "plank", "mint"),
    "dice": ("reed", "yarn", "gold"),
    "sack": ("twine", "clay", "ruby"),
    "mat": ("sand", "twine", "sage"),
    "sail": ("plank", "jewel", "hemp"),
    "idol": ("stone", "cameo", "iron"),
    "brooch": ("cameo", "reed", "flax"),
    "totem": ("wood", "tea", "onyx"),
    "soap": ("clay", "pesto", "tin"),
    "spice": ("pesto", "sand", "wool"),
    "salad": ("reed", "steel", "basil"),
    "purse": ("clay", "coin", "hemp"),
    "sling": ("stick", "twine", "onyx"),
    "amulet": ("wood", "cameo", "basil"),
    "feast": ("stone", "pesto", "gold"),
    # tier 4: fish components, and targets with one and a trained raw item
    "stew": ("brick", "cod", "eel"),
    "soup": ("glass", "eel", "carp"),
    "sushi": ("rope", "carp", "cod"),
    "tray": ("plank", "stew", "iron"),
    "kettle": ("stew", "stone", "wool"),
    "ladle": ("stick", "soup", "ruby"),
    "pan": ("soup", "clay", "mint"),
    "plate": ("sand", "sushi", "silk"),
    "bait": ("sushi", "coal", "jade"),
}

#: Held-out targets of tier 2: their trees hold trained gated items only; no training task has them as target.
TIER2_TARGETS = ("scarf", "vase", "fan", "urn", "box", "glove", "cup", "comb")

RAW = tuple(KINDS)
ITEMS = RAW + tuple(RECIPES)
TOOLS = tuple(HIDDEN_RULES.values())
GATED = tuple(i for i in RAW if KINDS[i] in HIDDEN_RULES)
#: Every item of the held-out kind, and the held-out items of trained kinds: what no training task contains.
HELDOUT = HELDOUT_ITEMS + tuple(i for i in RAW if KINDS[i] == HELDOUT_KIND)
#: The trained gated items: gated, not held out.
TRAINED_GATED = tuple(i for i in GATED if i not in HELDOUT)

#: The seed of every split that must not depend on the run's seed (valid, tier1-tier4, eval_easy).
WORLD_SEED = 20260


def tool_for(item: str) -> str | None:
    """The tool a hidden rule requires to gather `item` (None: not gated)."""
    return HIDDEN_RULES.get(KINDS.get(item, ""))


def goal_text(target: str, inventory: Sequence[str]) -> str:
    """The task's instruction, with the public kind of every raw item of the target's recipe tree:
    `Craft "steel". Inventory: "coal". Raw: "coal" fuel, "iron" ore, "tin" ore.`"""
    raw = ", ".join(f'"{i}" {KINDS[i]}' for i in sorted(i for i in closure(target) if i in KINDS))
    return crafting.goal_text(target, inventory) + (f" Raw: {raw}." if raw else "")


#: The rulebook for the shared machinery (envs/crafting.py): a gather of an item of a ruled kind needs its tool.
WORLD = crafting.World(ENV, RAW, RECIPES, tool_for=tool_for, goal_text=goal_text)

# The shared machinery on this world, under the names this module has always exported (crafting.py documents them).
action, requirement, closure = WORLD.action, WORLD.requirement, WORLD.closure
plan, oracle_plan, execute, is_hard = WORLD.plan, WORLD.oracle_plan, WORLD.execute, WORLD.is_hard
parse_plan, plan_lines, plan_code = WORLD.parse_plan, WORLD.plan_lines, WORLD.plan_code
public_statements, _task = WORLD.public_statements, WORLD.task


# ----------------------------------------------------------------------------------------------------
# Probes: where a plan gathers gated items, and what it holds then
# ----------------------------------------------------------------------------------------------------


def gated_gathers(items: Sequence[str]) -> list[int]:
    """The 1-based lines of a plan that gather a gated item."""
    return [n for n, item in enumerate(items, 1) if item in GATED]


def _holding(items: Sequence[str], inventory: Iterable[str]) -> list[frozenset[str]]:
    """For each line of a plan, the items held right before it, replayed leniently under the public rules: a line
    whose ingredients are missing obtains nothing and the replay goes on; hidden rules are not applied."""
    held: collections.Counter[str] = collections.Counter(inventory)
    before = []
    for item in items:
        before.append(frozenset(i for i, c in held.items() if c > 0))
        needs = collections.Counter(RECIPES.get(item, ()))
        if all(held[i] >= c for i, c in needs.items()):
            held -= needs
            held[item] += 1
    return before


def chance_fixes(items: Sequence[str], inventory: Iterable[str]) -> list[int]:
    """The 1-based lines of a plan that gather a gated item while its kind's tool is held: lines that meet a hidden
    rule. No demonstration may have one (it would teach the rule in pretraining)."""
    before = _holding(items, inventory)
    return [n for n, item in enumerate(items, 1) if item in GATED and tool_for(item) in before[n - 1]]


def classify_fix(plan_items: Sequence[str], task: Task) -> dict[str, str]:
    """The probe of where a plan's fixes are: for each gated item the plan gathers (its first gather), what the plan
    holds right before that line (lenient public-rule replay from the task's inventory): "every_tool" (all five
    tools), "right_tool" (its kind's tool, not all five), "wrong_tool" (some tool, not its kind's) or "none"."""
    before = _holding(plan_items, task.spec["inventory"])
    out: dict[str, str] = {}
    for n, item in enumerate(plan_items):
        if item not in GATED or item in out:
            continue
        tools = {t for t in TOOLS if t in before[n]}
        if len(tools) == len(TOOLS):
            out[item] = "every_tool"
        elif tool_for(item) in tools:
            out[item] = "right_tool"
        elif tools:
            out[item] = "wrong_tool"
        else:
            out[item] = "none"
    return out


FIX_CLASSES = ("right_tool", "wrong_tool", "every_tool", "none")


def evaluation_probes(task: Task, code: str | None, success: bool) -> dict[str, float]:
    """What an evaluation measures of one attempt (EnvSpec.evaluation_probes), each averaged over the attempts that
    report it:
    - `rule_{kind}/pass@1`: the attempt's success, for each ruled kind the task's public plan gathers (per-rule
      success: a task needing two tools counts for both);
    - `fix/{class}`: the share of the attempt's gated gathers whose line is reached holding the right tool, a wrong
      one, every tool, or none (`classify_fix`; a plan that does not parse reports nothing);
    - `fix_{item}/{class}`: 1 for the class of the first gather of each held-out gated item (tier 3's items and the
      held-out kind's), 0 for the other classes: where the no-insight policy places a fix it was never taught.
    """
    out: dict[str, float] = {}
    kinds = {KINDS[i] for i in plan(task.spec["target"], task.spec["inventory"]) if i in GATED}
    out |= {f"rule_{kind}/pass@1": float(success) for kind in sorted(kinds)}
    if code is None:
        return out
    try:
        items = parse_plan(code)
    except crafting.PlanError:
        return out
    fixes = classify_fix(items, task)
    if fixes:
        out |= {f"fix/{c}": sum(v == c for v in fixes.values()) / len(fixes) for c in FIX_CLASSES}
    for item, found in fixes.items():
        if item in HELDOUT:
            out |= {f"fix_{item}/{c}": float(found == c) for c in FIX_CLASSES}
    return out


# ----------------------------------------------------------------------------------------------------
# Tasks and tiers
# ----------------------------------------------------------------------------------------------------

SPLITS = ("train", "valid", "tier1", "tier2", "tier3", "tier4", "train_easy", "eval_easy")
#: The splits that depend on `load_tasks`'s seed; the others are fixed by WORLD_SEED.
SEEDED_SPLITS = ("train", "train_easy")
#: Hard tasks per target drawn for each split (at most: a target's distinct plan keys can run out).
PER_TARGET = {
    "train": 20,
    "valid": 5,
    "tier1": 6,
    "tier2": 18,
    "tier3": 9,
    "tier4": 16,
    "train_easy": 6,
    "eval_easy": 3,
}


def _contents(item: str) -> set[str]:
    return {item, *closure(item)}


def target_tier(target: str) -> str:
    """Which tier a recipe's tasks belong to: "train" (training targets: train, valid, tier1), "tier2", "tier3",
    "tier4", or "easy" (no gated item in its tree: tools and ungated intermediates, train_easy only)."""
    if target not in RECIPES:
        raise ValueError(f"{target!r} is not a recipe item")
    tree = _contents(target)
    if not tree & set(GATED):
        return "easy"
    if any(KINDS.get(i) == HELDOUT_KIND for i in tree):
        return "tier4"
    if tree & set(HELDOUT_ITEMS):
        return "tier3"
    return "tier2" if target in TIER2_TARGETS else "train"


def targets_of(tier: str) -> list[str]:
    """The recipe items whose tasks are in `tier` (see `target_tier`)."""
    return [t for t in RECIPES if target_tier(t) == tier]


#: Items a task's inventory may hold besides items of its target's tree: no tool, nothing held out nor containing a
#: held-out item.
_EXTRAS = tuple(i for i in ITEMS if i not in TOOLS and not _contents(i) & set(HELDOUT))
#: Items of the tools' recipe trees: held, they change the oracle plan.
_TOOL_TREES = frozenset(i for t in TOOLS for i in closure(t))


def plan_key(target: str, inventory: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """The target and the held items that can change its public or oracle plan (items of the target's or a tool's
    recipe tree): tasks with one plan key have one public plan and one oracle plan."""
    relevant = set(closure(target)) | _TOOL_TREES
    return target, tuple(sorted(i for i in inventory if i in relevant))


def first_gated_line(target: str, inventory: Sequence[str]) -> int:
    """The 1-based line of the public plan's first gated gather (0: none)."""
    lines = gated_gathers(plan(target, inventory))
    return lines[0] if lines else 0


def _fits(tier: str, target: str, inventory: Sequence[str]) -> bool:
    """Whether a drawn (target, inventory) is a task of `tier`'s hard split: the public plan fails, not on line 1;
    tier 3 gathers a held-out item, tier 4 a fish."""
    items = plan(target, inventory)
    lines = gated_gathers(items)
    if not lines or lines[0] == 1:
        return False
    gathered = {items[n - 1] for n in lines}
    if tier == "tier3":
        return bool(gathered & set(HELDOUT_ITEMS))
    if tier == "tier4":
        return any(KINDS[i] == HELDOUT_KIND for i in gathered)
    return True


def _draw(
    targets: Sequence[str],
    split: str,
    rng: np.random.Generator,
    accept: Callable[[str, list[str]], bool],
    exclude: AbstractSet[tuple[str, tuple[str, ...]]] = frozenset(),
) -> list[Task]:
    """Up to PER_TARGET[split] tasks per target with distinct plan keys outside `exclude`."""
    per_target = PER_TARGET[split]
    tasks: list[Task] = []
    for target in targets:
        seen: set[tuple[str, tuple[str, ...]]] = set()
        for _ in range(per_target * 60):
            inventory = WORLD.draw_inventory(target, rng, _EXTRAS)
            key = plan_key(target, inventory)
            if key in seen or key in exclude or not accept(target, inventory):
                continue
            seen.add(key)
            tasks.append(_task(target, inventory, split))
            if len(seen) == per_target:
                break
    return tasks


def _heldin_fixed() -> dict[str, list[Task]]:
    """`valid` and `tier1`: fixed hard tasks of the training targets, with distinct plan keys."""
    rng = np.random.default_rng([WORLD_SEED, 1])
    targets = targets_of("train")
    valid = _draw(targets, "valid", rng, lambda t, inv: _fits("train", t, inv))
    taken = {plan_key(t.spec["target"], t.spec["inventory"]) for t in valid}
    tier1 = _draw(targets, "tier1", rng, lambda t, inv: _fits("train", t, inv), taken)
    return {"valid": valid, "tier1": tier1}


_CACHE: dict[tuple[str, int], list[Task]] = {}


def generate_tasks(split: str, *, seed: int = 0) -> list[Task]:
    """The tasks of `split` (module docstring). `train` and `train_easy` are drawn with `seed`; every other split
    from WORLD_SEED, whatever `seed` is. Deterministic."""
    if split not in SPLITS:
        raise ValueError(f"unknown forge split {split!r}; choose one of {', '.join(SPLITS)}")
    key = (split, seed if split in SEEDED_SPLITS else 0)
    if key not in _CACHE:
        _CACHE[key] = _generate(split, seed)
    return list(_CACHE[key])


def _generate(split: str, seed: int) -> list[Task]:
    if split in ("valid", "tier1"):
        return _heldin_fixed()[split]
    if split == "train":
        fixed = generate_tasks("valid") + generate_tasks("tier1")
        taken = {plan_key(t.spec["target"], t.spec["inventory"]) for t in fixed}
        rng = np.random.default_rng([seed, 7919])
        return _draw(targets_of("train"), split, rng, lambda t, inv: _fits("train", t, inv), taken)
    if split in ("tier2", "tier3", "tier4"):
        rng = np.random.default_rng([WORLD_SEED, 2 + SPLITS.index(split)])
        return _draw(targets_of(split), split, rng, lambda t, inv: _fits(split, t, inv))

    def easy(target: str, inventory: list[str]) -> bool:
        return not is_hard(target, inventory)

    if split == "train_easy":
        rng = np.random.default_rng([seed, 7919, 1])
        return _draw(targets_of("easy") + targets_of("train"), split, rng, easy)
    rng = np.random.default_rng([WORLD_SEED, 9])
    return _draw(targets_of("tier2") + targets_of("tier3") + targets_of("tier4"), split, rng, easy)


def load_tasks(split: str, seed: int = 0) -> list[Task]:
    """`generate_tasks`, also for splits joined with "+" (`tier2+tier3`)."""
    return [t for part in split.split("+") for t in generate_tasks(part, seed=seed)]


# ----------------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------------


class ForgeEnv(crafting.CraftingEnv):
    """The Env of forge tasks (`crafting.CraftingEnv` on this world, as `CraftEnv` is on craft's): one step per
    attempt (the whole plan), parsed and replayed; `verify()` reports the first failed requirement."""

    def __init__(self) -> None:
        super().__init__(WORLD)


# ----------------------------------------------------------------------------------------------------
# Pretraining demonstrations and control insights
# ----------------------------------------------------------------------------------------------------

#: Items without a gated item in their tree whose public plan from an empty inventory has at most four actions
#: (every tool is one): what a made-up requirement may name.
CHEAP_ITEMS = tuple(i for i in ITEMS if len(plan(i)) <= 4 and not _contents(i) & set(GATED))
#: Cheap items that are no tool: what the uninformative control names.
CONTROL_ITEMS = tuple(i for i in CHEAP_ITEMS if i not in TOOLS)
UNGATED_RAW = tuple(i for i in RAW if i not in GATED)


def made_up_requirements(
    target: str, inventory: Sequence[str], rng: np.random.Generator, n: int
) -> list[tuple[str, str]]:
    """Up to `n` requirements (item, raw) for a demonstration, shaped like the hidden rules: `raw` is gathered by the
    public plan, `item` one of `CHEAP_ITEMS` outside the target's tree whose own recipe does not gather `raw`; a
    tool only when the plan gathers no item of its kind (so never a hidden pair, and no gated gather of the plan
    happens with its tool held); no two interfere."""

    def allowed(item: str, raw: str, gathered: Sequence[str]) -> bool:
        return item not in {tool_for(i) for i in gathered}  # (not the tool of a kind the plan gathers)

    return crafting.made_up_requirements(WORLD, target, inventory, rng, n, items=CHEAP_ITEMS, allowed=allowed)


#: Items a demonstration's inventory may hold besides items of its target's tree: anything but a tool.
_DEMO_EXTRAS = tuple(i for i in ITEMS if i not in TOOLS)


def demonstration(rng: np.random.Generator, **options: Any) -> Demonstration:
    """A random pretraining example (`crafting.demonstration` on this world): any recipe as target (held-out ones
    included), a random inventory without tools, and with probability `insight_prob` one or two made-up requirements
    shown as up to `max_insights` insight messages that the plan obeys; with probability `statement_prob` (drawn
    first) the insights instead state true public rules of the plan (`statements=True`); `options` are
    `crafting.demonstration`'s (insight_prob, max_insights, statement_prob, write_prob, reword_prob). Every wording
    of a made-up requirement names the same (item, raw) pair, so none is a hidden rule."""
    demo = crafting.demonstration(
        WORLD,
        rng,
        made_up=made_up_requirements,
        extras=_DEMO_EXTRAS,
        **options,
    )
    target, inventory = demo.task.spec["target"], demo.task.spec["inventory"]
    if chance_fixes(demo.plan, inventory):  # (impossible by construction; a hidden rule must never reach pretraining)
        raise AssertionError(f"a demonstration meets a hidden rule: {target!r}, {inventory}, {list(demo.plan)}")
    return demo


def uninformative_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight of the form and token length of a real one that names neither a tool nor a gated item:
    `you have "X" before gather("Y")` for an ungated raw item Y and a cheap ungated item X that is no tool (a tool
    named by chance could fix a gated gather; a gated Y would point at the kind that fails). Deterministic per
    (insight, task, seed)."""
    rng = crafting.hashed_rng(f"{seed}|{task.task_id}|{insight}")
    while True:
        before, item = str(rng.choice(UNGATED_RAW)), str(rng.choice(CONTROL_ITEMS))
        if item != before and before not in closure(item):
            return insight_text(requirement(item, before))


def shuffled_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight (not in the paper), the insights shuffled across tasks: a real hidden rule as the verifier
    states it (`you have "shears" before gather("wool")`), so true of the world and informative for other tasks, but
    about a kind this task's plans never gather, so not about its failure. Only trained gated items are named (never
    a tier-3 item or the held-out kind). Deterministic per (insight, task, seed)."""
    rng = crafting.hashed_rng(f"shuffled|{seed}|{task.task_id}|{insight}")
    kinds = {KINDS[i] for i in plan(task.spec["target"], task.spec["inventory"]) if i in GATED}
    item = str(rng.choice([i for i in TRAINED_GATED if KINDS[i] not in kinds]))
    return insight_text(requirement(HIDDEN_RULES[KINDS[item]], item))


def world_description() -> dict[str, Any]:
    """The public rulebook, the hidden rules and the tiers, for reports and notebooks."""
    return {
        "kinds": dict(KINDS),
        "recipes": {k: list(v) for k, v in RECIPES.items()},
        "hidden_rules": dict(HIDDEN_RULES),
        "tools": list(TOOLS),
        "trained_gated_items": list(TRAINED_GATED),
        "heldout_items": list(HELDOUT_ITEMS),
        "heldout_kind": HELDOUT_KIND,
        "targets": {tier: targets_of(tier) for tier in ("train", "tier2", "tier3", "tier4", "easy")},
        "splits": list(SPLITS),
        "seeded_splits": list(SEEDED_SPLITS),
    }


def world_stats(seed: int = 0) -> dict[str, Any]:
    """The numbers that describe the world's tasks (for reports and the tests): tasks per split, distinct targets,
    public- and oracle-plan lengths (min, median, max); over the hard splits' public plans, the line of the first
    gated gather, the line of the first gather of each ruled kind (where each fix goes) and how many tools a task
    needs; and how many recipes hold each gated item in their tree."""
    out: dict[str, Any] = {"splits": {}}
    first: collections.Counter[int] = collections.Counter()
    fixes: collections.Counter[int] = collections.Counter()
    tools: collections.Counter[int] = collections.Counter()
    for split in SPLITS:
        tasks = generate_tasks(split, seed=seed)
        public = [len(plan(t.spec["target"], t.spec["inventory"])) for t in tasks]
        oracle = [len(oracle_plan(t.spec["target"], t.spec["inventory"])) for t in tasks]
        out["splits"][split] = {
            "tasks": len(tasks),
            "targets": len({t.spec["target"] for t in tasks}),
            "public_len": (min(public), statistics.median(public), max(public)),
            "oracle_len": (min(oracle), statistics.median(oracle), max(oracle)),
        }
        if split.endswith("_easy"):
            continue
        for t in tasks:
            items = plan(t.spec["target"], t.spec["inventory"])
            kinds = {KINDS[items[n - 1]]: n for n in reversed(gated_gathers(items))}  # kind -> its first gather
            first[min(kinds.values())] += 1
            fixes.update(kinds.values())
            tools[len(kinds)] += 1
    out["first_gated_line"] = dict(sorted(first.items()))
    out["fix_lines"] = dict(sorted(fixes.items()))
    out["tools_needed"] = dict(sorted(tools.items()))
    out["recipes_holding"] = {g: sum(g in closure(r) for r in RECIPES) for g in GATED}
    return out


# ----------------------------------------------------------------------------------------------------
# The environment's spec
# ----------------------------------------------------------------------------------------------------


def _fingerprint() -> str:
    """A hash of every split's tasks (seed 0) and of a fixed sample of demonstrations (with and without statements)."""
    return crafting.fingerprint(SPLITS, generate_tasks, demonstration)


def _make_env(limits: SandboxLimits) -> ForgeEnv:
    return ForgeEnv()  # plans are parsed, never executed: no sandbox


#: The second world of the small-scale replication: hidden rules over kinds, four evaluation tiers.
SPEC = register(
    EnvSpec(
        name=ENV,
        load_tasks=load_tasks,
        make_env=_make_env,
        task_prompt=PLAN_PROMPT,
        writer_prompt="device",
        rule_failure=requirement_failure,
        demonstrations=crafting.pretrain_examples(WORLD, demonstration),
        uninformative_insight=uninformative_insight,
        shuffled_insight=shuffled_insight,
        world_fingerprint=_fingerprint,
        evaluation_probes=evaluation_probes,
        reference_plans=WORLD.reference_plans,
    )
)
