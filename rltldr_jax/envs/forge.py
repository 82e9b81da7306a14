"""A second crafting world with hidden rules over item *kinds*: `env.name = "forge"`.

Round one's world (`envs/craft.py`, kept as it is) had three hidden rules on three single items, each gated item in
few recipes and always first in the public plan of a hard training task, and held-out *targets* that reused trained
gated subtrees: its held-out split tested new targets, not new rules. This world keeps craft's mechanics (plans of
one `gather("item")` / `craft("item")` per line, parsed and never executed; the same verifier report, insights,
demonstrations and controls) and changes what the rules are about and what the evaluation holds out.

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
some demonstrations state true public rules of their plan instead (about crafts, never gathers).

**Controls.** `uninformative_insight` gives a sentence of the same form and token length as a real insight that
names neither a tool nor a gated item (`you have "plank" before gather("sand")`). `classify_fix` is the probe for
analyses: for each gated gather of a plan, whether the right tool, only a wrong one, every tool or none is held.
"""

from __future__ import annotations

import collections
import hashlib
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from rltldr_jax.envs.base import StepResult, Task, Verdict

# the shared record types and report format (envs/crafting.py), so that both worlds' reports and insights read the same
from rltldr_jax.envs.crafting import FORMAT_REQUIREMENT as _FORMAT_REQUIREMENT
from rltldr_jax.envs.crafting import Demonstration, Outcome, PlanError, insight_text
from rltldr_jax.envs.crafting import report as _report
from rltldr_jax.envs.reports import requirement_failure
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import PLAN_PROMPT, EnvSpec, PretrainExample, register

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
VERBS = ("gather", "craft")
_LINE = re.compile(r'(gather|craft)\("([a-z]+)"\)')

#: The seed of every split that must not depend on the run's seed (valid, tier1-tier4, eval_easy).
WORLD_SEED = 20260


def tool_for(item: str) -> str | None:
    """The tool a hidden rule requires to gather `item` (None: not gated)."""
    return HIDDEN_RULES.get(KINDS.get(item, ""))


def action(item: str) -> str:
    """The plan line that obtains `item`: `gather("iron")` or `craft("steel")`."""
    if item not in ITEMS:
        raise ValueError(f"unknown item {item!r}")
    return f'{"gather" if item in RAW else "craft"}("{item}")'


def requirement(item: str, before: str) -> str:
    """A requirement in the verifier's words: `you have "pickaxe" before gather("iron")`."""
    return f'you have "{item}" before {action(before)}'


# ----------------------------------------------------------------------------------------------------
# Planning and execution (craft's algorithms on this world's tables)
# ----------------------------------------------------------------------------------------------------


def closure(target: str) -> list[str]:
    """Every item in `target`'s public recipe tree (the target excluded), in first-use order."""
    seen: list[str] = []

    def walk(item: str) -> None:
        for ingredient in RECIPES.get(item, ()):
            if ingredient not in seen:
                seen.append(ingredient)
                walk(ingredient)

    walk(target)
    return seen


def goal_text(target: str, inventory: Sequence[str]) -> str:
    """The task's instruction, with the public kind of every raw item of the target's recipe tree:
    `Craft "steel". Inventory: "coal". Raw: "coal" fuel, "iron" ore, "tin" ore.`"""
    held = ", ".join(f'"{i}"' for i in sorted(inventory)) if inventory else "nothing"
    raw = ", ".join(f'"{i}" {KINDS[i]}' for i in sorted(i for i in closure(target) if i in KINDS))
    return f'Craft "{target}". Inventory: {held}.' + (f" Raw: {raw}." if raw else "")


