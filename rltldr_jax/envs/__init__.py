"""Environments: tasks, the Env protocol, the sandbox, each environment's EnvSpec, and the SAPI-like world,
LeetCode, AppWorld and the crafting worlds (craft, forge)."""

from rltldr_jax.envs.base import Env, StepResult, Task, TaskSource, Verdict
from rltldr_jax.envs.registry import ENV_NAMES, load_tasks, make_env
from rltldr_jax.envs.spec import EnvSpec, get_spec, register

__all__ = [
    "ENV_NAMES",
    "Env",
    "EnvSpec",
    "StepResult",
    "Task",
    "TaskSource",
    "Verdict",
    "get_spec",
    "load_tasks",
    "make_env",
    "register",
]
