"""Environments: tasks, the Env protocol, the sandbox, and the SAPI-like world, LeetCode and AppWorld."""

from rltldr_jax.envs.base import Env, StepResult, Task, TaskSource, Verdict

__all__ = ["Env", "StepResult", "Task", "TaskSource", "Verdict"]