def plan(target: str, inventory: Iterable[str] = (), requirements: Iterable[tuple[str, str]] = ()) -> list[str]:
    """The public planner (craft's `plan` on this world): the items to obtain, in order, so that `target` ends in the
    inventory. Depth first over the public recipes, held items used (and consumed) instead of obtained.
    `requirements` are (item, raw) pairs, "have `item` when gathering `raw`": right before such a gather the item is
    obtained (its own plan) unless held — how demonstrations obey insights and `oracle_plan` meets the hidden rules.
    """
    need: dict[str, list[str]] = {}
    for item, raw in requirements:
        if item not in ITEMS or raw not in RAW:
            raise ValueError(f"a requirement names an item and a raw item it is needed for; got ({item!r}, {raw!r})")
        need.setdefault(raw, []).append(item)
    if target not in ITEMS:
        raise ValueError(f"unknown item {target!r}")
    held: collections.Counter[str] = collections.Counter(inventory)
    out: list[str] = []

    def obtain(item: str, depth: int = 0) -> None:
        if depth > 16:
            raise ValueError(f"the requirements around {item!r} form a cycle")
        for required in need.get(item, ()):
            if not held[required]:
                obtain(required, depth + 1)
        for ingredient in RECIPES.get(item, ()):
            if not held[ingredient]:
                obtain(ingredient, depth + 1)
            held[ingredient] -= 1
        out.append(item)
        held[item] += 1

    obtain(target)
    return out


def oracle_plan(target: str, inventory: Sequence[str]) -> list[str]:
    """The plan that also knows the hidden rules: each gated gather preceded by its tool's plan (unless held)."""
    return plan(target, inventory, [(tool_for(raw), raw) for raw in GATED])


def execute(items: Sequence[str], inventory: Iterable[str], *, hidden: bool = True) -> Outcome:
    """Replays a plan (items to obtain, in order) from `inventory`; stops at the first action whose requirement
    is not met: a missing ingredient, or (with `hidden`) a hidden rule's missing tool."""
    held: dict[str, int] = {}
    for item in inventory:
        held[item] = held.get(item, 0) + 1
    for n, item in enumerate(items, 1):
        needs = RECIPES.get(item, ())
        tool = tool_for(item) if hidden else None
        for ingredient in needs:
            if held.get(ingredient, 0) < needs.count(ingredient):
                return Outcome(held, n, ingredient)
        if tool and not held.get(tool, 0):
            return Outcome(held, n, tool)
        for ingredient in needs:
            held[ingredient] -= 1
        held[item] = held.get(item, 0) + 1
    return Outcome(held, 0, "")


