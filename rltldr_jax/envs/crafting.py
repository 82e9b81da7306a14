"""What the crafting worlds share: the small-scale replication's `envs/craft.py` (round one) and `envs/forge.py`
(round two) are one mechanism over two rulebooks, and the mechanism is written once, here, over a `World`.

A `World` describes a rulebook: its raw items, its public recipes, how its hidden rules gate a gather (`tool_for`:
raw item -> the tool that must be held, or None), its environment name and its task text. On it this module
gives:

- the plan language: one `gather("item")` / `craft("item")` call per line (`World.action`), parsed and never
  executed (`World.parse_plan`, `PlanError`), and a plan's text (`World.plan_lines`, `World.plan_code`);
- the public planner (`World.plan`, which also obeys (item, raw) requirements: how `World.oracle_plan` meets the
  hidden rules and how a demonstration obeys its insights), a recipe tree (`World.closure`) and the replay under the
  hidden rules (`World.execute` -> `Outcome`; `World.is_hard`);
- task records (`World.task`) and random starting inventories (`World.draw_inventory`);
- the Env (`CraftingEnv`: one step per attempt, the verifier's report in the SAPI/AppWorld format,
  `>> Failed Requirement` / `assert you have "torch" before gather("iron")`; `requirement`, `insight_text`);
- the pretraining data's shared steps (`Demonstration`, `made_up_requirements`, `World.public_statements`,
  `demonstration`, `pretrain_examples`), the control insights' seeded draws (`hashed_rng`) and the world
  `fingerprint` the pretrained base policies are keyed on.

Each world's module keeps its rules at its top (raw items, recipes, hidden rules, what is held out), builds its
`World`, binds these functions to it under the names it has always exported (`craft.plan`, `forge.execute`, ...)
and holds what is its own: task generation and splits or tiers, the choices its demonstrations make (which items a
made-up requirement may name, which an inventory may hold), its control insights, its analysis probes (forge's
`classify_fix`), `world_description` and its EnvSpec. The behaviour of both worlds is fixed by their fingerprints
(`craft._fingerprint`, `forge._fingerprint`): a change here must leave both unchanged.
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
from rltldr_jax.envs.spec import PretrainExample

VERBS = ("gather", "craft")
_LINE = re.compile(r'(gather|craft)\("([a-z]+)"\)')


def goal_text(target: str, inventory: Sequence[str]) -> str:
    """A task's instruction: `Craft "compass". Inventory: "coal", "sand".` (craft's; forge's adds the raw kinds)."""
    held = ", ".join(f'"{i}"' for i in sorted(inventory)) if inventory else "nothing"
    return f'Craft "{target}". Inventory: {held}.'


def insight_text(req: str) -> str:
    """A requirement as the rule-based insight writer phrases it (`agent.rule_insight.rule_insight`)."""
    return f"Make sure that {req}."


#: The ways a pretraining demonstration may phrase a requirement ("{item}" before "{action}"): the first is the
#: verifier's and the rule-based insight writer's (`insight_text(World.requirement(...))`); pretraining with
#: `reword_prob` > 0 writes a share of its insights and statements in the others, so that insights are sentences the
#: policy reads and writes in more than one form, not one template.
WORDINGS = (
    'Make sure that you have "{item}" before {action}.',
    'Get "{item}" before you {action}.',
    '{action} needs "{item}" in the inventory.',
    'Have "{item}" ready before {action}.',
    'Never {action} without "{item}".',
    'Before {action}, obtain "{item}".',
)


def hashed_rng(key: str) -> np.random.Generator:
    """A generator seeded by a hash of `key`: the control insights' draws, deterministic per (insight, task, seed)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


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


class PlanError(ValueError):
    """A plan line that is not `gather("item")` / `craft("item")` with a known item."""

    def __init__(self, line: int, text: str, why: str):
        super().__init__(f"line {line}: {why}")
        self.line, self.text, self.why = line, text, why


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One pretraining example: a task, the insights in its context (oldest first, with the attempt numbers
    they name), and the plan that obeys them under the public rules. `statements`: the insights state true public
    rules of this plan (the declarative-pretraining experiment), so they are predictable from the task. `written`:
    the (made-up) insights are to be trained as targets too, as the policy's own writing (`write_prob`)."""

    task: Task
    insights: tuple[tuple[str, int], ...]
    plan: tuple[str, ...]
    statements: bool = False
    # (out of the repr: `fingerprint` hashes reprs, and the demonstrations of the defaults must keep their hash)
    written: bool = dataclasses.field(default=False, repr=False)

    @property
    def targets(self) -> bool:
        """Whether pretraining trains the insight sentences too (statements, or written insights)."""
        return self.statements or self.written


