"""The agent side of RLTL;DR: collection phases, multi-step episodes, the insight writer and its schedule."""

from __future__ import annotations

import importlib
from typing import Any

# The main names, imported on first use (`from rltldr_jax.agent import Collector, InsightWriter`): importing the
# package or one of its modules does not import the others.
_EXPORTS = {
    "Attempt": "rltldr_jax.agent.episode",
    "Collector": "rltldr_jax.agent.collector",
    "EpisodeConfig": "rltldr_jax.agent.episode",
    "FailedAttempt": "rltldr_jax.agent.writer_prompt",
    "InsightSchedule": "rltldr_jax.agent.schedule",
    "InsightWriter": "rltldr_jax.agent.insight",
    "PhaseResult": "rltldr_jax.agent.collector",
    "RolloutRecord": "rltldr_jax.agent.rollout_files",
    "load_rollouts": "rltldr_jax.agent.rollout_files",
    "run_attempt": "rltldr_jax.agent.episode",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
