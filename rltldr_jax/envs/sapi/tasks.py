"""Task generation: seeded worlds, the train/eval splits, and rebuilding a task's world from its spec.

A task's spec is {"template", "seed", "params"}. Its world is rebuilt from the seed: each app's tables come from
`app.build(seed)` (seeded per app, so building more apps does not change the others), then the template's
`prepare` runs with `random.Random(f"task/{seed}")` and may edit the database; the resulting params must equal
the stored ones. Training tasks use only TRAIN_APPS, evaluation tasks only the held-out EVAL_APPS.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from ..base import Task, Verdict
from . import data
from .apps import APPS, EVAL_APPS, TRAIN_APPS
from .templates import BY_NAME, TEMPLATES, Template
from .verifier import Checker
from .world import World

SPLIT_SIZES = {"train": 16_000, "eval": 1_624}
TRAIN_TEMPLATES = tuple(t.name for t in TEMPLATES if set(t.apps) <= set(TRAIN_APPS))
EVAL_TEMPLATES = tuple(t.name for t in TEMPLATES if set(t.apps) <= set(EVAL_APPS))
SPLIT_TEMPLATES = {"train": TRAIN_TEMPLATES, "eval": EVAL_TEMPLATES}
SPLIT_APPS = {"train": TRAIN_APPS, "eval": EVAL_APPS}


def supervisor_tables(seed: int, apps: tuple[str, ...]) -> dict[str, list[dict]]:
    """The supervisor's profile and a password for each app."""
    rng = random.Random(f"supervisor/{seed}")
    first, last = data.ch(rng, data.FIRST), data.ch(rng, data.SUPERVISOR_LAST)  # never a contact's name
    prof = {
        "id": 1,
        "first_name": first,
        "last_name": last,
        "email": f"{first.lower()}.{last.lower()}@example.com",
        "phone_number": f"{data.ri(rng, 201, 989)}{data.ri(rng, 200, 999)}{data.ri(rng, 1000, 9999)}",
    }
    pw = [
        {"id": i + 1, "account_name": a, "password": hashlib.sha256(f"{seed}/{a}".encode()).hexdigest()[:12]}
        for i, a in enumerate(apps)
    ]
    return {"profile": [prof], "account_passwords": pw}


def build_db(seed: int, apps: tuple[str, ...], template: Template) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's initial database (for `apps`, which must include the template's) and its params."""
    db: dict[str, Any] = {"supervisor": supervisor_tables(seed, SPLIT_APPS["train"] + SPLIT_APPS["eval"])}
    for a in apps:
        db[a] = APPS[a].build(seed)
    params = template.prepare(random.Random(f"task/{seed}"), db)
    return db, params


def make_world(spec: dict[str, Any]) -> tuple[World, Template, dict[str, Any]]:
    """Rebuilds a task's world with every app of its split (so the agent has to pick the right apps)."""
    tpl = BY_NAME[spec["template"]]
    split = "eval" if spec["template"] in EVAL_TEMPLATES else "train"
    db, params = build_db(spec["seed"], SPLIT_APPS[split], tpl)
    if params != spec["params"]:
        raise ValueError(f"task spec {spec['template']}/{spec['seed']} does not match its rebuilt world")
    apps = {n: APPS[n] for n in ("supervisor", "api_docs") + SPLIT_APPS[split]}
    return World(db, apps), tpl, params


def _seed(split: str, seed: int, template: str, index: int) -> int:
    h = hashlib.blake2b(f"sapi/{seed}/{split}/{template}/{index}".encode(), digest_size=6).digest()
    return int.from_bytes(h, "big")


def generate_tasks(split: str, seed: int = 0, n: int | None = None) -> list[Task]:
    """The tasks of a split: "train" (~16k, training apps) or "eval" (1,624, held-out apps).

    Tasks are ordered round-robin over templates, so the first `n` cover the templates evenly. Ids are
    `sapi/{split}/{template}/{index}`; the same (split, seed) always gives the same tasks.
    """
    if split not in SPLIT_TEMPLATES:
        raise ValueError(f"unknown SAPI split {split!r}; expected one of {sorted(SPLIT_TEMPLATES)}")
    names = SPLIT_TEMPLATES[split]
    total = SPLIT_SIZES[split] if n is None else min(n, SPLIT_SIZES[split])
    tasks = []
    for k in range(total):
        name, index = names[k % len(names)], k // len(names)
        tpl = BY_NAME[name]
        s = _seed(split, seed, name, index)
        _, params = build_db(s, tpl.apps, tpl)
        tasks.append(
            Task(
                task_id=f"sapi/{split}/{name}/{index}",
                goal=tpl.goal(params),
                env="sapi",
                split=split,
                spec={"template": name, "seed": s, "params": params, "qa": tpl.qa},
            )
        )
    return tasks


def golden_solution(task: Task) -> str:
    """The golden solution code of a task."""
    return BY_NAME[task.spec["template"]].solution(task.spec["params"])


def verify(template: Template, params: dict[str, Any], before: dict[str, Any], world: World) -> Verdict:
    """Runs a template's requirement tests on the attempt's final world against its initial database."""
    v = Checker(before, world)
    allowed = template.check(v, params)
    answer_ok = template.answer_ok(world.answer, params) if template.qa else None
    return v.finish(template.qa, answer_ok, allowed)
