"""The RLTL;DR training loop: phases of sequential collection, then the update, weight push, logs, checkpoints.

    trainer = Trainer(config)        # config from configs/*.py (validated)
    trainer.run()                    # until train.env_step_budget / train.max_phases
    trainer.evaluate()               # held-out tasks, K attempts each, no insights: macro Pass@1 and Pass@K

One phase: `rollout.tasks_per_phase` tasks from the task cursor; the collector runs ≥ K attempts per task with
insights inserted by the schedule; `phase_examples` turns attempts into one example per step (advantages,
filters, masks); `batch.ppo_epochs` passes of jitted `train_step`s (shuffled each epoch); the new weights go to
the engine with version = phase + 1. TensorBoard gets the deconfounded metrics with the environment-step count
as x-axis (and tokens / walltime variants); checkpoints hold params, optimizer state, RNG, the task cursor and
the counters, so `resume=True` continues where the run stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import jax
import numpy as np

from rltldr_jax.agent.collector import Collector, save_phase
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.insight import InsightWriter, insight_scaffold
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.engines.factory import close_engine, policy_engine, teacher_engine
from rltldr_jax.envs import TaskSource, load_tasks
from rltldr_jax.metrics import summarize
from rltldr_jax.tokenization import ContextBuilder
from rltldr_jax.train.batching import pack, phase_examples
from rltldr_jax.train.evaluation import attempt_records, evaluate
from rltldr_jax.train.setup import ShardedUpdate, build_policy, env_maker, policy_tokenizer, workdir_of  # noqa: F401 (workdir_of re-exported)
from rltldr_jax.train.summary import SummaryWriter
from rltldr_jax.train.step import LossConfig, make_optimizer

log = logging.getLogger(__name__)


class Trainer:
    """Builds every part from a config and runs phases (see the module docstring).

    Args:
      config: a validated config (`configs.base.resolve`).
      resume: continue from the latest checkpoint in the workdir, if any.
      progress: progress bars for collection.
    """

    def __init__(self, config: Any, *, resume: bool = False, progress: bool = False):
        self.config = config
        self.workdir = workdir_of(config)
        os.makedirs(self.workdir, exist_ok=True)
        self.tokenizer = policy_tokenizer(config)
        self.builder = ContextBuilder(self.tokenizer, thinking=config.rollout.thinking,
                                      insight_scaffold=insight_scaffold(config.insight.content))  # fmt: skip
        model = build_policy(config)
        self.model_config = model.config
        o = config.optim
        tx = make_optimizer(o.learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
        loss_cfg = LossConfig(lam=config.loss.lam, grpo_coef=config.loss.grpo_coef, clip_eps=config.loss.clip_eps,
                              judge_coef=config.loss.judge_sft_coef)  # fmt: skip
        self.update = ShardedUpdate(config, model, tx, loss_cfg)
        self.rng = jax.random.key(config.seed)
        self.tasks = TaskSource(load_tasks(config.env.name, config.env.train_split, seed=config.env.seed), seed=config.seed)
        self.phase = 0
        self.env_steps = 0
        self.tokens = 0
        self.version = 0
        self.start_time = time.time()
        self.checkpoints = Checkpointer(os.path.join(self.workdir, "checkpoints"), keep=config.train.keep_checkpoints)
        if resume and self.checkpoints.latest_step() is not None:
            self._restore()
        self.engine = policy_engine(config, self.update.model(), workdir=self.workdir, version=self.version)
        self.teacher, teacher_tokenizer = (None, None) if config.insight.schedule == "never" else teacher_engine(config)
        self.schedule = InsightSchedule.from_config(config)
        writer = None
        if config.insight.schedule != "never":
            writer = InsightWriter.from_config(config, self.tokenizer, self.engine, self.teacher, teacher_tokenizer)
        self.progress = progress
        self.collector = Collector(
            self.engine, self._make_env, self.builder, EpisodeConfig.from_config(config), self.schedule, writer,
            group_size=config.rollout.group_size, workers_per_task=config.rollout.workers_per_task,
            insight_after=config.insight.after, exact_group_size=config.rollout.exact_group_size, progress=progress,
        )  # fmt: skip
        self.summary = SummaryWriter(os.path.join(self.workdir, "tb"))

    @property
    def params(self) -> Any:
        """The policy's parameters (an nnx.State on the mesh)."""
        return self.update.params

    @property
    def opt_state(self) -> Any:
        return self.update.opt_state

    # -- parts ------------------------------------------------------------------------------------------------

    def _make_env(self):
        return env_maker(self.config)()

    # -- the loop ---------------------------------------------------------------------------------------------

    def done(self) -> bool:
        t = self.config.train
        return bool((t.env_step_budget and self.env_steps >= t.env_step_budget) or (t.max_phases and self.phase >= t.max_phases))

    def run(self) -> None:
        try:
            while not self.done():
                self.run_phase()
                if self.config.eval.every and self.phase % self.config.eval.every == 0:
                    self.evaluate()
            if not self.config.eval.every:
                self.evaluate()
        finally:
            self.close()

    def run_phase(self) -> dict[str, float]:
        """One collection + update phase; returns its metrics."""
        c = self.config
        tasks = self.tasks.take(c.rollout.tasks_per_phase)
        t0 = time.time()
        result = self.collector.collect(tasks, self.phase)
        collect_s = time.time() - t0
        if c.rollout.save_rollouts:
            save_phase(os.path.join(self.workdir, "rollouts", f"phase_{self.phase:05d}.jsonl"), self.phase, result)
        examples, stats = phase_examples(
            result.attempts, self.builder, std_normalize=c.loss.std_normalize, filter_zero_advantage=c.loss.filter_zero_advantage,
            positive_ratio=c.loss.positive_ratio, split_advantages=c.loss.split_advantages,
            keep_sft_only=c.loss.grpo_coef == 0 or c.loss.sft_on_filtered, insight_rollouts=c.loss.insight_rollouts,
            sft_prefix=c.loss.lam > 0, judgements=result.judgements,
            judge_sft=c.loss.judge_sft_filter if c.loss.judge_sft_coef > 0 else None, seed=c.seed + self.phase,
        )  # fmt: skip
        t0 = time.time()
        update = self._update(examples)
        update_s = time.time() - t0
        t0 = time.time()
        self.version = self.phase + 1
        self.engine.update_weights(self.update.model(), self.version)
        sync_s = time.time() - t0
        records = attempt_records(result)
        self.env_steps += result.env_steps
        self.tokens += sum(r.tokens for r in records)
        self.phase += 1
        metrics = {
            **{f"rollout/{k}": v for k, v in summarize(records, c.eval.attempts_per_task).items()},
            **{f"update/{k}": v for k, v in update.items()},
            "rollout/malformed_fraction": float(np.mean([a.end == "malformed" for a in result.attempts])),
            "insight/parse_failures": float(result.parse_failures),
            "insight/written": float(sum(j.insight is not None for _, _, j in result.judgements)),
            "filter/kept_attempts": float(stats.kept_attempts),
            "filter/zero_advantage_groups": float(stats.zero_advantage_groups),
            "filter/examples": float(stats.examples),
            "filter/judge_examples": float(stats.judge_examples),
            "time/collect_s": collect_s, "time/update_s": update_s, "time/weight_sync_s": sync_s,
            "progress/phase": float(self.phase), "progress/tokens": float(self.tokens),
        }  # fmt: skip
        self.summary.scalars(metrics, self.env_steps, tokens=self.tokens, walltime=time.time() - self.start_time)
        log.info("phase %d: %s", self.phase, json.dumps({k: round(v, 4) for k, v in metrics.items() if np.isfinite(v)}))
        if c.train.checkpoint_every and self.phase % c.train.checkpoint_every == 0:
            self.save()
        return metrics

    def _update(self, examples) -> dict[str, float]:
        """`ppo_epochs` passes of optimizer steps over the examples (shuffled per epoch); mean metrics."""
        b = self.config.batch
        if not examples:
            return {"optimizer_steps": 0.0}
        sums: dict[str, float] = {}
        first: dict[str, float] = {}
        n = 0
        order_rng = np.random.default_rng([self.config.seed, self.phase])
        for _ in range(b.ppo_epochs):
            shuffled = [examples[i] for i in order_rng.permutation(len(examples))]
            for batch in pack(shuffled, micro_batch_size=b.micro_batch_size, grad_accum_steps=b.grad_accum_steps,
                              pad_to_multiple=b.pad_to_multiple, max_len=self.config.rollout.max_context_tokens):  # fmt: skip
                metrics = self.update.step(batch)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                if n == 0:  # before any update: the ratio is 1 up to the engine-vs-trainer mismatch
                    first = {f"first_minibatch/{k}": float(metrics[k]) for k in ("clip_fraction", "importance_ratio", "logprob_gap")}
                n += 1
        return {**{k: v / n for k, v in sums.items()}, **first, "optimizer_steps": float(n)}

    def evaluate(self) -> dict[str, float]:
        """Held-out tasks, `eval.attempts_per_task` attempts each, no insights: macro Pass@1 and Pass@K
        (train/evaluation.py), logged at the current environment-step count."""
        metrics, _ = evaluate(self.engine, self.builder, self.config, make_env=self._make_env, tag=self.phase, progress=self.progress)
        self.summary.scalars(metrics, self.env_steps, tokens=self.tokens, walltime=time.time() - self.start_time)
        log.info("eval after phase %d: %s", self.phase, json.dumps({k: round(v, 4) for k, v in metrics.items() if np.isfinite(v)}))
        return metrics

    # -- checkpoints ------------------------------------------------------------------------------------------

    def save(self) -> None:
        meta = {
            "phase": self.phase, "env_steps": self.env_steps, "tokens": self.tokens, "version": self.version,
            "task_cursor": self.tasks.state(), "config": self.config.to_dict(),
        }  # fmt: skip
        self.checkpoints.save(self.phase, params=self.update.params, opt_state=self.update.opt_state, rng=self.rng, meta=meta,
                              model_config=self.model_config)  # fmt: skip

    def _restore(self) -> None:
        abstract_params, abstract_opt = self.update.abstract()  # restore straight into the mesh layout
        restored = self.checkpoints.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
        self.update.params, self.update.opt_state, self.rng = restored.params, restored.opt_state, restored.rng
        meta = restored.meta
        self.phase, self.env_steps, self.tokens, self.version = meta["phase"], meta["env_steps"], meta["tokens"], meta["version"]
        self.tasks.restore(meta["task_cursor"])
        log.info("resumed from phase %d (%d environment steps)", self.phase, self.env_steps)

    def close(self) -> None:
        self.checkpoints.wait_until_finished()
        self.summary.close()
        for engine in (self.engine, self.teacher):
            close_engine(engine)
