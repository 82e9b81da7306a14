"""Which tasks an evaluation runs and how its attempts are counted, below the trainer and the analyses.

`eval_tasks` picks the run's evaluation tasks (held-out `env.eval_split`, or held-in `env.train_split`) in a seeded
order fixed for the run; `attempt_records` is the metrics' view (`metrics.AttemptRecord`) of a phase's attempts.
`train.evaluation` runs the evaluation with them; `analysis.insight_curves` measures its curves on the same tasks.
"""

from __future__ import annotations

from rltldr_jax.agent.collector import PhaseResult
from rltldr_jax.envs import Task, TaskSource, load_tasks
from rltldr_jax.metrics import AttemptRecord
from rltldr_jax.settings import Settings


def attempt_records(result: PhaseResult) -> list[AttemptRecord]:
    """The metrics' view of a phase's attempts."""
    return [
        AttemptRecord(a.task.task_id, a.index, a.success, bool(a.insights), a.env_steps, a.generated_tokens)
        for a in result.attempts
    ]


def eval_tasks(config: Settings, *, on_train_split: bool = False) -> list[Task]:
    """`eval.num_tasks` tasks of `env.eval_split` (all of them when 0), in a seeded order fixed for the run; with
    `on_train_split`, `eval.train_num_tasks` tasks of `env.train_split` instead (the held-in evaluation)."""
    split, n = (
        (config.env.train_split, config.eval.train_num_tasks)
        if on_train_split
        else (config.env.eval_split, config.eval.num_tasks)
    )
    tasks = load_tasks(config.env.name, split, seed=config.env.seed)
    if n:
        tasks = TaskSource(tasks, seed=config.seed).take(min(n, len(tasks)))
    return list(tasks)
