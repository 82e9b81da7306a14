"""Insight exploration curves (App. E.8, Figures 11 and 12): Pass@k of a *frozen* policy against the number of
attempts (and so of insights in context), for three ways of spending k attempts on a task.

    results = insight_curves(engine, builder, config, tasks=tasks, make_env=make_env, writer=writer, max_k=16)
    results["sequential"].pass_at_k        # [max_k]; entry k-1 = Pass@k
    write_curves(results, "out/")          # insight_curves.csv, insight_curves_attempts.csv, insight_curves.png

Modes (`MODES`):

- `iid`: independent attempts without insights, as GRPO samples a group. Every task gets `iid_samples` (N >=
  max_k, default max_k) attempts and Pass@k is the unbiased estimator 1 - C(N-c, k)/C(N, k) (`metrics.pass_at_k`)
  averaged over tasks. For i.i.d. attempts "solved within the first k" is an unbiased but noisier estimate of the
  same quantity; the estimator is its average over all k-subsets of the N attempts, and at k = N the two agree.
- `latest`: one sequential chain of attempts per task; after every failed attempt the policy writes an insight
  (config `insight.*`: source, content, budgets) and the next attempt has only the most recent insight in context
  (schedule "always" with n_fb = 1).
- `sequential`: the same chain, with all insights so far in context (schedule "always" with n_fb =
  `insight.max_insights`, 16 in the paper: attempt k has min(k-1, n_fb) insights).

For the two chain modes, Pass@k is the fraction of tasks solved by at least one of their first k attempts
(`metrics.insight_pass_at_k_curve`), so the curve is non-decreasing in k. Every mode counts only tasks with at
least max_k attempts (all of them with the collector's exact mode), so all points are over the same tasks.

Protocol choices (paper E.8 gives only: base policy before training, "the only thing that changes along the
x-axis is how many insights populate the model's context", y = Pass@k, k <= 16):

- Insights are inserted regardless of the running success rate (schedule "always", not the training default
  "threshold"): a curve point at k must have exactly the insights of the k-1 earlier attempts. This is moot for
  Pass@k, since a chain only matters up to its first success.
- Insights are written after failures only (config `insight.after`, "failure" for RLTL;DR), within one phase.
- Every mode runs with the same collection-phase tag, so the sampling seeds of attempt i of a task are the same
  in all modes (common random numbers): attempt 1, which has no insight in any mode, is the same sample.
- The chains run all max_k attempts even after a success (the collector's exact mode); the attempts after the
  first success do not change the curve.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rltldr_jax.agent.collector import Collector, PhaseResult
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.eval_set import attempt_records, eval_tasks
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.analysis.rollouts import new_figure, save_figure, write_csv
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs import Env, Task, TaskSource
from rltldr_jax.metrics import AttemptRecord, insight_pass_at_k_curve, pass_at_k
from rltldr_jax.settings import Settings, replace
from rltldr_jax.tokenization import ContextBuilder

MODES = ("iid", "latest", "sequential")
MODE_LABELS = {"iid": "i.i.d. (no insight)", "latest": "latest insight", "sequential": "sequential insights"}

#: Collection-phase tag of the curves' sampling seeds: training phases use tags >= 0 and evaluations -1 - phase,
#: so this never reuses a training or evaluation sample's seed.
CURVE_PHASE = -1_000_000


def parse_modes(modes: str | Sequence[str]) -> tuple[str, ...]:
    """`"iid,latest"` or `["iid", "latest"]` → validated, deduplicated modes in the given order.

    Raises ValueError naming the valid modes for an unknown or empty selection.
    """
    names = [m.strip() for m in (modes.split(",") if isinstance(modes, str) else modes)]
    names = [m for m in names if m]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        what = f"unknown mode(s) {', '.join(map(repr, unknown))}" if unknown else "no mode given"
        raise ValueError(f"{what}; choose from {', '.join(MODES)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def schedule_for(mode: str, max_insights: int) -> InsightSchedule:
    """The insight schedule of a mode: never (iid), always with n_fb = 1 (latest), always with n_fb =
    `max_insights` (sequential)."""
    if mode == "iid":
        return InsightSchedule("never")
    if mode == "latest":
        return InsightSchedule("always", max_insights=1)
    if mode == "sequential":
        return InsightSchedule("always", max_insights=max_insights)
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def expected_insights(mode: str, k: int, max_insights: int) -> int:
    """Insights in context at attempt k (1-based) when all earlier attempts failed and each got an insight."""
    if k < 1:
        raise ValueError(f"attempts are 1-based, got k={k}")
    return {"iid": 0, "latest": min(1, k - 1), "sequential": min(k - 1, max_insights)}[parse_modes([mode])[0]]


def _full_tasks(records: Iterable[AttemptRecord], max_k: int) -> dict[Any, list[AttemptRecord]]:
    """Tasks with at least max_k attempts, each's records sorted by attempt number."""
    by_task: dict[Any, list[AttemptRecord]] = {}
    for r in records:
        by_task.setdefault(r.task_id, []).append(r)
    return {t: sorted(rs, key=lambda r: r.attempt) for t, rs in by_task.items() if len(rs) >= max_k}


