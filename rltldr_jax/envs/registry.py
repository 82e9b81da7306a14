"""Environments by name (`config.env.name`): their task splits and a factory for Env instances."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rltldr_jax.envs.base import Env, Task
from rltldr_jax.envs.sandbox import SandboxLimits

ENV_NAMES = ("sapi", "leetcode", "appworld", "craft")

# Our split names → AppWorld's (the paper trains on train+dev+test_normal filtered to hard tasks, §4.1, and
# evaluates on test_challenge).
APPWORLD_SPLITS = {"train": "train+dev+test_normal", "eval": "test_challenge"}


def _check(name: str) -> None:
    if name not in ENV_NAMES:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)} (config.env.name)")


def load_tasks(name: str, split: str, *, seed: int = 0) -> list[Task]:
    """The tasks of `split` ("train" or "eval"; AppWorld also takes its own split names) of environment `name`.

    `seed` selects the SAPI-like world's generated tasks; LeetCode and AppWorld data are fixed.
    """
    _check(name)
    if name == "sapi":
        from rltldr_jax.envs.sapi.tasks import generate_tasks

        return generate_tasks(split, seed=seed)
    if name == "craft":
        from rltldr_jax.envs import craft

        return craft.generate_tasks(split, seed=seed)
    if name == "leetcode":
        from rltldr_jax.envs import leetcode

        return leetcode.load_tasks(split)
    from rltldr_jax.envs import appworld

    return appworld.load_tasks(APPWORLD_SPLITS.get(split, split).split("+"))


def make_env(name: str, *, step_timeout_s: float = 30.0, memory_limit_mb: int = 1024) -> Env:
    """A fresh Env of environment `name`, with the sandbox limits of `config.env` (one per concurrent episode)."""
    _check(name)
    limits = SandboxLimits(wall_s=step_timeout_s, cpu_s=step_timeout_s, memory_mb=memory_limit_mb)
    if name == "sapi":
        from rltldr_jax.envs.sapi.env import SapiEnv

        return SapiEnv(limits)
    if name == "craft":  # plans are parsed, never executed: no sandbox
        from rltldr_jax.envs.craft import CraftEnv

        return CraftEnv()
    if name == "leetcode":
        from rltldr_jax.envs.leetcode import LeetCodeEnv

        return LeetCodeEnv(limits=limits)
    from rltldr_jax.envs.appworld import AppWorldEnv

    return AppWorldEnv(init_kwargs={"timeout_seconds": int(step_timeout_s)})


def demonstrations(
    name: str, *, insight_prob: float = 0.6, max_insights: int = 4, statement_prob: float = 0.0
) -> Callable[[np.random.Generator], tuple[Task, tuple[tuple[str, int], ...], str, bool]]:
    """The pretraining source of environment `name`: rng -> (task, insights in context as (text, number of the
    failed attempt it names), the demonstrated action text, whether the insights are targets too).

    Only the small-scale replication's world has one (`pretrain.steps > 0` needs it). `insight_prob` is the share
    of demonstrations with insights to act on, at most `max_insights` of them; `statement_prob` the share whose
    insights state true public rules, to be learnt as targets (the declarative-pretraining experiment).
    """
    _check(name)
    if name != "craft":
        raise ValueError(
            f"environment {name!r} has no pretraining demonstrations; pretrain.steps > 0 needs env.name='craft'"
        )
    from rltldr_jax.envs import craft

    def draw(rng: np.random.Generator) -> tuple[Task, tuple[tuple[str, int], ...], str, bool]:
        demo = craft.demonstration(
            rng, insight_prob=insight_prob, max_insights=max_insights, statement_prob=statement_prob
        )
        return demo.task, demo.insights, craft.plan_code(demo.plan), demo.statements

    return draw


def world_fingerprint(name: str) -> str:
    """A hash of what environment `name` generates — its task splits and (for worlds that have them) a fixed sample
    of pretraining demonstrations: caches of what was pretrained on them (train/pretrain.py) are invalid once it
    changes, and stay valid across edits that change nothing generated."""
    _check(name)
    import hashlib

    h = hashlib.sha256()
    if name == "craft":
        from rltldr_jax.envs import craft

        for split in craft.SPLITS:
            h.update("".join(t.to_json() for t in craft.generate_tasks(split)).encode())
        rng = np.random.default_rng(0)
        for statement_prob in (0.0, 0.5):
            for _ in range(300):
                h.update(repr(craft.demonstration(rng, statement_prob=statement_prob)).encode())
        return h.hexdigest()[:12]
    import importlib
    import inspect

    module = importlib.import_module({"sapi": "rltldr_jax.envs.sapi.tasks"}.get(name, f"rltldr_jax.envs.{name}"))
    h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:12]


def uninformative_insight(name: str) -> Callable[[str, Task, int], str]:
    """The control insight of environment `name` (insight.source = "uninformative", not in the paper):
    (real insight, task, seed) -> a sentence of the same form and token length that carries no information about
    the failure. Only the small-scale replication's world has one."""
    _check(name)
    if name != "craft":
        raise ValueError(
            f"environment {name!r} has no uninformative control insights; insight.source='uninformative' "
            "needs env.name='craft'"
        )
    from rltldr_jax.envs import craft

    return lambda insight, task, seed: craft.uninformative_insight(insight, task, seed)