def parse_plan(code: str) -> list[str]:
    """The items a plan's lines obtain: one `gather("raw item")` or `craft("recipe item")` per line (the verb must
    match the item), blank lines skipped. Raises craft's PlanError."""
    items = []
    for n, raw in enumerate(code.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _LINE.fullmatch(line)
        if not m:
            raise PlanError(n, line, 'not a gather("item") or craft("item") call')
        verb, item = m.groups()
        if item not in ITEMS:
            raise PlanError(n, line, f"unknown item {item!r}")
        if (verb == "gather") != (item in RAW):
            raise PlanError(n, line, f"{item!r} is {'gathered' if item in RAW else 'crafted'}, not {verb}ed")
        items.append(item)
    return items


def gated_gathers(items: Sequence[str]) -> list[int]:
    """The 1-based lines of a plan that gather a gated item."""
    return [n for n, item in enumerate(items, 1) if item in GATED]


def is_hard(target: str, inventory: Sequence[str]) -> bool:
    """True when the public plan fails under the hidden rules (a tool is missing when needed)."""
    return execute(plan(target, inventory), inventory).failed_line > 0


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


def _task(target: str, inventory: Sequence[str], split: str) -> Task:
    inv = tuple(sorted(inventory))
    key = target + ":" + ",".join(inv)
    return Task(
        f"{ENV}/{target}/{hashlib.blake2b(key.encode(), digest_size=5).hexdigest()}",
        goal_text(target, inv),
        ENV,
        split,
        {"target": target, "inventory": list(inv)},
    )


def _inventory(target: str, rng: np.random.Generator) -> list[str]:
    """Each item of the target's tree held with probability 0.3, plus up to two extras (`_EXTRAS` outside it)."""
    tree = closure(target)
    others = [i for i in _EXTRAS if i not in tree and i != target]
    inventory = [i for i in tree if rng.random() < 0.3]
    return inventory + [str(x) for x in rng.choice(others, size=int(rng.integers(0, 3)), replace=False)]


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
            inventory = _inventory(target, rng)
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


class ForgeEnv:
    """Implements the Env protocol (envs/base.py) for forge tasks, as `CraftEnv` does for craft's: one step per
    attempt (the whole plan), parsed and replayed; `verify()` reports the first failed requirement."""

    def __init__(self) -> None:
        self.task: Task | None = None
        self._failures: tuple[str, ...] | None = None

    def reset(self, task: Task) -> str:
        if task.env != ENV:
            raise ValueError(f"ForgeEnv got a task of environment {task.env!r}")
        self.task, self._failures = task, None
        return task.goal

    def step(self, code: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self._failures is not None:
            return StepResult("The plan was already run.", True)
        target, inventory = self.task.spec["target"], list(self.task.spec["inventory"])
        try:
            items = parse_plan(code)
        except PlanError as e:
            self._failures = (f'line {e.line} is a gather("item") or craft("item") call with a known item',)
            return StepResult(f"Error on line {e.line}: {e.why}. Nothing was done.", True)
        if not items:
            self._failures = (_FORMAT_REQUIREMENT,)
            return StepResult("The plan is empty. Nothing was done.", True)
        outcome = execute(items, inventory)
        if outcome.failed_line:
            item = items[outcome.failed_line - 1]
            self._failures = (requirement(outcome.missing, item),)
            return StepResult(f"Line {outcome.failed_line} failed: {action(item)}. The plan stopped there.", True)
        if not outcome.inventory.get(target, 0):
            self._failures = (f'you have "{target}" at the end of the plan',)
            return StepResult(f'All {len(items)} lines ran; "{target}" is not in the inventory.', True)
        self._failures = ()
        return StepResult(f"All {len(items)} lines ran.", True)

    def verify(self) -> Verdict:
        if self.task is None:
            raise RuntimeError("call reset(task) before verify()")
        failures = (_FORMAT_REQUIREMENT,) if self._failures is None else self._failures
        return Verdict(not failures, _report(failures), 0 if failures else 1, 1, failures)

    def close(self) -> None:
        self.task = None


# ----------------------------------------------------------------------------------------------------
# Pretraining demonstrations and control insights
# ----------------------------------------------------------------------------------------------------


def plan_lines(items: Sequence[str]) -> str:
    """The plan's code: one call per line (what `ForgeEnv.step` takes)."""
    return "".join(action(i) + "\n" for i in items)


def plan_code(items: Sequence[str]) -> str:
    """The plan as the policy writes it: a fenced Python block, one call per line."""
    return "```python\n" + plan_lines(items) + "```"


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
    tree = {target, *closure(target)}
    gathered = [i for i in dict.fromkeys(plan(target, inventory)) if i in RAW]
    needed_tools = {tool_for(i) for i in gathered}  # (the tools of the kinds the plan gathers)
    pairs = [
        (i, b) for b in gathered for i in CHEAP_ITEMS if i not in tree and b not in closure(i) and i not in needed_tools
    ]
    picked: list[tuple[str, str]] = []
    for k in rng.permutation(len(pairs)):
        item, raw = pairs[k]
        if all(
            item != i
            and item not in closure(i)
            and i not in closure(item)
            and raw not in closure(i)
            and b not in closure(item)
            for i, b in picked
        ):
            picked.append(pairs[k])
        if len(picked) == n:
            break
    return picked


def public_statements(target: str, inventory: Sequence[str], rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    """Up to `n` true public rules of the plan as requirements (ingredient, crafted item): `you have "coal" before
    craft("steel")` (never a hidden rule: those are about gathers)."""
    crafted = [i for i in dict.fromkeys(plan(target, inventory)) if i in RECIPES]
    pairs = [(ingredient, item) for item in crafted for ingredient in RECIPES[item]]
    return [pairs[k] for k in rng.permutation(len(pairs))[:n]]


def demonstration(
    rng: np.random.Generator, *, insight_prob: float = 0.6, max_insights: int = 4, statement_prob: float = 0.0
) -> Demonstration:
    """A random pretraining example (craft's `demonstration` on this world): any recipe as target (held-out ones
    included), a random inventory without tools, and with probability `insight_prob` one or two made-up requirements
    shown as up to `max_insights` insight messages that the plan obeys; with probability `statement_prob` (drawn
    first) the insights instead state true public rules of the plan (`statements=True`)."""
    target = str(rng.choice(list(RECIPES)))
    tree = closure(target)
    others = [i for i in ITEMS if i not in tree and i != target and i not in TOOLS]
    inventory = [i for i in tree if rng.random() < 0.3] + [
        str(x) for x in rng.choice(others, size=int(rng.integers(0, 3)), replace=False)
    ]
    requirements: list[tuple[str, str]] = []
    insights: list[tuple[str, int]] = []
    statements = bool(statement_prob) and rng.random() < statement_prob
    if statements:
        requirements = public_statements(target, inventory, rng, int(rng.integers(1, 3)))
        statements = bool(requirements)
    elif rng.random() < insight_prob:
        requirements = made_up_requirements(target, inventory, rng, int(rng.integers(1, 3)))
    if requirements:  # (a plan that gathers nothing has nothing to require)
        count = int(rng.integers(len(requirements), max(len(requirements), max_insights) + 1))
        shown = [requirements[k % len(requirements)] for k in range(count)]
        rng.shuffle(shown)
        numbers = np.sort(rng.choice(np.arange(1, 9), size=count, replace=False))
        insights = [(insight_text(requirement(i, b)), int(n)) for (i, b), n in zip(shown, numbers, strict=True)]
    items = plan(target, inventory, [] if statements else requirements)
    if chance_fixes(items, inventory):  # (impossible by construction; a hidden rule must never reach pretraining)
        raise AssertionError(f"a demonstration meets a hidden rule: {target!r}, {inventory}, {items}")
    return Demonstration(_task(target, inventory, "pretrain"), tuple(insights), tuple(items), statements)


def uninformative_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight of the form and token length of a real one that names neither a tool nor a gated item:
    `you have "X" before gather("Y")` for an ungated raw item Y and a cheap ungated item X that is no tool (a tool
    named by chance could fix a gated gather; a gated Y would point at the kind that fails). Deterministic per
    (insight, task, seed)."""
    digest = hashlib.blake2b(f"{seed}|{task.task_id}|{insight}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    while True:
        before, item = str(rng.choice(UNGATED_RAW)), str(rng.choice(CONTROL_ITEMS))
        if item != before and before not in closure(item):
            return insight_text(requirement(item, before))


def shuffled_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight (not in the paper), the insights shuffled across tasks: a real hidden rule as the verifier
    states it (`you have "shears" before gather("wool")`), so true of the world and informative for other tasks, but
    about a kind this task's plans never gather, so not about its failure. Only trained gated items are named (never
    a tier-3 item or the held-out kind). Deterministic per (insight, task, seed)."""
    digest = hashlib.blake2b(f"shuffled|{seed}|{task.task_id}|{insight}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
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


def _demonstrations(
    *, insight_prob: float = 0.6, max_insights: int = 4, statement_prob: float = 0.0
) -> Callable[[np.random.Generator], PretrainExample]:
    def draw(rng: np.random.Generator) -> PretrainExample:
        demo = demonstration(rng, insight_prob=insight_prob, max_insights=max_insights, statement_prob=statement_prob)
        return demo.task, demo.insights, plan_code(demo.plan), demo.statements

    return draw


def _fingerprint() -> str:
    """A hash of every split's tasks (seed 0) and of a fixed sample of demonstrations (with and without statements)."""
    h = hashlib.sha256()
    for split in SPLITS:
        h.update("".join(t.to_json() for t in generate_tasks(split)).encode())
    rng = np.random.default_rng(0)
    for statement_prob in (0.0, 0.5):
        for _ in range(300):
            h.update(repr(demonstration(rng, statement_prob=statement_prob)).encode())
    return h.hexdigest()[:12]


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
        demonstrations=_demonstrations,
        uninformative_insight=uninformative_insight,
        shuffled_insight=shuffled_insight,
        world_fingerprint=_fingerprint,
    )
)
