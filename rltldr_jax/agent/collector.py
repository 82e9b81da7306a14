"""One rollout collection phase: the phase's tasks, each attempted at least K times, insights in between.

Every task runs `workers_per_task` sequential chains of attempts concurrently (all tasks at once, against one
engine that batches their requests). A chain starts its next attempt as soon as the previous one is verified,
while any task of the phase still has fewer than K finished attempts — so faster tasks get more attempts, as in
the paper's asynchronous collection (Table 4: K = 8 minimum, 21–26 on average). An attempt starting now gets the
insights the schedule allows at that moment; after a failed attempt (or any attempt, for SGE) the insight writer
runs and its insight joins the task's list. One task's attempts form one GRPO group.

`exact_group_size=True` (not in the paper) stops each task at exactly K attempts instead: with one chain per
task, a phase is then a deterministic function of the weights and seeds (every sampling seed already derives
from the phase, task, attempt and step), which makes `--resume` reproduce an uninterrupted run.

Independent attempts. When nothing links a task's attempts (the schedule is "never" and no insight is written: the
GRPO baseline, the evaluation, the base policy's i.i.d. checks) and the group is exact, all K attempts of every
task are started at once, each with its fixed attempt number, at most `max_parallel_attempts` at a time over a
shared pool of environments: the engine batches them together. Each attempt's seeds derive from its task and
number and a batch-invariant engine's rows do not depend on what else runs, so the phase is the same as one chain
per task would give, attempt for attempt; the attempts come back sorted by task (in the given order) and number.

`Collector.start` runs a phase in a background thread with its own asyncio loop and returns a `PendingPhase`
(`wait` for its result, `cancel` to stop it): the trainer's `train.overlap_phases` collects phase n + 1 with the
weights of version n that way while it updates on phase n.

A phase's result is written to and read back from the run's `rollouts/phase_*.jsonl` by `agent.rollout_files`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rltldr_jax import blocking
from rltldr_jax.agent.episode import Attempt, EpisodeConfig, run_attempt, step_seed
from rltldr_jax.agent.insight import InsightWriter, WriterOutput
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.agent.writer_prompt import FailedAttempt
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs.base import Env, Task
from rltldr_jax.settings import choices
from rltldr_jax.tokenization import ContextBuilder

log = logging.getLogger(__name__)

#: Values of `insight.after`: which attempts get an insight written (RLTL;DR: failures; SGE: every attempt).
INSIGHT_AFTER = choices("insight.after")


def exact_group_size_error(exact_group_size: bool, workers_per_task: int, *, prefix: str = "") -> str | None:
    """What is wrong with this combination, None if nothing: exactly K attempts per task need one chain per task
    (concurrent chains of a task race for the K slots, and make the insight schedule depend on timing). `prefix`
    names the keys' section in the message ("rollout." for config validation)."""
    if exact_group_size and workers_per_task > 1:
        return (
            f"{prefix}exact_group_size needs {prefix}workers_per_task=1 (concurrent chains of a task race for the K "
            "slots, and make the insight schedule depend on timing)"
        )
    return None


@dataclasses.dataclass(frozen=True)
class PhaseResult:
    """What a phase produced: attempts (in finishing order) and the insight writer's outputs."""

    attempts: tuple[Attempt, ...]
    writer_outputs: tuple[tuple[str, int, WriterOutput], ...]  # (task_id, attempt index, writer_output)

    def groups(self) -> dict[str, list[Attempt]]:
        """Attempts per task (a GRPO group each), in attempt order."""
        out: dict[str, list[Attempt]] = {}
        for a in sorted(self.attempts, key=lambda a: (a.task.task_id, a.index)):
            out.setdefault(a.task.task_id, []).append(a)
        return out

    @property
    def env_steps(self) -> int:
        return sum(a.env_steps for a in self.attempts)

    @property
    def parse_failures(self) -> int:
        return sum(j.parse_error is not None for _, _, j in self.writer_outputs)


