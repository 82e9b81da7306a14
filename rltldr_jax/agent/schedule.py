"""When a task's insights are inserted into a later attempt (A.2, Table 9): pure bookkeeping, no model.

Per task, within the current collection phase, the schedule keeps the attempts' results (success flags by
attempt number) and the insights written so far (each with the number of the attempt it came from). An attempt
that starts now gets, per policy (config `insight.schedule`):

- `threshold` (default): all of the phase's insights of the task, when its running success rate in this phase is
  <= `insight.threshold` (0.5) and at least one insight exists.
- `first_k`: the same, when at most `insight.first_k_max_successes` (3) of the task's first `insight.first_k` (10)
  attempts succeeded ("insert if <= 3 of first 10 rollouts successful", Table 9); while fewer than k attempts
  are known, the successes so far are counted.
- `never`: nothing (the GRPO baseline). `always`: all insights whenever one exists.

At most `insight.max_insights` (n_fb = 16) insights are inserted: the most recent ones (highest attempt numbers),
oldest first. Only insights of the current phase count (A.2): `reset()` starts a new phase.

Attempt numbers are 1-based and assigned when an attempt starts; with concurrent chains per task
(`rollout.workers_per_task` > 1) results may arrive out of order, and "first k" means attempt numbers 1..k.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rltldr_jax.settings import choices
from rltldr_jax.tokenization import Insight

#: Values of `insight.schedule` (the module docstring says what each does).
POLICIES = choices("insight.schedule")


@dataclasses.dataclass
class _TaskRecord:
    results: dict[int, bool] = dataclasses.field(default_factory=dict)  # attempt number -> success
    insights: dict[int, str] = dataclasses.field(default_factory=dict)  # attempt number -> insight text


class InsightSchedule:
    """Decides, per task, which insights a starting attempt gets.

    Args:
      schedule: the policy, threshold | first_k | never | always (`insight.schedule`; also `self.policy`).
      threshold: running success rate at or below which insights are inserted (policy threshold).
      first_k, first_k_max_successes: the window and the success cap of policy first_k.
      max_insights: n_fb, the most recent insights kept.
    """

    def __init__(
        self,
        schedule: str = "threshold",
        *,
        threshold: float = 0.5,
        first_k: int = 10,
        first_k_max_successes: int = 3,
        max_insights: int = 16,
    ):
        if schedule not in POLICIES:
            raise ValueError(f"unknown insight schedule {schedule!r}; choose one of {', '.join(POLICIES)}")
        if max_insights < 1 or first_k < 1 or first_k_max_successes < 0 or not 0.0 <= threshold <= 1.0:
            raise ValueError(
                f"bad schedule parameters: threshold={threshold} (in [0, 1]), first_k={first_k} (>= 1), "
                f"first_k_max_successes={first_k_max_successes} (>= 0), max_insights={max_insights} (>= 1)"
            )
        self.policy = schedule
        self.threshold = threshold
        self.first_k = first_k
        self.first_k_max_successes = first_k_max_successes
        self.max_insights = max_insights
        self._tasks: dict[str, _TaskRecord] = {}

    # -- recording ---------------------------------------------------------------------------------------

    def record(self, task_id: str, success: bool, insight: str | None = None, attempt: int | None = None) -> int:
        """Records the result of attempt `attempt` (1-based; None = the next number) and its insight, if any.

        Returns the attempt number. Recording the same attempt twice is a ValueError.
        """
        rec = self._tasks.setdefault(task_id, _TaskRecord())
        if attempt is None:
            attempt = max(rec.results, default=0) + 1
        attempt = int(attempt)
        if attempt < 1:
            raise ValueError(f"attempt numbers are 1-based, got {attempt}")
        if attempt in rec.results:
            raise ValueError(f"attempt {attempt} of task {task_id!r} was already recorded")
        rec.results[attempt] = bool(success)
        if insight is not None:
            self.add_insight(task_id, insight, attempt)
        return attempt

    def add_insight(self, task_id: str, insight: str, attempt: int) -> None:
        """Adds the insight written after attempt `attempt` (when it arrives later than the result)."""
        if not insight or not insight.strip():
            return
        attempt = int(attempt)
        if attempt < 1:
            raise ValueError(f"attempt numbers are 1-based, got {attempt}")
        rec = self._tasks.setdefault(task_id, _TaskRecord())
        if attempt in rec.insights:
            raise ValueError(f"attempt {attempt} of task {task_id!r} already has an insight")
        rec.insights[attempt] = insight

    def reset(self) -> None:
        """A new collection phase: insights of earlier phases are never used (A.2)."""
        self._tasks.clear()

    # -- queries -----------------------------------------------------------------------------------------

    def num_attempts(self, task_id: str) -> int:
        rec = self._tasks.get(task_id)
        return len(rec.results) if rec else 0

    def success_rate(self, task_id: str) -> float | None:
        """The task's running success rate in this phase (None before any result)."""
        rec = self._tasks.get(task_id)
        if not rec or not rec.results:
            return None
        return sum(rec.results.values()) / len(rec.results)

    def should_insert(self, task_id: str) -> bool:
        """Whether an attempt starting now gets the task's insights (needs at least one insight)."""
        rec = self._tasks.get(task_id)
        if self.policy == "never" or not rec or not rec.insights:
            return False
        if self.policy == "always":
            return True
        if self.policy == "threshold":
            rate = self.success_rate(task_id)
            return rate is None or rate <= self.threshold
        early = sum(ok for n, ok in rec.results.items() if n <= self.first_k)
        return early <= self.first_k_max_successes

    def insights_for(self, task_id: str) -> list[Insight]:
        """The insights for an attempt of `task_id` starting now: the most recent `max_insights` of this phase,
        oldest first, or [] when the policy says no."""
        if not self.should_insert(task_id):
            return []
        rec = self._tasks[task_id]
        recent = sorted(rec.insights)[-self.max_insights :]
        return [Insight(rec.insights[n], n) for n in recent]

    # -- checkpoints -------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (attempt numbers as strings, as JSON object keys must be)."""
        return {
            "policy": self.policy,
            "tasks": {
                tid: {
                    "results": {str(n): ok for n, ok in sorted(rec.results.items())},
                    "insights": {str(n): text for n, text in sorted(rec.insights.items())},
                }
                for tid, rec in self._tasks.items()
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restores `state()`; the policy and its parameters stay those of this object (the config's)."""
        self._tasks = {
            tid: _TaskRecord(
                results={int(n): bool(ok) for n, ok in data.get("results", {}).items()},
                insights={int(n): str(text) for n, text in data.get("insights", {}).items()},
            )
            for tid, data in state.get("tasks", {}).items()
        }