def curve_from_records(records: Iterable[AttemptRecord], mode: str, max_k: int) -> tuple[np.ndarray, int]:
    """Pass@k for k = 1..max_k of one mode, macro-averaged over the tasks with at least max_k attempts.

    iid: the unbiased estimator over each task's N attempts (all of them, N >= max_k). latest / sequential:
    whether one of the task's first k attempts (in attempt order) succeeded.

    Returns:
      ([max_k] float array, all NaN when no task qualifies; the number of tasks counted).
    """
    (mode,) = parse_modes([mode])
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    records = list(records)
    tasks = _full_tasks(records, max_k)
    if not tasks:
        return np.full(max_k, np.nan), 0
    if mode == "iid":
        per_task = [
            [pass_at_k(len(rs), sum(r.success for r in rs), k) for k in range(1, max_k + 1)] for rs in tasks.values()
        ]
        return np.asarray(per_task, dtype=np.float64).mean(axis=0), len(tasks)
    kept = [r for r in records if r.task_id in tasks]
    return insight_pass_at_k_curve(kept, max_k), len(tasks)


@dataclasses.dataclass(frozen=True)
class CurveResult:
    """One mode's curve and the attempts behind it.

    Attributes:
      mode: iid | latest | sequential.
      pass_at_k: [max_k] Pass@k for k = 1..max_k.
      n_tasks: tasks counted (those with at least max_k attempts).
      mean_insights: [max_k] mean number of insights in context at attempt k over those tasks.
      phase: the collector's result (attempts with their contexts' insights, writer_outputs).
    """

    mode: str
    pass_at_k: np.ndarray
    n_tasks: int
    mean_insights: np.ndarray
    phase: PhaseResult

    @property
    def max_k(self) -> int:
        return len(self.pass_at_k)


def _mean_insights(phase: PhaseResult, max_k: int) -> np.ndarray:
    """[max_k] mean insight count at attempt k over tasks with at least max_k attempts (NaN if none)."""
    counts = [[len(a.insights) for a in g[:max_k]] for g in phase.groups().values() if len(g) >= max_k]
    return np.asarray(counts, dtype=np.float64).mean(axis=0) if counts else np.full(max_k, np.nan)


def run_mode(
    mode: str,
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: Settings,
    *,
    tasks: Sequence[Task],
    make_env: Callable[[], Env],
    writer: InsightWriter | None,
    max_k: int = 16,
    iid_samples: int | None = None,
    phase: int = CURVE_PHASE,
    progress: bool = False,
) -> CurveResult:
    """Collects one mode's attempts on the frozen policy and computes its curve.

    Args:
      mode: iid | latest | sequential.
      engine: the policy's engine (its weights are never updated here).
      builder: the policy's context builder.
      config: the run's config: rollout budgets and sampling (`EpisodeConfig.of`), `seed`,
        `insight.max_insights` (n_fb of sequential) and `insight.after`.
      tasks: the tasks (distinct).
      make_env: builds one environment (one per task chain).
      writer: the insight writer (required unless mode is iid).
      max_k: attempts per task of the chain modes, and the largest k of every curve.
      iid_samples: attempts per task of iid (N >= max_k; default max_k).
      phase: collection-phase tag of the sampling seeds (the same for every mode: common random numbers).
      progress: a progress bar.
    """
    (mode,) = parse_modes([mode])
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    n = max_k if mode != "iid" or iid_samples is None else iid_samples
    if n < max_k:
        raise ValueError(f"iid_samples={iid_samples} must be >= max_k={max_k} (Pass@k needs at least k samples)")
    if mode != "iid" and writer is None:
        raise ValueError(f"mode {mode!r} needs an insight writer (InsightWriter.of)")
    collector = Collector(
        engine,
        make_env,
        builder,
        EpisodeConfig.of(config),
        schedule_for(mode, config.insight.max_insights),
        None if mode == "iid" else writer,
        group_size=n,
        exact_group_size=True,
        insight_after=config.insight.after,
        progress=progress,
    )
    result = collector.collect(list(tasks), phase=phase)
    curve, n_tasks = curve_from_records(attempt_records(result), mode, max_k)
    return CurveResult(mode, curve, n_tasks, _mean_insights(result, max_k), result)


