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
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rltldr_jax.envs.base import StepResult, Task, Verdict
from rltldr_jax.envs.reports import requirement_failure
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import PLAN_PROMPT, EnvSpec, PretrainExample, register

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
VERBS = ("gather", "craft")
_LINE = re.compile(r'(gather|craft)\("([a-z]+)"\)')


def action(item: str) -> str:
    """The plan line that obtains `item`: `gather("wood")` or `craft("torch")`."""
    if item not in ITEMS:
        raise ValueError(f"unknown item {item!r}")
    return f'{"gather" if item in RAW else "craft"}("{item}")'


def requirement(item: str, before: str) -> str:
    """A requirement in the verifier's words (and, after "Make sure that", the insight's):
    `you have "torch" before gather("iron")`."""
    return f'you have "{item}" before {action(before)}'


def goal_text(target: str, inventory: Sequence[str]) -> str:
    """The task's instruction: `Craft "compass". Inventory: "coal", "sand".`"""
    held = ", ".join(f'"{i}"' for i in sorted(inventory)) if inventory else "nothing"
    return f'Craft "{target}". Inventory: {held}.'


# ----------------------------------------------------------------------------------------------------
# Planning and execution
# ----------------------------------------------------------------------------------------------------


def plan(target: str, inventory: Iterable[str] = (), requirements: Iterable[tuple[str, str]] = ()) -> list[str]:
    """The public planner: the items to obtain, in order (one action each), so that `target` ends in the inventory.

    Depth first over the public recipes: before an item's own action, each missing ingredient is obtained in
    recipe order; held items are used (and consumed) instead. `requirements` are (item, raw) pairs meaning "have
    `item` when gathering `raw`", as the hidden rules and the insights state them: right before such a gather,
    the required item is obtained (its own plan) unless held. This is how a demonstration obeys its insights and
    how `oracle_plan` meets the hidden rules; the public planner itself knows none.

    Returns:
      items, one per action (`action(item)` gives the line).
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
    return plan(target, inventory, [(tool, raw) for raw, tool in HIDDEN_RULES.items()])


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What replaying a plan does.

    Attributes:
      inventory: item -> count after the plan (or after the failed line).
      failed_line: 1-based line that failed, 0 if none did.
      missing: the item whose absence failed that line ("" if none).
    """

    inventory: Mapping[str, int]
    failed_line: int
    missing: str


def execute(items: Sequence[str], inventory: Iterable[str], *, hidden: bool = True) -> Outcome:
    """Replays a plan (items to obtain, in order) from `inventory`; stops at the first action whose requirement
    is not met: a missing ingredient, or (with `hidden`) a hidden rule's missing tool."""
    held: dict[str, int] = {}
    for item in inventory:
        held[item] = held.get(item, 0) + 1
    for n, item in enumerate(items, 1):
        needs = RECIPES.get(item, ())
        tool = HIDDEN_RULES.get(item) if hidden else None
        for ingredient in needs:
            if held.get(ingredient, 0) < needs.count(ingredient):
                return Outcome(held, n, ingredient)
        if tool and not held.get(tool, 0):
            return Outcome(held, n, tool)
        for ingredient in needs:
            held[ingredient] -= 1
        held[item] = held.get(item, 0) + 1
    return Outcome(held, 0, "")


class PlanError(ValueError):
    """A plan line that is not `gather("item")` / `craft("item")` with a known item."""

    def __init__(self, line: int, text: str, why: str):
        super().__init__(f"line {line}: {why}")
        self.line, self.text, self.why = line, text, why


def parse_plan(code: str) -> list[str]:
    """The items a plan's lines obtain. Blank lines are skipped; anything else must be exactly one call per line:
    `gather("raw item")` or `craft("recipe item")` (the verb must match the item). Raises PlanError."""
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


# ----------------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------------

SPLITS = ("train", "eval", "train_easy", "eval_easy")


def is_hard(target: str, inventory: Sequence[str]) -> bool:
    """True when the public plan fails under the hidden rules (a hidden rule's tool is missing when needed)."""
    return execute(plan(target, inventory), inventory).failed_line > 0


def _closure(target: str) -> list[str]:
    """Every item in `target`'s public recipe tree (the target excluded), in first-use order."""
    seen: list[str] = []

    def walk(item: str) -> None:
        for ingredient in RECIPES.get(item, ()):
            if ingredient not in seen:
                seen.append(ingredient)
                walk(ingredient)

    walk(target)
    return seen


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
        tree = _closure(target)
        others = [i for i in ITEMS if i not in tree and i != target]
        seen: set[tuple[str, ...]] = set()
        for _ in range(per_target * 8):
            inventory = [i for i in tree if rng.random() < 0.3]
            inventory += [str(x) for x in rng.choice(others, size=int(rng.integers(0, 3)), replace=False)]
            key = tuple(sorted(inventory))
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

_FORMAT_REQUIREMENT = 'the plan is one Python code block with one gather("item") or craft("item") call per line'


def _report(failures: Sequence[str]) -> str:
    return "\n".join(f">> Failed Requirement\nassert {f}" for f in failures)


