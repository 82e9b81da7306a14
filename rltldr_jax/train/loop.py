"""The RLTL;DR training loop: phases of sequential collection, then the update, weight push, logs, checkpoints.

    trainer = Trainer(settings)      # settings = ablations.resolve(config of configs/*.py)
    trainer.run()                    # until train.env_step_budget / train.max_phases
    trainer.evaluate()               # held-out tasks, K attempts each, no insights: macro Pass@1 and Pass@K

One phase: `rollout.tasks_per_phase` tasks from the task cursor; the collector runs ≥ K attempts per task with
insights inserted by the schedule; `phase_examples` turns attempts into one example per step (advantages,
filters, masks); `batch.ppo_epochs` passes of jitted `train_step`s (shuffled each epoch); the new weights go to
the engine with version = phase + 1. TensorBoard (and W&B with `logging.wandb`: train/loggers.py) gets the
deconfounded metrics with the environment-step count as x-axis (and tokens / walltime variants), and
`{workdir}/config.json` the run's config; checkpoints hold params, optimizer state, RNG, the task cursor and
the counters, so `resume=True` continues where the run stopped (train/resume.py: a fresh run never reuses a
workdir that holds one, changed config keys are logged and checked, what a killed phase left is moved aside). The
`kl` loss term's reference policy is not checkpointed: a resumed run builds it from `model.checkpoint` as the fresh
run did, before restoring the checkpoint's params (`ShardedUpdate.ref_params`).
`run()` stops at the next safe point (before a phase or an evaluation) on SIGTERM / SIGINT, with a checkpoint of the
phases done (train/stopping.py); a resumed `run()` first redoes an evaluation due at the restored phase that
`metrics.jsonl` does not hold (a kill or a stop came before or during it), and does nothing for a finished run.

Each phase and evaluation logs one short line (train/report.py) through this module's logger at INFO (a caller
running many Trainers silences them with `logging.getLogger("rltldr_jax.train.loop").setLevel(logging.WARNING)`)
and appends every metric to `{workdir}/metrics.jsonl`. An optimizer step with a non-finite loss or gradient norm
is skipped (train_step), warned about, and counted (`update/skipped_nonfinite`); `train.max_nonfinite_skips` in a
row stop the run with NonFiniteError before the next checkpoint.

In a multi-process job (one process per host, `distributed.initialize_distributed`) every process runs the same
loop on the same global batches: process 0 alone holds the engines, collects, evaluates and writes events,
metrics and rollouts; what it collected or measured is broadcast (`distributed.from_main_process`).

Overlapped phases (`train.overlap_phases`, not in the paper; `run()` only, `run_phase()` always collects first):
phase n + 1 is collected in a background thread (`Collector.start`: its own asyncio loop) with the weights of
version n while the trainer updates on phase n; once both are done the engine gets version n + 1, so each phase is
sampled with one version, one behind the trainer's (`rollout/weight_version_gap/{mean,max}` = trainer version −
sampler version over the phase's steps: 0 for the run's first phase and the first after a resume, 1 for the
others). The importance ratio against the sampler's logprobs corrects for the lag; `train.max_logprob_gap`'s check
is skipped on lagged phases (their gap measures the previous update). `time/phase_s` is a phase's wall time in the
main thread and `time/prefetch_wait_s` how long the weight push waited for the background collection.
- Budget: the next phase is prefetched only if the run will train it (its step count is known before the update),
  so `train.env_step_budget` / `train.max_phases` never collect a phase for nothing.
- Errors: the NaN guard, a failed checkpoint save or an interrupt during the update cancels the prefetched phase
  (discarded, not counted, its tasks returned to the cursor) and joins its thread; `close()` does the same before it
  closes the engines. An exception in the background collection is raised in the main thread, with its message and
  a note naming the phase, when that phase is due: after the phase being trained is logged and checkpointed.
- Evaluations run between phases, when no collection is in flight, with the newly pushed weights.
- Checkpoints: a checkpoint taken while phase n + 1 is prefetched saves the task cursor before its tasks, and a
  resumed run collects phase n + 1 again, synchronously, with the checkpoint's weights (version gap 0), so
  resume == uninterrupted holds for sync runs only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rltldr_jax.agent.collector import Collector, PendingPhase, PhaseResult
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.eval_set import attempt_records, split_eval_tasks
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.rollout_files import save_phase
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.agent.step_examples import Example
from rltldr_jax.chat_template import check_chat_format
from rltldr_jax.checkpoint import Checkpointer, CorruptCheckpointError
from rltldr_jax.distributed import from_main_process, gather_objects, is_main_process
from rltldr_jax.engines.engine import OnMainProcess
from rltldr_jax.engines.factory import EngineConfig, close_engine, ensure_served, policy_engine, teacher_engine
from rltldr_jax.envs import TaskSource, load_tasks
from rltldr_jax.metrics import summarize
from rltldr_jax.settings import Settings, as_dict, build
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.tokenization import context_builder
from rltldr_jax.train.batching import ExampleConfig, length_buckets, pack, phase_examples
from rltldr_jax.train.evaluation import evaluate_all
from rltldr_jax.train.loggers import open_loggers
from rltldr_jax.train.report import MetricsLog, eval_line, phase_line
from rltldr_jax.train.resume import (
    check_config_changes,
    claim_workdir,
    move_aside,
    recorded_evaluations,
    rollouts_from,
    start_undo,
)
from rltldr_jax.train.setup import ShardedUpdate, build_policy, env_maker, policy_tokenizer, workdir_of
from rltldr_jax.train.step import LossConfig, NonFiniteGuard, check_logprob_gap, learning_rate_of, optimizer_of
from rltldr_jax.train.stopping import Interrupted, RunStopped, StopSignals, signal_name

log = logging.getLogger(__name__)


class Trainer:
    """Builds every part from a config and runs phases (see the module docstring).

    Args:
      config: the run's settings (`rltldr_jax.config.ablations.resolve` of a config: validated, paths absolute).
      resume: continue from the newest intact checkpoint in the workdir (a damaged newer one is skipped with a
        warning), if any. Rollout files, checkpoints and TensorBoard events the stopped run wrote after it are
        moved aside or purged, so redone phases appear once. Without `resume` (or `restart`) a workdir that already
        holds a run is refused (`RunExistsError`), and so is a workdir another process is running in
        (`WorkdirInUseError`; the lock is held until `close`).
      restart: start afresh, first moving a run in the workdir to `{workdir}.old-YYYYmmdd-HHMMSS`.
      resume_step: resume from this checkpoint step (implies `resume`; no fallback).
      allow_config_change: on resume, accept changes of keys that define what the run trains (loss, optimizer,
        rollout, insight, env, model, seed, ...; `resume.RESUME_FREE_KEYS` lists those that may always change).
      progress: progress bars (`rltldr_jax.progress`): while `run` goes on, one of the whole run (environment steps
        against `train.env_step_budget`, else phases against `train.max_phases`; log lines are written through it),
        and one of each collection and update, labelled as the log names the phase.
    """

    def __init__(
        self,
        config: Settings,
        *,
        resume: bool = False,
        restart: bool = False,
        resume_step: int | None = None,
        allow_config_change: bool = False,
        progress: bool = False,
    ):
        self.config = config
        self.workdir = workdir_of(config)
        resume = resume or resume_step is not None
        undo = None if resume else start_undo(self.workdir, restart=restart)
        try:
            self._lock = claim_workdir(self.workdir, resume=resume, restart=restart)
        except BaseException:
            if undo is not None:  # (a refused workdir keeps no lock file of this start)
                undo(None)
            raise
        try:
            self._build(resume, resume_step, allow_config_change, progress)
        except BaseException:
            if undo is None:
                self._lock.close()
            else:  # a fresh start leaves the workdir as it found it (no lock, no empty checkpoints/)
                undo(self._lock)
            raise

    def _build(self, resume: bool, resume_step: int | None, allow_config_change: bool, progress: bool) -> None:
        config = self.config
        self.checkpoints = Checkpointer(os.path.join(self.workdir, "checkpoints"), keep=config.train.keep_checkpoints)
        candidates: list[int] = []  # the checkpoint steps to resume from, in order of preference
        if resume_step is not None:
            candidates = [resume_step]
        elif resume:
            candidates = self.checkpoints.all_steps()[::-1]
        self._allow_config_change, self._config_checked = allow_config_change, None
        if candidates:  # a refused config change stops here, before anything expensive is built
            try:
                self._check_config(candidates[0], self.checkpoints.read_state(candidates[0])[2])
            except CorruptCheckpointError:
                pass  # the restore below falls back to an older step, or says what is wrong
        # eval.splits: loaded first, so that an unknown split stops the start before anything is built
        self.eval_sets = split_eval_tasks(config)
        self.tokenizer = policy_tokenizer(config)
        self.builder = context_builder(config, self.tokenizer)
        check_chat_format(self.builder)  # our contexts = the checkpoint's chat template, before anything heavy
        # The typed settings of the library parts, built once from the config.
        self.example_config = ExampleConfig.of(config)
        self.update_config = UpdateConfig.of(config)
        self.engine_config = EngineConfig.of(config)
        model = build_policy(config)
        self.model_config = model.config
        tx = optimizer_of(config.optim)
        self.update = ShardedUpdate(
            build(MeshConfig, config.mesh),
            model,
            tx,
            LossConfig.of(config.loss),
            micro_batch_size=self.update_config.rows_per_micro_batch,
            rows_key="batch.pack_rows" if self.update_config.pack_rows else "batch.micro_batch_size",
            seed=config.seed,
        )
        self.rng = jax.random.key(config.seed)
        self.tasks = TaskSource(
            load_tasks(config.env.name, config.env.train_split, seed=config.env.seed), seed=config.seed
        )
        self._prefetch: _Prefetch | None = None  # the next phase, collected in the background (train.overlap_phases)
        self.phase = 0
        self.env_steps = 0
        self.tokens = 0
        self.version = 0
        self.start_time = time.time()
        if resume:
            self._resume(candidates, explicit=resume_step is not None)
        policy = self.update.model()  # (every process: a collective in a multi-process job)
        self.engine = (
            policy_engine(self.engine_config, policy, workdir=self.workdir, version=self.version)
            if is_main_process()
            else OnMainProcess("the policy engine")
        )
        if self.engine.takes_adapters:  # (servers get the base and, on top, the adapters)
            policy = self.update.model(merge=False)
        self.initial_weights = ensure_served(
            self.engine, policy, self.version, assume=self.engine_config.assume_initial_weights
        )
        if config.insight.schedule == "never":
            self.teacher, teacher_tokenizer = None, None
        elif is_main_process():
            self.teacher, teacher_tokenizer = teacher_engine(self.engine_config)
        else:
            self.teacher, teacher_tokenizer = OnMainProcess("the teacher"), None
        self.schedule = build(InsightSchedule, config.insight)
        writer = None
        if config.insight.schedule != "never":
            writer = InsightWriter.of(config, self.tokenizer, self.engine, self.teacher, teacher_tokenizer)
        self.progress = progress
        self.collector = Collector(
            self.engine,
            self._make_env,
            self.builder,
            EpisodeConfig.of(config),
            self.schedule,
            writer,
            group_size=config.rollout.group_size,
            workers_per_task=config.rollout.workers_per_task,
            insight_after=config.insight.after,
            exact_group_size=config.rollout.exact_group_size,
            progress=progress,
        )
        # config.json, W&B (logging.wandb) and TensorBoard; on resume TensorBoard discards what the stopped run logged
        # after the restored counts, and W&B continues the stopped run's W&B run.
        self.loggers = open_loggers(
            config,
            self.workdir,
            resume=resume,
            resumed_at=self._resumed_at if resume else None,
            start_time=self.start_time,
        )
        self.metrics_log = MetricsLog(os.path.join(self.workdir, "metrics.jsonl"), keep_through_phase=self.phase)
        self.nonfinite = NonFiniteGuard(config.train.max_nonfinite_skips)

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
        return self._done_at(self.phase, self.env_steps)

    def _done_at(self, phase: int, env_steps: int) -> bool:
        """Whether the run stops at these counts (`train.env_step_budget`, `train.max_phases`)."""
        t = self.config.train
        return bool((t.env_step_budget and env_steps >= t.env_step_budget) or (t.max_phases and phase >= t.max_phases))

    def run(self) -> None:
        """Phases until the budget is spent (evaluating every `eval.every` phases); a run always ends with an
        evaluation and a checkpoint of its last phase. With `train.overlap_phases` each phase's update overlaps the
        next phase's collection (module docstring).

        A resumed run first redoes an evaluation due at the restored phase that `metrics.jsonl` does not hold (the
        stopped run was killed or stopped before or during it); a finished run does nothing and says so.

        Raises:
          RunStopped: SIGTERM or SIGINT arrived (in the main thread): the run stopped at the next safe point (before
            a phase or an evaluation) with a checkpoint of the phases done; a second signal raises `Interrupted` at
            once (train/stopping.py).
        """
        try:
            with StopSignals(defer=True) as signals, self._run_progress():
                self._run(signals)
        finally:
            self.close()

    #: `run`'s bar of the whole run (with `progress`), and whether it counts environment steps (else phases).
    _run_bar: Any = None
    _run_bar_steps = True

    @contextlib.contextmanager
    def _run_progress(self) -> Iterator[None]:
        """With `progress`, while `run` goes on: the run's bar (`_run_bar`, advanced by `_train_phase`) and the log
        lines written through the bars."""
        if not self.progress:
            yield
            return
        from rltldr_jax import progress

        t = self.config.train
        self._run_bar_steps = bool(t.env_step_budget) or not t.max_phases
        self._run_bar = progress.bar(
            t.env_step_budget or t.max_phases or None,
            f"phase {self.phase + 1}",  # (the phase it goes on with; "phase N done" after each)
            unit="env step" if self._run_bar_steps else "phase",
            initial=self.env_steps if self._run_bar_steps else self.phase,
        )
        try:
            with progress.lines_through_bars():
                yield
        finally:
            self._run_bar.close()
            self._run_bar = None

    def _run(self, signals: StopSignals) -> None:
        overlap = self.config.train.overlap_phases
        evaluated = self.phase if self.phase and self._evaluation_recorded(self.phase) else -1
        if self.done() and evaluated == self.phase and self.checkpoints.latest_step() == self.phase:
            t = self.config.train
            log.info(
                "the run is finished: phase %d, %d environment steps (train.max_phases=%d, train.env_step_budget=%d), "
                "evaluated and checkpointed; nothing to do (raise either to continue it)",
                self.phase,
                self.env_steps,
                t.max_phases,
                t.env_step_budget,
            )
        elif self.phase and evaluated != self.phase and self._evaluation_due(self.phase):
            log.info("the evaluation after phase %d is not in metrics.jsonl: running it first", self.phase)
        doing = ""
        try:
            while True:
                if self.phase and evaluated != self.phase and self._evaluation_due(self.phase):
                    self._stop_point(signals)
                    doing = f"the evaluation after phase {self.phase} (a resumed run redoes it)"
                    self.evaluate()
                    evaluated = self.phase
                if self.done():
                    break
                self._stop_point(signals)
                doing = f"phase {self.phase + 1}, which is lost"
                if overlap:
                    self._overlapped_phase()
                else:
                    self.run_phase()
            doing = f"the checkpoint of phase {self.phase}"
            self.checkpoints.wait_until_finished()  # (a save in flight is not listed yet)
            if self.phase and self.checkpoints.latest_step() != self.phase:
                self.save()
            if signals.requested:
                log.info("the run finished before its next safe point: nothing left to stop")
        except Interrupted as e:
            if isinstance(e, RunStopped):
                raise
            raise Interrupted(
                e.signum,
                f"stopped at once by a second {signal_name(e.signum)} during {doing}",
            ) from None

    def _evaluation_due(self, phase: int) -> bool:
        """Whether `run` evaluates after `phase` (every `eval.every` phases, and at the end)."""
        every = self.config.eval.every
        return bool(every and phase % every == 0) or self._done_at(phase, self.env_steps)

    def _evaluation_recorded(self, phase: int) -> bool:
        """Whether `metrics.jsonl` holds an evaluation after `phase` (process 0 reads it; every process gets it)."""
        return from_main_process(lambda: phase in recorded_evaluations(self.metrics_log.path))

    def _stop_point(self, signals: StopSignals) -> None:
        """A safe point of `run` (before a phase or an evaluation): if SIGTERM or SIGINT arrived (on any process of
        a multi-process job: every process stops at the same point), the next phase's background collection is
        cancelled, a checkpoint of the phases done is written (unless it already was) and RunStopped is raised."""
        signum = signals.requested
        if jax.process_count() > 1:
            signum = max(s or 0 for s in gather_objects(signum)) or None
        if signum is None:
            return
        self._discard_prefetch()  # its tasks go back to the cursor: the resumed run collects that phase again
        self.checkpoints.wait_until_finished()
        if self.checkpoints.latest_step() != self.phase:
            self.save()
            self.checkpoints.wait_until_finished()
        raise RunStopped(
            signum, f"stopped by {signal_name(signum)} at phase {self.phase}; checkpoint saved (step {self.phase})"
        )

    def run_phase(self) -> dict[str, float]:
        """One collection + update phase, collected synchronously (also under `train.overlap_phases`: only `run`
        overlaps); returns its metrics.

        Raises:
          CheckpointSaveError: the previous phase's checkpoint failed to save (checked before collecting, and
            before updating), so no more compute is spent on a run that cannot be saved.
        """
        if self._prefetch is not None:
            raise RuntimeError(
                "run_phase() while the next phase is being collected in the background: call it outside run()"
            )
        start = time.time()
        self.checkpoints.check_saved()
        tasks = self.tasks.take(self.config.rollout.tasks_per_phase)
        t0 = time.time()
        result = from_main_process(lambda: self.collector.collect(tasks, self.phase))  # process 0 collects, all get it
        return self._train_phase(result, time.time() - t0, start=start)

    def _overlapped_phase(self) -> dict[str, float]:
        """One phase of `train.overlap_phases`: its collection (prefetched during the previous phase's update, or
        collected now if none was), then the next phase's collection started in the background (only if the run
        will train it), this phase's update, the wait for that collection, the weight push; returns the metrics."""
        start = time.time()
        self.checkpoints.check_saved()
        n = self.config.rollout.tasks_per_phase
        prefetch, self._prefetch = self._prefetch, None
        t0 = time.time()
        if prefetch is None:  # the run's first phase, or the first after a resume
            tasks = self.tasks.take(n)
            result = from_main_process(lambda: self.collector.collect(tasks, self.phase))
            collect_s = time.time() - t0
        else:
            try:  # an error of the background collection is raised here, on every process
                result, collect_s = from_main_process(lambda: (prefetch.pending.wait(), prefetch.pending.seconds))
            except BaseException:  # (or an interrupt while waiting: the collection is stopped)
                self._prefetch = prefetch
                self._discard_prefetch()  # its tasks were never trained
                raise
        if not self._done_at(self.phase + 1, self.env_steps + result.env_steps):
            cursor = self.tasks.state()
            tasks = self.tasks.take(n)
            try:
                self._prefetch = _Prefetch(
                    self.collector.start(tasks, self.phase + 1) if is_main_process() else None, cursor
                )
            except BaseException:
                self.tasks.restore(cursor)
                raise
        try:
            return self._train_phase(result, collect_s, start=start, prefetch=self._prefetch)
        except BaseException:
            self._discard_prefetch()  # the NaN guard, a failed checkpoint, an interrupt: no thread outlives the phase
            raise

    def _discard_prefetch(self) -> None:
        """Cancels the phase being collected in the background (if any): it is never trained nor counted, and its
        tasks go back to the task cursor."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            if prefetch.pending is not None:
                prefetch.pending.cancel()
            self.tasks.restore(prefetch.cursor)

    def _train_phase(
        self, result: PhaseResult, collect_s: float, *, start: float, prefetch: _Prefetch | None = None
    ) -> dict[str, float]:
        """The update on a collected phase, the weight push (after `prefetch`'s collection has ended: the engine
        changes weights between phases only), counters, logs and the checkpoint; returns the phase's metrics."""
        c = self.config
        if c.rollout.save_rollouts and is_main_process():
            save_phase(os.path.join(self.workdir, "rollouts", f"phase_{self.phase:05d}.jsonl"), self.phase, result)
        examples, stats = phase_examples(
            result.attempts,
            self.builder,
            self.example_config,
            writer_outputs=result.writer_outputs,
            seed=c.seed + self.phase,
        )
        # Trainer version - sampler version of every step: 0 in sync mode, 1 for a phase prefetched under
        # overlap_phases.
        gaps = [self.version - s.weight_version for a in result.attempts for s in a.steps] or [0]
        self.checkpoints.check_saved(wait=True)
        t0 = time.time()
        # On a lagged phase the first minibatch's gap measures the previous update, not an engine mismatch; a rollout
        # mode that trains on other contexts than were sampled has no gap to check either.
        check_gap = max(gaps) <= 0 and self.example_config.rollout_mode.as_sampled
        update = update_phase(
            self.update,
            examples,
            self.update_config,
            phase=self.phase,
            guard=self.nonfinite,
            progress=self.progress,
            check_gap=check_gap,
        )
        update_s = time.time() - t0
        wait_s = 0.0
        if prefetch is not None and prefetch.pending is not None:
            t0 = time.time()
            prefetch.pending.join()  # (an error it raised surfaces when its phase is due: the next _overlapped_phase)
            wait_s = time.time() - t0
        t0 = time.time()
        self.version = self.phase + 1
        self.engine.update_weights(self.update.model(merge=not self.engine.takes_adapters), self.version)
        sync_s = time.time() - t0
        records = attempt_records(result)
        self.env_steps += result.env_steps
        self.tokens += sum(r.tokens for r in records)
        self.phase += 1
        metrics = {
            **{f"rollout/{k}": v for k, v in summarize(records, c.eval.attempts_per_task).items()},
            **{f"update/{k}": v for k, v in update.items()},
            "update/learning_rate": learning_rate_of(c.optim, self.update.opt_state),  # (its last optimizer step's)
            "rollout/malformed_fraction": float(np.mean([a.end == "malformed" for a in result.attempts])),
            "rollout/weight_version_gap/mean": float(np.mean(gaps)),
            "rollout/weight_version_gap/max": float(max(gaps)),
            "insight/parse_failures": float(result.parse_failures),
            "insight/written": float(sum(j.insight is not None for _, _, j in result.writer_outputs)),
            "filter/kept_attempts": float(stats.kept_attempts),
            "filter/zero_advantage_groups": float(stats.zero_advantage_groups),
            "filter/examples": float(stats.examples),
            "filter/writer_examples": float(stats.writer_examples),
            "time/collect_s": collect_s,
            "time/update_s": update_s,
            "time/weight_sync_s": sync_s,
            "time/prefetch_wait_s": wait_s,
            "time/phase_s": time.time() - start,
            "progress/phase": float(self.phase),
            "progress/tokens": float(self.tokens),
        }
        self.loggers.scalars(metrics, self.env_steps, tokens=self.tokens, walltime=time.time() - self.start_time)
        self.metrics_log.write("phase", self.phase, self.env_steps, metrics)
        log.info(phase_line(self.phase, self.env_steps, metrics))
        if self._run_bar is not None:
            self._run_bar.update(result.env_steps if self._run_bar_steps else 1)
            self._run_bar.set_description(f"phase {self.phase} done")
        if c.train.checkpoint_every and self.phase % c.train.checkpoint_every == 0:
            self.save()
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Held-out tasks (and `eval.train_num_tasks` training tasks, and every set of `eval.splits`),
        `eval.attempts_per_task` attempts each, no insights: macro Pass@1 and Pass@K (train/evaluation.py), logged at
        the current environment-step count."""
        t0 = time.time()
        metrics = from_main_process(
            self._evaluate_here
        )  # the engines live on process 0; every process gets its metrics
        self.loggers.scalars(metrics, self.env_steps, tokens=self.tokens, walltime=time.time() - self.start_time)
        self.metrics_log.write("eval", self.phase, self.env_steps, metrics)
        log.info(
            eval_line(
                self.phase, metrics, attempts_per_task=self.config.eval.attempts_per_task, seconds=time.time() - t0
            )
        )
        return metrics

    def _evaluate_here(self) -> dict[str, float]:
        return evaluate_all(
            self.engine,
            self.builder,
            self.config,
            make_env=self._make_env,
            tag=self.phase,
            sets=self.eval_sets,
            progress=self.progress,
        )

    # -- checkpoints ------------------------------------------------------------------------------------------

    def save(self) -> None:
        meta = {
            "phase": self.phase,
            "env_steps": self.env_steps,
            "tokens": self.tokens,
            "version": self.version,
            "walltime": time.time() - self.start_time,
            "task_cursor": self._task_cursor(),
            "config": as_dict(self.config),
        }
        self.checkpoints.save(
            self.phase,
            params=self.update.params,
            opt_state=self.update.opt_state,
            rng=self.rng,
            meta=meta,
            model_config=self.model_config,
        )

    def _task_cursor(self) -> dict[str, int]:
        """The cursor of the first task not trained yet: a prefetched phase's tasks count as not taken (a resumed run
        collects that phase again, synchronously, with the checkpoint's weights)."""
        return self._prefetch.cursor if self._prefetch is not None else self.tasks.state()

    def _check_config(self, step: int, meta: dict[str, Any]) -> None:
        """Logs the config changes since checkpoint `step` and refuses those that change what the run trains."""
        if step != self._config_checked and "config" in meta:
            check_config_changes(meta["config"], as_dict(self.config), allow=self._allow_config_change, step=step)
            self._config_checked = step

    def _resume(self, candidates: list[int], *, explicit: bool) -> None:
        """Restores the first intact checkpoint of `candidates` (newest first; a damaged one is skipped with a
        warning unless it was asked for `explicit`ly), then moves aside what the stopped run wrote after it:
        newer checkpoint steps and the rollout files of phases >= the restored one."""
        abstract_params, abstract_opt = self.update.abstract()  # restore straight into the mesh layout
        restored = None
        for i, step in enumerate(candidates):
            try:
                restored = self.checkpoints.restore(
                    step,
                    abstract_params=abstract_params,
                    abstract_opt_state=abstract_opt,
                    allow_nonfinite=self.config.model.allow_nonfinite,
                )
                break
            except CorruptCheckpointError as e:
                if explicit:
                    raise
                nxt = (
                    f"step {candidates[i + 1]}" if i + 1 < len(candidates) else "nothing: no intact checkpoint is left"
                )
                log.warning("resume: %s; falling back to %s", e, nxt)
        if candidates and restored is None:
            raise CorruptCheckpointError(
                f"no intact checkpoint in {os.fspath(self.checkpoints.directory)!r} "
                f"(steps {sorted(candidates)} are all "
                "damaged, see the warnings): start over with --restart (moves the run aside)"
            )
        step, walltime = -1, 0.0
        if restored is not None:
            step, meta = restored.step, restored.meta
            self._check_config(step, meta)
            self.update.params, self.update.opt_state, self.rng = restored.params, restored.opt_state, restored.rng
            self.phase, self.env_steps, self.tokens, self.version = (
                meta["phase"],
                meta["env_steps"],
                meta["tokens"],
                meta["version"],
            )
            walltime = meta.get("walltime", 0.0)
            self.start_time = time.time() - walltime  # the by_time/ axis continues
            self.tasks.restore(meta["task_cursor"])
            log.info(
                "resumed from checkpoint step %d: phase %d, %d environment steps", step, self.phase, self.env_steps
            )
        else:
            log.warning("resume: no checkpoint in %s; starting from phase 0", os.fspath(self.checkpoints.directory))
        self._resumed_at = (self.env_steps, self.tokens, walltime)
        directory = os.fspath(self.checkpoints.directory)
        steps = {name: name.split(".")[0] for name in sorted(os.listdir(directory))}  # "5", "5.orbax-checkpoint-tmp"
        newer = [os.path.join(directory, name) for name, s in steps.items() if s.isdigit() and int(s) > step]
        stale = newer + rollouts_from(self.workdir, self.phase)
        if (
            move_aside(self.workdir, stale, f"resume from phase {self.phase}: what the stopped run wrote after it")
            and newer
        ):
            self.checkpoints.close()  # orbax caches the step list: reopen without the moved steps
            self.checkpoints = Checkpointer(directory, keep=self.config.train.keep_checkpoints)

    def close(self) -> None:
        """Cancels a phase still being collected in the background (its thread is joined first), waits for the
        checkpoint in flight, closes the loggers (a W&B run ended by an exception is marked failed) and the engines,
        and releases the workdir's lock."""
        try:
            self._discard_prefetch()
            self.checkpoints.wait_until_finished()
        finally:
            try:
                self.loggers.close(sys.exc_info()[1])  # (the exception propagating through run(), if any)
                for engine in (self.engine, self.teacher):
                    close_engine(engine)
            finally:
                self._lock.close()


