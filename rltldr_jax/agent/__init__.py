"""The agent side of RLTL;DR: collection phases, multi-step episodes, the insight writer and its schedule."""

from __future__ import annotations

from rltldr_jax.lazy_exports import lazy_exports

# The main names, imported on first use (`from rltldr_jax.agent import Collector, InsightWriter`): importing the
# package or one of its modules does not import the others.
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
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
    },
)
