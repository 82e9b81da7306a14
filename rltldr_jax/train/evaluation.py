"""Evaluation (§4.1, App. D.1): held-out tasks, a fixed number of attempts per task, no insights.

    metrics, result = evaluate(engine, builder, config, make_env=..., tag=phase)
    metrics["eval/pass@1/all"], metrics["eval/pass@8/all"]       # macro over tasks

Every task gets exactly `eval.attempts_per_task` attempts (the collector's exact mode: an evaluation must not
give easy tasks more samples), with the insight schedule "never" and no insight writer, so the policy one-shots
every attempt as at test time. Pass@k is the unbiased estimator averaged over tasks (metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rltldr_jax.agent.collector import Collector, PhaseResult
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs import Env, Task, TaskSource, load_tasks
from rltldr_jax.metrics import AttemptRecord, summarize
from rltldr_jax.tokenization import ContextBuilder


def attempt_records(result: PhaseResult) -> list[AttemptRecord]:
    """The metrics' view of a phase's attempts."""
    return [
        AttemptRecord(a.task.task_id, a.index, a.success, bool(a.insights), a.env_steps, a.generated_tokens)
        for a in result.attempts
    ]


def eval_tasks(config: Any) -> list[Task]:
    """`eval.num_tasks` tasks of `env.eval_split` (all of them when 0), in a seeded order fixed for the run."""
    tasks = load_tasks(config.env.name, config.env.eval_split, seed=config.env.seed)
    if config.eval.num_tasks:
        tasks = TaskSource(tasks, seed=config.seed).take(min(config.eval.num_tasks, len(tasks)))
    return list(tasks)


def evaluate(
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: Any,
    *,
    make_env: Callable[[], Env],
    tag: int = 0,
    tasks: list[Task] | None = None,
    progress: bool = False,
) -> tuple[dict[str, float], PhaseResult]:
    """Runs the evaluation and returns (metrics under `eval/`, the attempts).

    Args:
      engine: the policy's engine (its current weights are evaluated).
      builder: the context builder.
      config: the run's config (`eval.*`, rollout budgets and sampling).
      make_env: builds one environment.
      tag: distinguishes evaluations in the sampling seeds (the trainer passes its phase); seeds never collide
        with training phases (those use tags >= 0, evaluations -1 - tag).
      tasks: the tasks (default: `eval_tasks(config)`).
      progress: a progress bar.
    """
    tasks = eval_tasks(config) if tasks is None else tasks
    k = config.eval.attempts_per_task
    collector = Collector(
        engine, make_env, builder, EpisodeConfig.from_config(config), InsightSchedule("never"), None,
        group_size=k, exact_group_size=True, progress=progress,
    )  # fmt: skip
    result = collector.collect(tasks, phase=-1 - tag)
    metrics = {f"eval/{name}": v for name, v in summarize(attempt_records(result), k).items()}
    return metrics, result