@dataclasses.dataclass(frozen=True)
class _Prefetch:
    """The next phase, being collected in the background while this one trains (`train.overlap_phases`)."""

    pending: PendingPhase | None  # None on processes other than 0: they receive its result from process 0
    cursor: dict[str, int]  # the task cursor before its tasks were taken (what a checkpoint saves meanwhile)


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """The update phase's settings (Table 4, bottom): `batch.*`, the context limit `rollout.max_context_tokens` (no
    example is longer), `train.max_logprob_gap` (0 = no check) and the run's `seed` (each epoch's example order).
    `length_buckets` are the padded lengths of `batch.length_buckets` (`batching.length_buckets`; None: every
    multiple of `pad_to_multiple`); `pack_rows` is `batch.pack_rows` (0: one example per row; R: packed rows, R per
    micro-batch, `batching.pack`)."""

    ppo_epochs: int
    micro_batch_size: int
    grad_accum_steps: int
    pad_to_multiple: int
    max_context_tokens: int
    max_logprob_gap: float
    seed: int
    length_buckets: tuple[int, ...] | None = None
    pack_rows: int = 0

    @property
    def rows_per_micro_batch(self) -> int:
        """The M of the train step's [A, M, T] batches: `pack_rows` when packing, else `micro_batch_size`."""
        return self.pack_rows or self.micro_batch_size

    @classmethod
    def of(cls, settings: Settings) -> UpdateConfig:
        """The update settings of a run."""
        b, max_context = settings.batch, settings.rollout.max_context_tokens
        return build(
            cls,
            b,
            max_context_tokens=max_context,
            max_logprob_gap=settings.train.max_logprob_gap,
            seed=settings.seed,
            length_buckets=length_buckets(b.length_buckets, b.pad_to_multiple, max_context),
        )


