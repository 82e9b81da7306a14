"""Offline SFT baselines of Table 2, from the saved rollouts of an RLTL;DR run (`config.mode = "sft"`).

    python launch/sft.py --config=configs/sapi.py --ablation=sft_rollouts_1k --config.sft.rollouts_dir=runs/sapi-rltldr

`sft.data`:
- `rollouts`: SFT on successful full rollouts (all of them, or a seeded sample of `sft.num_rollouts`): every step
  of a successful attempt is one example whose target is the step's sampled tokens (think + action, forced tokens
  excluded), with the attempt's insights in context but not trained on (§5.1: "insights in context, not trained").
- `insights`: SFTL;DR, π(f_1..f_I | task): for every insight-conditioned attempt, the task and its insights, the
  target being the insight sentences (what L_SFT trains inside RLTL;DR, here without GRPO and without the rollout).
  With `sft.deduplicate`, each unique (task, insight) pair is one example with that insight alone.
Training: `sft.epochs` passes (10 in §5.1), AdamW at `sft.learning_rate`, mean token NLL (the trainer's SFT term with
λ = 1 and no GRPO term), the same sharded step as RL. Then a checkpoint (`{workdir}/checkpoints`, step = epochs) and
the held-out evaluation. TensorBoard (and W&B with `logging.wandb`): `sft/nll` and `sft/learning_rate` per epoch at
the optimizer-step count; `{workdir}/config.json`: the run's config.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from rltldr_jax.agent.eval_set import split_eval_tasks
from rltldr_jax.agent.rollout_files import RolloutRecord, load_rollouts
from rltldr_jax.agent.step_examples import Example, attempt_examples
from rltldr_jax.chat_template import check_chat_format
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.distributed import from_main_process
from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine
from rltldr_jax.settings import Settings, as_dict, build, choices
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.tokenization import ContextBuilder, Insight, context_builder
from rltldr_jax.train.batching import insight_prefix_example, length_buckets, pack
from rltldr_jax.train.evaluation import evaluate_all
from rltldr_jax.train.loggers import SFT_AXES, open_loggers
from rltldr_jax.train.resume import claim_workdir, start_undo
from rltldr_jax.train.setup import ShardedUpdate, build_policy, env_maker, policy_tokenizer, workdir_of
from rltldr_jax.train.step import LossConfig, NonFiniteGuard, learning_rate_of, optimizer_of

log = logging.getLogger(__name__)

SFT_DATA = choices("sft.data")


@dataclasses.dataclass(frozen=True)
class SFTData:
    """The examples of an offline SFT run and what they came from."""

    examples: list[Example]
    attempts: int  # attempts the examples were built from
    target_tokens: int


def _as_target(e: Example) -> Example:
    """The step's sampled tokens become the SFT target; the insights stay in context untrained."""
    return dataclasses.replace(
        e, insight_mask=e.action_mask.copy(), action_mask=np.zeros_like(e.action_mask), advantage=0.0
    )


def sft_examples(
    records: Sequence[RolloutRecord],
    builder: ContextBuilder,
    *,
    data: str,
    num_rollouts: int = 0,
    deduplicate: bool = False,
    seed: int = 0,
) -> SFTData:
    """The Table 2 training set from saved rollouts (see the module docstring).

    Args:
      records: the run's saved attempts (`agent.rollout_files.load_rollouts`).
      data: "rollouts" | "insights".
      num_rollouts: for "rollouts", use this many successful attempts (seeded sample); 0 = all.
      deduplicate: for "insights", one example per unique (task, insight).
      seed: the sample's seed.
    """
    if data not in SFT_DATA:
        raise ValueError(f"sft.data={data!r}; choose one of {', '.join(SFT_DATA)}")
    examples: list[Example] = []
    if data == "rollouts":
        successes = [r.attempt for r in records if r.success]
        if not successes:
            raise ValueError("the saved rollouts hold no successful attempt: SFT on rollouts has nothing to train on")
        if num_rollouts and num_rollouts < len(successes):
            order = np.random.default_rng(seed).permutation(len(successes))[:num_rollouts]
            successes = [successes[i] for i in sorted(order)]
        for a in successes:
            examples += [_as_target(e) for e in attempt_examples(a, 0.0, builder)]
        used = len(successes)
    else:
        conditioned = [r.attempt for r in records if r.attempt.insights]
        if not conditioned:
            raise ValueError("the saved rollouts hold no insight-conditioned attempt: SFTL;DR has nothing to train on")
        if deduplicate:
            pairs: dict[tuple[str, str], tuple[Any, Insight]] = {}
            for a in conditioned:
                for i in a.insights:
                    pairs.setdefault((a.task.task_id, i.text), (a.task, i))
            contexts = [(task, (insight,)) for task, insight in pairs.values()]
        else:
            contexts = [(a.task, a.insights) for a in conditioned]
        examples += [insight_prefix_example(task, insights, builder) for task, insights in contexts]
        used = len(conditioned)
    return SFTData(examples, used, int(sum(e.insight_mask.sum() for e in examples)))


