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


def split_names(splits: str) -> tuple[str, ...]:
    """The names of `eval.splits` ("valid,tier1"), in order; ValueError (one line) for an empty or repeated name or a
    name that is not [a-z0-9_] (it becomes a metrics prefix, `eval_<split>/`)."""
    names = tuple(s.strip() for s in splits.split(",")) if splits.strip() else ()
    for name in names:
        if not name or not all(c.isascii() and (c.isalnum() or c == "_") for c in name) or name != name.lower():
            raise ValueError(f"eval.splits={splits!r}: {name!r} is not a split name (lowercase letters, digits, _)")
    if len(set(names)) != len(names):
        raise ValueError(f"eval.splits={splits!r} names a split twice")
    if "train" in names:  # its prefix would be eval_train/, the held-in evaluation's
        raise ValueError(f"eval.splits={splits!r}: evaluate the training split with eval.train_num_tasks (eval_train/)")
    return names


def split_eval_tasks(config: Settings) -> dict[str, list[Task]]:
    """{split: tasks} of `eval.splits`: each the first `eval.split_tasks` tasks of the split (all when 0) in an order
    seeded by `env.seed` alone, so that every run seed evaluates the same set. Loading them at start (the trainer
    does) finds an unknown split before anything trains."""
    out = {}
    for split in split_names(config.eval.splits):
        tasks = load_tasks(config.env.name, split, seed=config.env.seed)
        n = config.eval.split_tasks
        out[split] = list(TaskSource(tasks, seed=config.env.seed).take(min(n, len(tasks))) if n else tasks)
    return out


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