# ----------------------------------------------------------------------------------------------------
# A world and the algorithms on it
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class World:
    """A crafting world's rulebook, public and hidden, as the shared algorithms read it.

    Attributes:
      name: the environment's name (`env.name`; `Task.env` and the prefix of task ids).
      raw: the items gathered from the world.
      recipes: public recipes: item -> ingredients, each consumed once, in the order the public planner obtains them.
      tool_for: the hidden rules: item -> the tool a gather of it needs in the inventory (not consumed), None when
        ungated (also for every recipe item). In no public text.
      goal_text: (target, inventory) -> the task's instruction.
      items: raw items, then recipe items (derived).
    """

    name: str
    raw: tuple[str, ...]
    recipes: Mapping[str, tuple[str, ...]]
    tool_for: Callable[[str], str | None]
    goal_text: Callable[[str, Sequence[str]], str]
    items: tuple[str, ...] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", self.raw + tuple(self.recipes))

    def action(self, item: str) -> str:
        """The plan line that obtains `item`: `gather("wood")` or `craft("torch")`."""
        if item not in self.items:
            raise ValueError(f"unknown item {item!r}")
        return f'{"gather" if item in self.raw else "craft"}("{item}")'

    def phrase(self, item: str, before: str, wording: int = 0) -> str:
        """The requirement (`item` held before obtaining `before`) as a sentence in `WORDINGS[wording]` (0: the
        insight writer's, `insight_text(self.requirement(item, before))`)."""
        return WORDINGS[wording].format(item=item, action=self.action(before))

    def requirement(self, item: str, before: str) -> str:
        """A requirement in the verifier's words (and, after "Make sure that", the insight's):
        `you have "torch" before gather("iron")`."""
        return f'you have "{item}" before {self.action(before)}'

    def closure(self, target: str) -> list[str]:
        """Every item in `target`'s public recipe tree (the target excluded), in first-use order."""
        seen: list[str] = []

        def walk(item: str) -> None:
            for ingredient in self.recipes.get(item, ()):
                if ingredient not in seen:
                    seen.append(ingredient)
                    walk(ingredient)

        walk(target)
        return seen

    def plan(
        self, target: str, inventory: Iterable[str] = (), requirements: Iterable[tuple[str, str]] = ()
    ) -> list[str]:
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
            if item not in self.items or raw not in self.raw:
                raise ValueError(
                    f"a requirement names an item and a raw item it is needed for; got ({item!r}, {raw!r})"
                )
            need.setdefault(raw, []).append(item)
        if target not in self.items:
            raise ValueError(f"unknown item {target!r}")
        held: collections.Counter[str] = collections.Counter(inventory)
        out: list[str] = []

        def obtain(item: str, depth: int = 0) -> None:
            if depth > 16:
                raise ValueError(f"the requirements around {item!r} form a cycle")
            for required in need.get(item, ()):
                if not held[required]:
                    obtain(required, depth + 1)
            for ingredient in self.recipes.get(item, ()):
                if not held[ingredient]:
                    obtain(ingredient, depth + 1)
                held[ingredient] -= 1
            out.append(item)
            held[item] += 1

        obtain(target)
        return out

    def oracle_plan(self, target: str, inventory: Sequence[str]) -> list[str]:
        """The plan that also knows the hidden rules: each gated gather preceded by its tool's plan (unless held)."""
        return self.plan(target, inventory, [(tool, raw) for raw in self.raw if (tool := self.tool_for(raw))])

    def execute(self, items: Sequence[str], inventory: Iterable[str], *, hidden: bool = True) -> Outcome:
        """Replays a plan (items to obtain, in order) from `inventory`; stops at the first action whose requirement
        is not met: a missing ingredient, or (with `hidden`) a hidden rule's missing tool."""
        held: dict[str, int] = {}
        for item in inventory:
            held[item] = held.get(item, 0) + 1
        for n, item in enumerate(items, 1):
            needs = self.recipes.get(item, ())
            tool = self.tool_for(item) if hidden else None
            for ingredient in needs:
                if held.get(ingredient, 0) < needs.count(ingredient):
                    return Outcome(held, n, ingredient)
            if tool and not held.get(tool, 0):
                return Outcome(held, n, tool)
            for ingredient in needs:
                held[ingredient] -= 1
            held[item] = held.get(item, 0) + 1
        return Outcome(held, 0, "")

    def is_hard(self, target: str, inventory: Sequence[str]) -> bool:
        """True when the public plan fails under the hidden rules (a tool is missing when needed)."""
        return self.execute(self.plan(target, inventory), inventory).failed_line > 0

    def parse_plan(self, code: str) -> list[str]:
        """The items a plan's lines obtain. Blank lines are skipped; anything else must be exactly one call per
        line: `gather("raw item")` or `craft("recipe item")` (the verb must match the item). Raises PlanError."""
        items = []
        for n, text in enumerate(code.splitlines(), 1):
            line = text.strip()
            if not line:
                continue
            m = _LINE.fullmatch(line)
            if not m:
                raise PlanError(n, line, 'not a gather("item") or craft("item") call')
            verb, item = m.groups()
            if item not in self.items:
                raise PlanError(n, line, f"unknown item {item!r}")
            if (verb == "gather") != (item in self.raw):
                raise PlanError(n, line, f"{item!r} is {'gathered' if item in self.raw else 'crafted'}, not {verb}ed")
            items.append(item)
        return items

    def plan_lines(self, items: Sequence[str]) -> str:
        """The plan's code: one call per line (what the Env's `step` takes)."""
        return "".join(self.action(i) + "\n" for i in items)

    def plan_code(self, items: Sequence[str]) -> str:
        """The plan as the policy writes it: a fenced Python block, one call per line."""
        return "```python\n" + self.plan_lines(items) + "```"

    def reference_plans(self, task: Task) -> dict[str, str]:
        """The plan probe's pair for `task` (EnvSpec.reference_plans): {"oracle": the plan that obeys the hidden
        rules, "public": the public planner's}, each as the policy writes it."""
        target, inventory = task.spec["target"], task.spec["inventory"]
        return {
            "oracle": self.plan_code(self.oracle_plan(target, inventory)),
            "public": self.plan_code(self.plan(target, inventory)),
        }

    def task(self, target: str, inventory: Sequence[str], split: str) -> Task:
        """The task "obtain `target` from `inventory`" of `split`; its id hashes the target and the inventory."""
        inv = tuple(sorted(inventory))
        key = target + ":" + ",".join(inv)
        return Task(
            f"{self.name}/{target}/{hashlib.blake2b(key.encode(), digest_size=5).hexdigest()}",
            self.goal_text(target, inv),
            self.name,
            split,
            {"target": target, "inventory": list(inv)},
        )

    def draw_inventory(self, target: str, rng: np.random.Generator, extras: Sequence[str]) -> list[str]:
        """A random starting inventory for `target`: each item of its recipe tree held with probability 0.3, plus up
        to two of `extras` outside the tree (the world's choice of what else an inventory may hold)."""
        tree = self.closure(target)
        others = [i for i in extras if i not in tree and i != target]
        inventory = [i for i in tree if rng.random() < 0.3]
        return inventory + [str(x) for x in rng.choice(others, size=int(rng.integers(0, 3)), replace=False)]

    def public_statements(
        self, target: str, inventory: Sequence[str], rng: np.random.Generator, n: int
    ) -> list[tuple[str, str]]:
        """Up to `n` true public rules of the plan as requirements (ingredient, crafted item): `you have "coal"
        before craft("ingot")` for a craft of the public plan (never a hidden rule: those are about gathers)."""
        crafted = [i for i in dict.fromkeys(self.plan(target, inventory)) if i in self.recipes]
        pairs = [(ingredient, item) for item in crafted for ingredient in self.recipes[item]]
        return [pairs[k] for k in rng.permutation(len(pairs))[:n]]


