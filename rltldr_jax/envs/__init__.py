"""Environments: tasks, the Env protocol, the sandbox, and the SAPI-like world, LeetCode and AppWorld."""

from rltldr_jax.envs.base import Env, StepResult, Task, TaskSource, Verdict
from rltldr_jax.envs.registry import ENV_NAMES, load_tasks, make_env

__all__ = ["ENV_NAMES", "Env", "StepResult", "Task", "TaskSource", "Verdict", "load_tasks", "make_env"]
