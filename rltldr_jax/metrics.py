"""Deconfounded train and eval metrics (paper App. D.1–D.2), from attempt records.

Two confounders drive the design (D.1):
- worker throughput: with asynchronous collection, easy tasks get more attempts, so every success rate is
  *macro-averaged*: first per task, then across tasks;
- insight conditioning: attempts with insights in context succeed more often but insights are absent at
  test time, so Pass@1 is also reported on the attempts *without* insights.

Every function takes a sequence of `AttemptRecord`s and returns a float (NaN when no task qualifies) or an
array; `summarize` collects them for logging.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one task.

    Attributes:
      task_id: the task.
      attempt: 1-based index of the attempt within this task's sequence in the phase.
      success: the verifier's verdict.
      had_insights: whether insights were in the attempt's context.
      env_steps: environment steps (messages sent) the attempt took.
      tokens: tokens the policy generated in the attempt.
    """

    task_id: Hashable
    attempt: int
    success: bool
    had_insights: bool = False
    env_steps: int = 0
    tokens: int = 0


def _by_task(records: Iterable[AttemptRecord], insights: bool | None = None) -> dict[Hashable, list[AttemptRecord]]:
    """Records grouped by task (sorted by attempt), optionally only those with/without insights."""
    groups: dict[Hashable, list[AttemptRecord]] = defaultdict(list)
    for r in records:
        if insights is None or r.had_insights == insights:
            groups[r.task_id].append(r)
    for rs in groups.values():
        rs.sort(key=lambda r: r.attempt)
    return dict(groups)


def _macro(values: Sequence[float]) -> float:
    """The mean over tasks, exactly rounded (`math.fsum`): the same bits in whatever order the tasks' attempts
    finished (a float sum in arrival order differs in the last digit between two runs of one seed)."""
    return math.fsum(values) / len(values) if len(values) else float("nan")


def macro_pass_at_1(records: Iterable[AttemptRecord], insights: bool | None = None) -> float:
    """Mean over tasks of each task's success rate.

    Args:
      insights: None for all attempts; False for attempts without insights (the deconfounded Pass@1 the
        paper reports); True for insight-conditioned attempts only.
    """
    return _macro([np.mean([r.success for r in rs]) for rs in _by_task(records, insights).values()])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n attempts with c successes: 1 − C(n−c, k) / C(n, k) (Chen et al., 2021).

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Product form of C(n−c, k) / C(n, k), exact in floating point for large n.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def macro_pass_at_k(records: Iterable[AttemptRecord], k: int, insights: bool | None = None) -> float:
    """Mean over tasks of the unbiased Pass@k; tasks with fewer than k attempts are left out.

    Pass@8 is comparable across runs (D.1); with async collection most tasks have more than 8 attempts.
    """
    tasks = _by_task(records, insights).values()
    return _macro([pass_at_k(len(rs), sum(r.success for r in rs), k) for rs in tasks if len(rs) >= k])


def macro_pass_at_all(records: Iterable[AttemptRecord], insights: bool | None = None) -> float:
    """Pass@k with k = all attempts of each task: the fraction of tasks solved at least once (macro)."""
    return _macro([float(any(r.success for r in rs)) for rs in _by_task(records, insights).values()])


def _tasks_with_both(records: Iterable[AttemptRecord]) -> list[tuple[list[AttemptRecord], list[AttemptRecord]]]:
    """(with-insight, without-insight) attempts of every task that has both kinds."""
    both = []
    for rs in _by_task(records).values():
        with_i = [r for r in rs if r.had_insights]
        without = [r for r in rs if not r.had_insights]
        if with_i and without:
            both.append((with_i, without))
    return both


def insight_advantage(records: Iterable[AttemptRecord]) -> float:
    """Macro Pass@1 with insights minus macro Pass@1 without, over the tasks that have both kinds (D.2).

    It should stay > 0: an insight should raise the chance of solving the task on the next try.
    """
    return _macro(
        [np.mean([r.success for r in w]) - np.mean([r.success for r in wo]) for w, wo in _tasks_with_both(records)]
    )


def insight_too_easy_ratio(records: Iterable[AttemptRecord]) -> float:
    """Among tasks with insight-conditioned attempts, the fraction where all of them succeeded (D.2; < 20 %)."""
    tasks = _by_task(records, insights=True).values()
    return _macro([float(all(r.success for r in rs)) for rs in tasks])


def insight_too_hard_ratio(records: Iterable[AttemptRecord]) -> float:
    """Among tasks with insight-conditioned attempts, the fraction where none succeeded (D.2; < 50 %)."""
    tasks = _by_task(records, insights=True).values()
    return _macro([float(not any(r.success for r in rs)) for rs in tasks])


def insight_pass_at_k_curve(records: Iterable[AttemptRecord], max_k: int = 16) -> np.ndarray:
    """The insight Pass@k curve of sequential sampling (D.2, Fig. 11/12).

    Entry k−1 is the fraction of tasks solved within their first k attempts *in attempt order*: attempt 1 has
    no insight, later ones have the insights of the failures before them. Only tasks with at least `max_k`
    attempts count, so every point of the curve is over the same tasks (and the curve is monotone).

    Returns:
      [max_k] float array; all NaN if no task has `max_k` attempts.
    """
    tasks = [rs for rs in _by_task(records).values() if len(rs) >= max_k]
    if not tasks:
        return np.full(max_k, np.nan)
    solved = np.array([np.cumsum([r.success for r in rs[:max_k]]) > 0 for rs in tasks], dtype=np.float64)
    return solved.mean(axis=0)


def summarize(records: Sequence[AttemptRecord], pass_k: int = 8) -> dict[str, float]:
    """Every metric of D.1–D.2 for one phase (or one eval), keyed for TensorBoard."""
    return {
        "pass@1/all": macro_pass_at_1(records),
        "pass@1/no_insight": macro_pass_at_1(records, insights=False),
        "pass@1/insight": macro_pass_at_1(records, insights=True),
        f"pass@{pass_k}/all": macro_pass_at_k(records, pass_k),
        f"pass@{pass_k}/no_insight": macro_pass_at_k(records, pass_k, insights=False),
        "pass@all/all": macro_pass_at_all(records),
        "insight/advantage": insight_advantage(records),
        "insight/too_easy_ratio": insight_too_easy_ratio(records),
        "insight/too_hard_ratio": insight_too_hard_ratio(records),
        "insight/attempt_fraction": float(np.mean([r.had_insights for r in records])) if records else float("nan"),
        "counts/tasks": float(len({r.task_id for r in records})),
        "counts/attempts": float(len(records)),
        "counts/env_steps": float(sum(r.env_steps for r in records)),
        "counts/tokens": float(sum(r.tokens for r in records)),
    }