class CraftEnv:
    """Implements the Env protocol (envs/base.py) for craft tasks: one step per attempt (the whole plan).

    `step(code)` parses the plan and replays it; the observation says how far it got (which line failed, not
    why) and the attempt is done. `verify()` checks that the target is in the inventory at the end and reports
    the first failed requirement (privileged: only the insight writer reads it).
    """

    def __init__(self) -> None:
        self.task: Task | None = None
        self._failures: tuple[str, ...] | None = None

    def reset(self, task: Task) -> str:
        if task.env != ENV:
            raise ValueError(f"CraftEnv got a task of environment {task.env!r}")
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


def insight_text(req: str) -> str:
    """A requirement as the rule-based insight writer phrases it (`agent.rule_insight.rule_insight`)."""
    return f"Make sure that {req}."


def plan_lines(items: Sequence[str]) -> str:
    """The plan's code: one call per line (what `CraftEnv.step` takes)."""
    return "".join(action(i) + "\n" for i in items)


def plan_code(items: Sequence[str]) -> str:
    """The plan as the policy writes it: a fenced Python block, one call per line."""
    return "```python\n" + plan_lines(items) + "```"


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
    tree = {target, *_closure(target)}
    gathered = [i for i in dict.fromkeys(plan(target, inventory)) if i in RAW]
    pairs = [
        (i, b)
        for b in gathered
        for i in CHEAP_ITEMS
        if i not in tree and b not in _closure(i) and HIDDEN_RULES.get(b) != i
    ]
    picked: list[tuple[str, str]] = []
    for k in rng.permutation(len(pairs)):
        item, raw = pairs[k]
        if all(
            item != i
            and item not in _closure(i)
            and i not in _closure(item)
            and raw not in _closure(i)
            and b not in _closure(item)
            for i, b in picked
        ):
            picked.append(pairs[k])
        if len(picked) == n:
            break
    return picked


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One pretraining example: a task, the insights in its context (oldest first, with the attempt numbers
    they name), and the plan that obeys them under the public rules. `statements`: the insights state true public
    rules of this plan (the declarative-pretraining experiment), so they are predictable from the task."""

    task: Task
    insights: tuple[tuple[str, int], ...]
    plan: tuple[str, ...]
    statements: bool = False


def public_statements(target: str, inventory: Sequence[str], rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    """Up to `n` true public rules of the plan as requirements (ingredient, crafted item): `you have "coal" before
    craft("ingot")` for a craft of the public plan (never a hidden rule: those are about gathers)."""
    crafted = [i for i in dict.fromkeys(plan(target, inventory)) if i in RECIPES]
    pairs = [(ingredient, item) for item in crafted for ingredient in RECIPES[item]]
    return [pairs[k] for k in rng.permutation(len(pairs))[:n]]


def demonstration(
    rng: np.random.Generator, *, insight_prob: float = 0.6, max_insights: int = 4, statement_prob: float = 0.0
) -> Demonstration:
    """A random pretraining example (module docstring): any target, a random inventory, and with probability
    `insight_prob` one or two made-up requirements shown as up to `max_insights` insight messages (repeats
    included, as a run's consecutive failures write them) that the plan obeys: each required item is obtained right
    before the gather that needs it. With probability `statement_prob` (drawn first) the insights instead state one
    or two true public rules of the public plan (`statements=True`), which pretraining can train as targets."""
    target = str(rng.choice(list(RECIPES)))
    tree = _closure(target)
    others = [i for i in ITEMS if i not in tree and i != target]
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
    return Demonstration(_task(target, inventory, "pretrain"), tuple(insights), tuple(items), statements)


def uninformative_insight(insight: str, task: Task, seed: int) -> str:
    """A control insight (not in the paper) of the form and token length of a real one but with no information:
    `you have "X" before gather("Y")` for a random raw item Y and a random cheap item X that is not a hidden
    rule's tool (a tool named by chance could fix a gated gather elsewhere in the plan). Deterministic per
    (insight, task, seed)."""
    digest = hashlib.blake2b(f"{seed}|{task.task_id}|{insight}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
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


def _demonstrations(
    *, insight_prob: float = 0.6, max_insights: int = 4, statement_prob: float = 0.0
) -> Callable[[np.random.Generator], PretrainExample]:
    def draw(rng: np.random.Generator) -> PretrainExample:
        demo = demonstration(rng, insight_prob=insight_prob, max_insights=max_insights, statement_prob=statement_prob)
        return demo.task, demo.insights, plan_code(demo.plan), demo.statements

    return draw


def _fingerprint() -> str:
    """A hash of every split's tasks and of a fixed sample of demonstrations (with and without statements)."""
    h = hashlib.sha256()
    for split in SPLITS:
        h.update("".join(t.to_json() for t in generate_tasks(split)).encode())
    rng = np.random.default_rng(0)
    for statement_prob in (0.0, 0.5):
        for _ in range(300):
            h.update(repr(demonstration(rng, statement_prob=statement_prob)).encode())
    return h.hexdigest()[:12]


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
        demonstrations=_demonstrations,
        uninformative_insight=uninformative_insight,
        world_fingerprint=_fingerprint,
    )
)