class Collector:
    """Runs collection phases.

    Args:
      engine: the policy's generation engine.
      make_env: builds one environment instance (one per concurrent chain; reused across its attempts).
      builder: the context builder.
      episode: budgets and sampling of attempts.
      schedule: when insights are inserted (reset at the start of every phase).
      writer: the insight writer (None: no insights are written, e.g. the GRPO baseline). An exception it raises is
        a parse failure of that attempt (logged, counted), never the end of the phase.
      group_size: K, the minimum number of finished attempts per task.
      workers_per_task: concurrent attempt chains per task.
      insight_after: one of `INSIGHT_AFTER`: "failure" (RLTL;DR) or "any" (SGE also summarises successes).
      exact_group_size: every task gets exactly `group_size` attempts (deterministic phases; see above).
      progress: show a progress bar of finished attempts (`rltldr_jax.progress`), labelled as the log names the
        phase (`progress.phase_label`).
      max_parallel_attempts: with independent attempts (module doc), how many run at once (and how many
        environments exist); None = the engine's `max_batch` (64 if it has none), at least one per task.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        make_env: Callable[[], Env],
        builder: ContextBuilder,
        episode: EpisodeConfig,
        schedule: InsightSchedule,
        writer: InsightWriter | None,
        *,
        group_size: int,
        workers_per_task: int = 1,
        insight_after: str = "failure",
        exact_group_size: bool = False,
        progress: bool = False,
        max_parallel_attempts: int | None = None,
    ):
        if insight_after not in INSIGHT_AFTER:
            raise ValueError(f"insight_after={insight_after!r}; choose one of {', '.join(INSIGHT_AFTER)}")
        self.engine, self.make_env, self.builder = engine, make_env, builder
        self.episode, self.schedule, self.writer = episode, schedule, writer
        self.group_size, self.workers_per_task = group_size, workers_per_task
        problem = exact_group_size_error(exact_group_size, workers_per_task)
        if problem:
            raise ValueError(problem)
        self.insight_after, self.exact_group_size, self.progress = insight_after, exact_group_size, progress
        if max_parallel_attempts is not None and max_parallel_attempts < 1:
            raise ValueError(
                f"max_parallel_attempts must be >= 1 (None = the engine's max_batch), got {max_parallel_attempts}"
            )
        self.max_parallel_attempts = max_parallel_attempts

    @property
    def independent(self) -> bool:
        """Whether a task's attempts are independent of each other and run all at once (module doc)."""
        return self.exact_group_size and self.writer is None and self.schedule.policy == "never"

    def collect(self, tasks: Sequence[Task], phase: int) -> PhaseResult:
        """Runs one phase (blocking; also from a running event loop, such as a Jupyter kernel's)."""
        return blocking.run(self.collect_async(tasks, phase))

    def start(self, tasks: Sequence[Task], phase: int) -> PendingPhase:
        """Starts one phase in a background thread (its own asyncio loop) and returns at once (`PendingPhase`).

        The caller must not run another phase (or anything that resets `schedule`) on this collector, nor change
        the engine's weights, before the pending phase has ended (`PendingPhase.join`, `wait` or `cancel`).
        """
        if not tasks:  # the same checks as collect_async, raised here in the caller's thread
            raise ValueError("a phase needs at least one task")
        if len({t.task_id for t in tasks}) != len(tasks):
            raise ValueError("the tasks of a phase must be distinct (one group per task)")
        return PendingPhase(self, tasks, phase)

    async def _write(self, failed: FailedAttempt, seed: int, where: str) -> WriterOutput:
        """The writer's output; an exception there is a parse failure of this attempt (no insight, counted), never
        the end of the phase."""
        try:
            return await self.writer.write(failed, seed=seed)
        except Exception as e:  # not BaseException: cancellation and interrupts still stop the run
            log.warning("%s: the insight writer raised %s: %s (counted as a parse failure)", where, type(e).__name__, e)
            return WriterOutput(None, {}, f"the insight writer failed: {type(e).__name__}: {e}", 0, 0)

    async def collect_async(self, tasks: Sequence[Task], phase: int) -> PhaseResult:
        if not tasks:
            raise ValueError("a phase needs at least one task")
        if len({t.task_id for t in tasks}) != len(tasks):
            raise ValueError("the tasks of a phase must be distinct (one group per task)")
        self.schedule.reset()
        finished = {t.task_id: 0 for t in tasks}
        started = dict.fromkeys(finished, 0)
        attempts: list[Attempt] = []
        writer_outputs: list[tuple[str, int, WriterOutput]] = []
        bar = None
        if self.progress:
            from rltldr_jax import progress

            bar = progress.bar(len(tasks) * self.group_size, progress.phase_label(phase), unit="attempt")

        episode = dataclasses.replace(
            self.episode, seed=step_seed(self.episode.seed, "phase", phase, 0, 0)
        )  # per-phase seeds

        def more_needed(task_id: str) -> bool:
            if self.exact_group_size:
                return started[task_id] < self.group_size
            return any(n < self.group_size for n in finished.values())

        async def chain(task: Task) -> None:
            env = await asyncio.to_thread(self.make_env)
            try:
                while more_needed(task.task_id):
                    started[task.task_id] += 1
                    index = started[task.task_id]
                    insights = self.schedule.insights_for(task.task_id)
                    attempt = await run_attempt(task, index, insights, env, self.engine, self.builder, episode)
                    self.schedule.record(task.task_id, attempt.success, attempt=index)
                    attempts.append(attempt)
                    finished[task.task_id] += 1
                    if bar is not None:
                        bar.update(1)
                    if self.writer is not None and (not attempt.success or self.insight_after == "any"):
                        failed = dataclasses.replace(attempt.failed_attempt(self.builder), success=attempt.success)
                        seed = step_seed(self.episode.seed, f"insight/{task.task_id}", phase, index, 0)
                        writer_output = await self._write(failed, seed, f"{task.task_id} attempt {index}")
                        writer_outputs.append((task.task_id, index, writer_output))
                        if writer_output.insight:
                            self.schedule.add_insight(task.task_id, writer_output.insight, index)
            finally:
                await asyncio.to_thread(env.close)

        try:
            if self.independent:
                return PhaseResult(await self._independent_attempts(tasks, episode, bar), ())
            await asyncio.gather(*(chain(t) for t in tasks for _ in range(self.workers_per_task)))
        finally:
            if bar is not None:
                bar.close()
        return PhaseResult(tuple(attempts), tuple(writer_outputs))

    async def _independent_attempts(
        self, tasks: Sequence[Task], episode: EpisodeConfig, bar: Any
    ) -> tuple[Attempt, ...]:
        """All `group_size` attempts of every task at once, numbered 1..K, at most `max_parallel_attempts` at a time
        over a shared pool of environments; sorted by task (in `tasks` order) and attempt number."""
        limit = self.max_parallel_attempts or int(self.engine.max_batch or 64)
        limit = max(limit, len(tasks))
        slots = asyncio.Semaphore(limit)
        idle: list[Env] = []
        made: list[Env] = []

        async def one(task: Task, index: int) -> Attempt:
            async with slots:
                if idle:
                    env = idle.pop()
                else:
                    env = await asyncio.to_thread(self.make_env)
                    made.append(env)
                try:
                    insights = self.schedule.insights_for(task.task_id)  # [] under "never"
                    attempt = await run_attempt(task, index, insights, env, self.engine, self.builder, episode)
                finally:
                    idle.append(env)
                self.schedule.record(task.task_id, attempt.success, attempt=index)
                if bar is not None:
                    bar.update(1)
                return attempt

        try:
            return tuple(await asyncio.gather(*(one(t, i) for t in tasks for i in range(1, self.group_size + 1))))
        finally:
            for env in made:
                await asyncio.to_thread(env.close)