def update_phase(
    update: ShardedUpdate,
    examples: Sequence[Example],
    config: UpdateConfig,
    *,
    phase: int,
    guard: NonFiniteGuard,
    progress: bool = False,
    check_gap: bool = True,
) -> dict[str, float]:
    """`config.ppo_epochs` passes of optimizer steps over a phase's examples (shuffled per epoch, seeded by the run's
    seed and the phase).

    Returns the steps' mean metrics, the first minibatch's ratio diagnostics, `optimizer_steps`, and
    `skipped_nonfinite` (a count: steps `train_step` skipped for a non-finite loss or gradient norm; the means
    include their NaN/inf, so a phase with a skipped step shows it). `guard` raises NonFiniteError after too many
    skips in a row. With `check_gap` (the examples were sampled with the trainer's current weights, in their
    training contexts) the first minibatch's logprob gap is checked against `config.max_logprob_gap`.
    """
    if not examples:
        return {"optimizer_steps": 0.0, "skipped_nonfinite": 0.0}
    sums: dict[str, float] = {}
    first: dict[str, float] = {}
    n = 0
    order_rng = np.random.default_rng([config.seed, phase])
    per_epoch = -(-len(examples) // (config.micro_batch_size * config.grad_accum_steps))
    bar = None
    if progress:
        from rltldr_jax import progress as bars

        bar = bars.bar(config.ppo_epochs * per_epoch, f"{bars.phase_label(phase)} update", unit="step")
    try:
        for _ in range(config.ppo_epochs):
            shuffled = [examples[i] for i in order_rng.permutation(len(examples))]
            batches = pack(
                shuffled,
                micro_batch_size=config.micro_batch_size,
                grad_accum_steps=config.grad_accum_steps,
                pad_to_multiple=config.pad_to_multiple,
                max_len=config.max_context_tokens,
                length_buckets=config.length_buckets,
                pack_rows=config.pack_rows,
            )
            for batch in batches:
                metrics = {k: float(v) for k, v in update.step(batch).items()}
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                if n == 0:  # before any update: the ratio is 1 up to the engine-vs-trainer mismatch
                    first = {
                        f"first_minibatch/{k}": metrics[k] for k in ("clip_fraction", "importance_ratio", "logprob_gap")
                    }
                n += 1
                if bar is not None:
                    bar.update(1)
                if n == 1 and check_gap:
                    check_logprob_gap(metrics, config.max_logprob_gap, phase)
                guard.record(metrics, f"phase {phase + 1}, optimizer step {n}")
    finally:
        if bar is not None:
            bar.close()
    return {
        **{k: v / n for k, v in sums.items()},
        **first,
        "optimizer_steps": float(n),
        "skipped_nonfinite": sums["skipped_nonfinite"],
    }