# ----------------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------------

FORMAT_REQUIREMENT = 'the plan is one Python code block with one gather("item") or craft("item") call per line'


def report(failures: Sequence[str]) -> str:
    """The verifier's report: one `>> Failed Requirement` / `assert ...` block per failure."""
    return "\n".join(f">> Failed Requirement\nassert {f}" for f in failures)


class CraftingEnv:
    """Implements the Env protocol (envs/base.py) for a crafting world's tasks: one step per attempt (the whole plan).

    `step(code)` parses the plan and replays it; the observation says how far it got (which line failed, not
    why) and the attempt is done. `verify()` checks that the target is in the inventory at the end and reports
    the first failed requirement (privileged: only the insight writer reads it).
    """

    def __init__(self, world: World) -> None:
        self.world = world
        self.task: Task | None = None
        self._failures: tuple[str, ...] | None = None

    def reset(self, task: Task) -> str:
        if task.env != self.world.name:
            raise ValueError(f"{type(self).__name__} got a task of environment {task.env!r}")
        self.task, self._failures = task, None
        return task.goal

    def step(self, code: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self._failures is not None:
            return StepResult("The plan was already run.", True)
        world = self.world
        target, inventory = self.task.spec["target"], list(self.task.spec["inventory"])
        try:
            items = world.parse_plan(code)
        except PlanError as e:
            self._failures = (f'line {e.line} is a gather("item") or craft("item") call with a known item',)
            return StepResult(f"Error on line {e.line}: {e.why}. Nothing was done.", True)
        if not items:
            self._failures = (FORMAT_REQUIREMENT,)
            return StepResult("The plan is empty. Nothing was done.", True)
        outcome = world.execute(items, inventory)
        if outcome.failed_line:
            item = items[outcome.failed_line - 1]
            self._failures = (world.requirement(outcome.missing, item),)
            return StepResult(f"Line {outcome.failed_line} failed: {world.action(item)}. The plan stopped there.", True)
        if not outcome.inventory.get(target, 0):
            self._failures = (f'you have "{target}" at the end of the plan',)
            return StepResult(f'All {len(items)} lines ran; "{target}" is not in the inventory.', True)
        self._failures = ()
        return StepResult(f"All {len(items)} lines ran.", True)

    def verify(self) -> Verdict:
        if self.task is None:
            raise RuntimeError("call reset(task) before verify()")
        failures = (FORMAT_REQUIREMENT,) if self._failures is None else self._failures
        return Verdict(not failures, report(failures), 0 if failures else 1, 1, failures)

    def close(self) -> None:
        self.task = None


# ----------------------------------------------------------------------------------------------------
# Pretraining demonstrations and the world fingerprint
# ----------------------------------------------------------------------------------------------------


def made_up_requirements(
    world: World,
    target: str,
    inventory: Sequence[str],
    rng: np.random.Generator,
    n: int,
    *,
    items: Sequence[str],
    allowed: Callable[[str, str, Sequence[str]], bool],
) -> list[tuple[str, str]]:
    """Up to `n` requirements (item, raw) for a demonstration, shaped like the hidden rules: `raw` is gathered by the
    public plan, `item` is one of `items` (the world's cheap items) outside the target's recipe tree whose own recipe
    does not gather `raw`, and `allowed(item, raw, the raw items the plan gathers)` (the world's guard that no hidden
    rule reaches pretraining); no two interfere (neither recipe uses or gathers the other's items)."""
    tree = {target, *world.closure(target)}
    gathered = [i for i in dict.fromkeys(world.plan(target, inventory)) if i in world.raw]
    pairs = [
        (i, b)
        for b in gathered
        for i in items
        if i not in tree and b not in world.closure(i) and allowed(i, b, gathered)
    ]
    picked: list[tuple[str, str]] = []
    for k in rng.permutation(len(pairs)):
        item, raw = pairs[k]
        if all(
            item != i
            and item not in world.closure(i)
            and i not in world.closure(item)
            and raw not in world.closure(i)
            and b not in world.closure(item)
            for i, b in picked
        ):
            picked.append(pairs[k])
        if len(picked) == n:
            break
    return picked


MadeUp = Callable[[str, Sequence[str], np.random.Generator, int], list[tuple[str, str]]]


def demonstration(
    world: World,
    rng: np.random.Generator,
    *,
    made_up: MadeUp,
    extras: Sequence[str],
    insight_prob: float = 0.6,
    max_insights: int = 4,
    statement_prob: float = 0.0,
    write_prob: float = 0.0,
    reword_prob: float = 0.0,
) -> Demonstration:
    """A random pretraining example: any recipe as target, a random inventory (`World.draw_inventory` with
    `extras`), and with probability `insight_prob` one or two requirements from `made_up` (the world's
    `made_up_requirements`) shown as up to `max_insights` insight messages (repeats included, as a run's
    consecutive failures write them) that the plan obeys: each required item is obtained right before the gather
    that needs it. With probability `statement_prob` (drawn first) the insights instead state one or two true public
    rules of the public plan (`statements=True`), which pretraining can train as targets. With probability
    `write_prob`, made-up insights are trained as targets too (`written=True`: the policy learns to write insights,
    given the task, as L_SFT will ask; their content is made up, so what it learns is their form). Each distinct
    requirement is phrased in another of `WORDINGS` than the verifier's with probability `reword_prob` (its repeats
    keep its wording). Draws nothing extra when `write_prob` and `reword_prob` are 0 (the demonstrations, and so
    the world fingerprint, of round one's recipe are unchanged)."""
    target = str(rng.choice(list(world.recipes)))
    inventory = world.draw_inventory(target, rng, extras)
    requirements: list[tuple[str, str]] = []
    insights: list[tuple[str, int]] = []
    statements = bool(statement_prob) and rng.random() < statement_prob
    if statements:
        requirements = world.public_statements(target, inventory, rng, int(rng.integers(1, 3)))
        statements = bool(requirements)
    elif rng.random() < insight_prob:
        requirements = made_up(target, inventory, rng, int(rng.integers(1, 3)))
    written = bool(requirements) and not statements and bool(write_prob) and rng.random() < write_prob
    if requirements:  # (a plan that gathers nothing has nothing to require)
        wordings = {r: _wording(rng, reword_prob) for r in requirements}
        count = int(rng.integers(len(requirements), max(len(requirements), max_insights) + 1))
        shown = [requirements[k % len(requirements)] for k in range(count)]
        rng.shuffle(shown)
        numbers = np.sort(rng.choice(np.arange(1, 9), size=count, replace=False))
        insights = [(world.phrase(i, b, wordings[i, b]), int(n)) for (i, b), n in zip(shown, numbers, strict=True)]
    items = world.plan(target, inventory, [] if statements else requirements)
    return Demonstration(world.task(target, inventory, "pretrain"), tuple(insights), tuple(items), statements, written)


def _wording(rng: np.random.Generator, reword_prob: float) -> int:
    """0 (the verifier's wording), or with probability `reword_prob` one of the others, uniformly."""
    if reword_prob and rng.random() < reword_prob:
        return int(rng.integers(1, len(WORDINGS)))
    return 0


def pretrain_examples(
    world: World, demonstration: Callable[..., Demonstration]
) -> Callable[..., Callable[[np.random.Generator], PretrainExample]]:
    """The EnvSpec's `demonstrations`: options (insight_prob, max_insights, statement_prob, write_prob, reword_prob:
    `demonstration`'s) -> rng -> (task, insights, the plan's code, whether the insights are targets too), drawn by
    the world's `demonstration`."""

    def demonstrations(**options: Any) -> Callable[[np.random.Generator], PretrainExample]:
        def draw(rng: np.random.Generator) -> PretrainExample:
            demo = demonstration(rng, **options)
            return demo.task, demo.insights, world.plan_code(demo.plan), demo.targets

        return draw

    return demonstrations


def fingerprint(
    splits: Sequence[str], generate_tasks: Callable[[str], list[Task]], demonstration: Callable[..., Demonstration]
) -> str:
    """A hash of every split's tasks (default seed) and of a fixed sample of demonstrations (with and without
    statements): the world's `world_fingerprint`, on which pretraining caches and the shipped base policies are
    keyed."""
    h = hashlib.sha256()
    for split in splits:
        h.update("".join(t.to_json() for t in generate_tasks(split)).encode())
    rng = np.random.default_rng(0)
    for statement_prob in (0.0, 0.5):
        for _ in range(300):
            h.update(repr(demonstration(rng, statement_prob=statement_prob)).encode())
    return h.hexdigest()[:12]