class PendingPhase:
    """A phase being collected in a background thread with its own asyncio loop (`Collector.start`).

    `wait()` returns its `PhaseResult` or raises the collection's exception in the calling thread (with a note
    naming the phase); `cancel()` stops it (its attempts in flight are cancelled and their environments closed) and
    joins the thread. After a cancellation or an error every request queued or running in the engines is aborted
    (`pause("abort")` or `abort()`, where the engine has them), so nothing else may be generating on them meanwhile
    (the trainer runs nothing else while a phase is pending); results that arrive late are dropped. Either way the
    thread and its loop are gone afterwards: no thread of a pending phase outlives `wait`, `join` or `cancel`.

    Attributes:
      tasks: the phase's tasks.
      phase: the phase index (the collection's seeds derive from it).
      seconds: wall time of the collection (NaN until it has ended).
    """

    def __init__(self, collector: Collector, tasks: Sequence[Task], phase: int):
        self.tasks, self.phase = tuple(tasks), phase
        self.seconds = float("nan")
        self._collector = collector
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[PhaseResult] | None = None
        self._cancelled = False
        self._result: PhaseResult | None = None
        self._error: BaseException | None = None
        self._noted = False
        self._started = False
        self._thread = threading.Thread(target=self._run, name=f"collect-phase-{phase}", daemon=True)
        self._thread.start()

    # -- the background thread --------------------------------------------------------------------------

    def _engines(self) -> list[GenerationEngine]:
        """The engines this phase sends requests to (the policy's; the insight writer's when it is another)."""
        engines = [self._collector.engine]
        writer = self._collector.writer
        writer_engine = writer.engine if writer is not None else None
        if writer_engine is not None and writer_engine is not self._collector.engine:
            engines.append(writer_engine)
        return engines

    async def _main(self) -> PhaseResult:
        with self._lock:
            if self._cancelled:
                raise asyncio.CancelledError
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            self._started = True
        try:
            return await self._collector.collect_async(self.tasks, self.phase)
        finally:
            with self._lock:
                self._task = None

    async def _stop(self) -> None:
        """After a cancellation or an error: cancels the attempt chains still running (a failed chain leaves its
        siblings running) and aborts the requests they left queued or running in the engines, waiting until an
        engine with `pause` has dropped them (so that a later request is never caught by this abort); results that
        still arrive are dropped (`_PhaseLoop`)."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self._started:  # (a phase cancelled before it began sent nothing)
            for engine in self._engines():
                if not engine.paused:
                    await asyncio.to_thread(engine.pause, "abort")  # returns once the engine has dropped them
                    engine.resume()
                else:
                    engine.abort()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            with asyncio.Runner(loop_factory=_PhaseLoop) as runner:
                try:
                    self._result = runner.run(self._main())
                except BaseException as e:  # noqa: BLE001 (handed to the caller's thread by wait())
                    self._error = e
                    runner.run(self._stop())
        except BaseException as e:  # noqa: BLE001
            if self._error is None:
                self._error = e
        finally:
            self.seconds = time.perf_counter() - t0

    # -- the caller's side ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The collection has ended (finished, failed or cancelled)."""
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Waits until the collection has ended (at most `timeout` s); True if it has. Raises nothing."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait(self) -> PhaseResult:
        """The phase's result, once collected; re-raises the collection's exception here (a cancelled phase
        raises `asyncio.CancelledError`)."""
        self._thread.join()
        if self._error is not None:
            if not isinstance(self._error, asyncio.CancelledError) and not self._noted:
                self._error.add_note(
                    f"(raised while collecting phase {self.phase} in a background thread: train.overlap_phases)"
                )
                self._noted = True
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stops the collection (if it is still running) and joins its thread."""
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile: the collection had already ended
                pass
        self._thread.join()


class _PhaseLoop(asyncio.SelectorEventLoop):
    """The event loop of a `PendingPhase`: the engines deliver results from their own threads
    (`call_soon_threadsafe`), and a request of a cancelled attempt may finish after its future was cancelled, or
    after this loop closed. Both late results are dropped here instead of being reported as errors."""

    def __init__(self) -> None:
        super().__init__()
        self.set_exception_handler(_drop_late_results)

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if self.is_closed():  # the phase has ended: nobody waits for this result
                return None
            raise


def _drop_late_results(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Exception handler of a `_PhaseLoop`: the result of a request whose attempt was cancelled (setting its
    cancelled future raises `InvalidStateError`) is dropped; anything else goes to asyncio's default handler."""
    if isinstance(context.get("exception"), asyncio.InvalidStateError):
        return
    loop.default_exception_handler(context)
