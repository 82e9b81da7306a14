"""Environments by name (`config.env.name`): their task splits and a factory for Env instances."""

from __future__ import annotations

from rltldr_jax.envs.base import Env, Task
from rltldr_jax.envs.sandbox import SandboxLimits

ENV_NAMES = ("sapi", "leetcode", "appworld")

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
    if name == "leetcode":
        from rltldr_jax.envs.leetcode import LeetCodeEnv

        return LeetCodeEnv(limits=limits)
    from rltldr_jax.envs.appworld import AppWorldEnv

    return AppWorldEnv(init_kwargs={"timeout_seconds": int(step_timeout_s)})
