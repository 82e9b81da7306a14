"""Evaluation (§4.1, App. D.1): held-out tasks, a fixed number of attempts per task, no insights.

    metrics, result = evaluate(engine, builder, config, make_env=..., tag=phase)
    metrics["eval/pass@1/all"], metrics["eval/pass@8/all"]       # macro over tasks

Every task gets exactly `eval.attempts_per_task` attempts (the collector's exact mode: an evaluation must not
give easy tasks more samples), with the insight schedule "never" and no insight writer, so the policy one-shots
every attempt as at test time. Pass@k is the unbiased estimator averaged over tasks (metrics.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import ml_collections

from rltldr_jax.agent.collector import Collector, PhaseResult
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs import Env, Task, TaskSource, load_tasks
from rltldr_jax.metrics import AttemptRecord, summarize
from rltldr_jax.tokenization import ContextBuilder, context_builder


def attempt_records(result: PhaseResult) -> list[AttemptRecord]:
    """The metrics' view of a phase's attempts."""
    return [
        AttemptRecord(a.task.task_id, a.index, a.success, bool(a.insights), a.env_steps, a.generated_tokens)
        for a in result.attempts
    ]


def eval_tasks(config: ml_collections.ConfigDict, *, on_train_split: bool = False) -> list[Task]:
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


def evaluate(
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: ml_collections.ConfigDict,
    *,
    make_env: Callable[[], Env],
    tag: int = 0,
    tasks: list[Task] | None = None,
    progress: bool = False,
    prefix: str = "eval",
) -> tuple[dict[str, float], PhaseResult]:
    """Runs the evaluation and returns (metrics under `{prefix}/`, the attempts).

    Args:
      engine: the policy's engine (its current weights are evaluated).
      builder: the context builder.
      config: the run's config (`eval.*`, rollout budgets and sampling).
      make_env: builds one environment.
      tag: distinguishes evaluations in the sampling seeds (the trainer passes its phase); seeds never collide
        with training phases (those use tags >= 0, evaluations -1 - tag).
      tasks: the tasks (default: `eval_tasks(config)`).
      progress: a progress bar.
      prefix: the metrics' prefix ("eval" for held-out tasks, "eval_train" for the held-in evaluation).
    """
    tasks = eval_tasks(config) if tasks is None else tasks
    k = config.eval.attempts_per_task
    collector = Collector(
        engine,
        make_env,
        builder,
        EpisodeConfig.from_config(config),
        InsightSchedule("never"),
        None,
        group_size=k,
        exact_group_size=True,
        progress=progress,
    )
    result = collector.collect(tasks, phase=-1 - tag)
    metrics = {f"{prefix}/{name}": v for name, v in summarize(attempt_records(result), k).items()}
    return metrics, result


def policy_for_eval(config: ml_collections.ConfigDict, checkpoint: str | None) -> tuple[Any, str, int | None]:
    """(model, description, training step or None) of the policy `launch/eval.py` evaluates: `checkpoint` (an HF
    directory or a training checkpoint directory `DIR[:STEP]`), else the latest checkpoint of the config's workdir,
    else `model.checkpoint`, else the tiny preset's random initialisation."""
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import Checkpointer, load_model, split_step
    from rltldr_jax.models import ModelSpec, get_preset
    from rltldr_jax.train.setup import workdir_of

    dtype = getattr(jnp, config.model.dtype)
    if checkpoint is None:
        run = os.path.join(workdir_of(config), "checkpoints")
        if (
            os.path.isdir(run)
            and Checkpointer(run, keep=None, async_save=False, create=False).latest_step() is not None
        ):
            checkpoint = run
        elif config.model.checkpoint:
            checkpoint = config.model.checkpoint
    if checkpoint is not None:
        model, what = load_model(
            checkpoint,
            compute_dtype=dtype,
            param_dtype=getattr(jnp, config.model.param_dtype),
            allow_nonfinite=config.model.allow_nonfinite,
        )
        directory, step = split_step(checkpoint)
        if step is None and not os.path.isfile(os.path.join(directory, "config.json")):
            step = Checkpointer(directory, keep=None, async_save=False, create=False).latest_step()
        return model, what, step
    if config.model.preset != "tiny":
        raise ValueError(
            f"nothing to evaluate: no checkpoint in {workdir_of(config)}/checkpoints and no model.checkpoint; give "
            "--checkpoint=DIR (an HF directory or a run's checkpoints, DIR:STEP for a given step)"
        )
    spec = ModelSpec(get_preset("tiny"), dtype=dtype, param_dtype=getattr(jnp, config.model.param_dtype))
    return spec.build(seed=config.seed), "the tiny preset's random initialisation", None


def evaluate_checkpoint(
    config: ml_collections.ConfigDict, checkpoint: str | None = None, out: str | None = None
) -> dict[str, Any]:
    """What `launch/eval.py` does: evaluates a checkpoint, writes the JSON report, prints the headline numbers.

    The sampling seeds are those of the trainer's own evaluation after phase `step` (the checkpoint's step), so
    evaluating training checkpoint N repeats the in-training evaluation after phase N (exactly, one task at a
    time). With engine.kind=grpc|sglang the weights are pushed to the running servers first.

    Returns:
      The report: policy, env, split, attempts_per_task, seconds, metrics, per_task successes.
    """
    from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine
    from rltldr_jax.train.setup import env_maker, policy_tokenizer, workdir_of

    model, what, step = policy_for_eval(config, checkpoint)
    builder = context_builder(config, policy_tokenizer(config))
    workdir = workdir_of(config)
    engine = policy_engine(EngineConfig.from_config(config), model, workdir=workdir)
    t0 = time.time()
    try:
        if config.engine.kind != "jax":
            engine.update_weights(model, engine.weight_version + 1)  # serve exactly the evaluated weights
        metrics, result = evaluate(
            engine, builder, config, tag=step or 0, progress=sys.stderr.isatty(), make_env=env_maker(config)
        )
    finally:
        close_engine(engine)
    per_task = {tid: [a.success for a in group] for tid, group in result.groups().items()}
    report = {
        "policy": what,
        "env": config.env.name,
        "split": config.env.eval_split,
        "attempts_per_task": config.eval.attempts_per_task,
        "seconds": round(time.time() - t0, 1),
        "metrics": metrics,
        "per_task": per_task,
    }
    if out is None:
        tag = os.path.basename(os.path.normpath(checkpoint.replace(":", "_"))) if checkpoint else "latest"
        out = os.path.join(workdir, "eval", f"eval_{tag}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=float)
    k = config.eval.attempts_per_task
    print(f"{what}: {len(per_task)} tasks × {k} attempts of {config.env.name}/{config.env.eval_split}")
    print(f"  macro Pass@1 = {metrics['eval/pass@1/all']:.4f}   macro Pass@{k} = {metrics[f'eval/pass@{k}/all']:.4f}")
    print(f"  written to {out}")
    return report