def run_sft(config: Settings, *, progress: bool = False, restart: bool = False) -> dict[str, float]:
    """Trains the offline SFT baseline of `config.sft`, checkpoints it, evaluates it; returns the metrics.

    Like a `Trainer`, it refuses a workdir that holds a run (`RunExistsError`; `restart=True` moves that run to
    `{workdir}.old-<time>` first) or that another process is running in (`WorkdirInUseError`). An offline run is not
    resumable: a stopped one starts over.
    """
    if config.mode != "sft":
        raise ValueError(f"config.mode={config.mode!r}: offline SFT runs need mode='sft' (an sft_* / sftldr* ablation)")
    if not config.sft.rollouts_dir:
        raise ValueError(
            "sft.rollouts_dir is empty: give the workdir (or rollouts directory) of an RLTL;DR run, e.g. "
            "--config.sft.rollouts_dir=runs/sapi-rltldr"
        )
    workdir = workdir_of(config)
    undo = start_undo(workdir, restart=restart)
    try:
        lock = claim_workdir(workdir, resume=False, restart=restart)
    except BaseException:
        undo(None)
        raise
    try:
        summary = _run_sft(config, workdir, progress)
    except BaseException:
        undo(lock)  # (what it wrote stays; a lock and empty directories do not)
        raise
    lock.close()
    return summary


def _run_sft(config: Settings, workdir: str, progress: bool) -> dict[str, float]:
    sets = split_eval_tasks(config)  # eval.splits: an unknown split stops here, before anything trains
    builder = context_builder(config, policy_tokenizer(config))
    check_chat_format(builder)  # our contexts = the checkpoint's chat template
    s = config.sft
    data = sft_examples(
        load_rollouts(s.rollouts_dir),
        builder,
        data=s.data,
        num_rollouts=s.num_rollouts,
        deduplicate=s.deduplicate,
        seed=config.seed,
    )
    model = build_policy(config)
    tx = optimizer_of(config.optim, learning_rate=s.learning_rate)
    update = ShardedUpdate(
        build(MeshConfig, config.mesh),
        model,
        tx,
        LossConfig(lam=1.0, grpo_coef=0.0),
        micro_batch_size=config.batch.micro_batch_size,
        seed=config.seed,
    )
    loggers = open_loggers(config, workdir, axes=SFT_AXES)  # config.json, W&B (logging.wandb), TensorBoard
    b = config.batch
    buckets = length_buckets(b.length_buckets, b.pad_to_multiple, config.rollout.max_context_tokens)
    steps, t0 = 0, time.time()
    guard = NonFiniteGuard(config.train.max_nonfinite_skips)
    metrics: dict[str, float] = {
        "sft/examples": float(len(data.examples)),
        "sft/attempts": float(data.attempts),
        "sft/target_tokens": float(data.target_tokens),
    }
    try:
        for epoch in range(s.epochs):
            order = np.random.default_rng([config.seed, epoch]).permutation(len(data.examples))
            nll = []
            for batch in pack(
                [data.examples[i] for i in order],
                micro_batch_size=b.micro_batch_size,
                grad_accum_steps=b.grad_accum_steps,
                pad_to_multiple=b.pad_to_multiple,
                max_len=config.rollout.max_context_tokens,
                length_buckets=buckets,
            ):
                step_metrics = update.step(batch)
                nll.append(float(step_metrics["sft_nll"]))
                steps += 1
                guard.record(step_metrics, f"epoch {epoch + 1}, optimizer step {steps}")
            metrics["sft/nll"] = float(np.mean(nll))
            loggers.scalars(
                {
                    "sft/nll": metrics["sft/nll"],
                    "sft/epoch": float(epoch + 1),
                    "sft/learning_rate": learning_rate_of(config.optim, update.opt_state, s.learning_rate),
                },
                steps,
                tokens=0,
                walltime=time.time() - t0,
            )
            log.info("sft epoch %d/%d: nll %.4f", epoch + 1, s.epochs, metrics["sft/nll"])
        with Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.train.keep_checkpoints) as ckpt:
            ckpt.save(
                s.epochs,
                params=update.params,
                opt_state=update.opt_state,
                rng=None,
                meta={"mode": "sft", "sft": as_dict(s), "optimizer_steps": steps, "config": as_dict(config)},
                model_config=model.config,
            )
        policy = update.model()  # (every process: a collective in a multi-process job)

        def evaluate_here() -> dict[str, float]:  # process 0 holds the engine; the others get its numbers
            engine = policy_engine(EngineConfig.of(config), policy, workdir=workdir)
            try:
                return evaluate_all(
                    engine, builder, config, make_env=env_maker(config), tag=s.epochs, sets=sets, progress=progress
                )
            finally:
                close_engine(engine)

        evaluation = from_main_process(evaluate_here)
        loggers.scalars(evaluation, steps, tokens=0, walltime=time.time() - t0)
        metrics |= evaluation | {"sft/optimizer_steps": float(steps), "sft/skipped_nonfinite": float(guard.total)}
    finally:
        loggers.close(sys.exc_info()[1])  # (a W&B run ended by an exception is marked failed)
    return metrics