def insight_curves(
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: Settings,
    *,
    tasks: Sequence[Task],
    make_env: Callable[[], Env],
    writer: InsightWriter | None,
    modes: str | Sequence[str] = MODES,
    max_k: int = 16,
    iid_samples: int | None = None,
    phase: int = CURVE_PHASE,
    progress: bool = False,
    on_mode: Callable[[CurveResult], None] | None = None,
) -> dict[str, CurveResult]:
    """Every requested mode's curve on the same tasks (see `run_mode` for the arguments).

    `on_mode` is called with each mode's result as soon as it is done (e.g. to print or save rollouts).
    """
    results: dict[str, CurveResult] = {}
    for mode in parse_modes(modes):
        results[mode] = run_mode(
            mode,
            engine,
            builder,
            config,
            tasks=tasks,
            make_env=make_env,
            writer=writer,
            max_k=max_k,
            iid_samples=iid_samples,
            phase=phase,
            progress=progress,
        )
        if on_mode is not None:
            on_mode(results[mode])
    return results


def curve_tasks(
    config: Settings, *, split: str | None = None, num_tasks: int | None = None, task_ids: Sequence[str] | None = None
) -> list[Task]:
    """The tasks of the curves, chosen as `eval_tasks` chooses evaluation tasks (seeded order, first n).

    Args:
      config: the run's config (`env.*`, `eval.num_tasks`, `seed`); not modified.
      split: the split (default `env.train_split`: the paper measures on its training split's hard tasks).
      num_tasks: how many (default `eval.num_tasks`; 0 = all), in `eval_tasks`' seeded order, taken after the
        `task_ids` filter.
      task_ids: keep only these tasks (e.g. a list of Pass@128 = 0 tasks); unknown ids are a ValueError.
    """
    n = config.eval.num_tasks if num_tasks is None else num_tasks
    if n < 0:
        raise ValueError(f"num_tasks must be >= 0 (0 = all), got {n}")
    split = split or config.env.train_split
    c = replace(config, {"env.eval_split": split, "eval.num_tasks": 0 if task_ids is not None else n})
    tasks = eval_tasks(c)
    if task_ids is None:
        return tasks
    wanted = list(dict.fromkeys(task_ids))
    if not wanted:
        raise ValueError("task_ids is empty: give at least one task id (or None for the whole split)")
    known = {t.task_id for t in tasks}
    missing = [t for t in wanted if t not in known]
    if missing:
        raise ValueError(f"{len(missing)} task id(s) not in split {c.env.eval_split!r}, e.g. {', '.join(missing[:5])}")
    keep = set(wanted)
    tasks = [t for t in tasks if t.task_id in keep]
    return TaskSource(tasks, seed=config.seed).take(min(n, len(tasks))) if n else tasks


# ----------------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------------

CSV_HEADER = ("mode", "k", "pass_at_k", "n_tasks", "mean_insights")


def curve_rows(results: Mapping[str, CurveResult]) -> list[tuple[str, int, float, int, float]]:
    """One row per mode and k: (mode, k, Pass@k, tasks counted, mean insights in context at attempt k)."""
    return [
        (r.mode, k, float(r.pass_at_k[k - 1]), r.n_tasks, float(r.mean_insights[k - 1]))
        for r in results.values()
        for k in range(1, r.max_k + 1)
    ]


def plot_curves(results: Mapping[str, CurveResult], path: str | os.PathLike) -> str:
    """Figure 11/12: Pass@k (%) against k, one line per mode; returns the path."""
    fig = new_figure(5.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for r in results.values():
        ks = np.arange(1, r.max_k + 1)
        ax.plot(ks, 100.0 * r.pass_at_k, marker="o", markersize=3, label=f"{MODE_LABELS[r.mode]} (n={r.n_tasks})")
    from matplotlib.ticker import MaxNLocator

    peak = max((float(np.nanmax(r.pass_at_k)) for r in results.values() if np.isfinite(r.pass_at_k).any()), default=0.0)
    ax.set_xlabel("attempts k (sequential: k - 1 insights in context)")
    ax.set_ylabel("Pass@k (%)")
    ax.set_ylim(0, max(10.0, min(100.0, 110.0 * peak)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Insight exploration (frozen policy)")
    return save_figure(fig, path)


def write_curves(results: Mapping[str, CurveResult], out_dir: str | os.PathLike) -> list[str]:
    """insight_curves.csv (mode, k, pass_at_k, n_tasks, mean_insights), insight_curves_attempts.csv (mode,
    task_id, attempt, success, n_insights, env_steps) and insight_curves.png."""
    attempts = [
        (r.mode, a.task.task_id, a.index, int(a.success), len(a.insights), a.env_steps)
        for r in results.values()
        for group in r.phase.groups().values()
        for a in group
    ]
    return [
        write_csv(os.path.join(out_dir, "insight_curves.csv"), CSV_HEADER, curve_rows(results)),
        write_csv(
            os.path.join(out_dir, "insight_curves_attempts.csv"),
            ("mode", "task_id", "attempt", "success", "n_insights", "env_steps"),
            attempts,
        ),
        plot_curves(results, os.path.join(out_dir, "insight_curves.png")),
    ]
