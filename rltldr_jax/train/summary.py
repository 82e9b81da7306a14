"""TensorBoard scalars (and the run's hyperparameters) for the RL and SFT trainers, written with tensorboard's own
event-file writer."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from rltldr_jax.distributed import is_main_process

#: (subdirectory of the log directory, tag prefix) of each x-axis: environment steps (the paper's), generated
#: tokens, walltime seconds.
AXES = (("", ""), ("by_tokens", "by_tokens/"), ("by_time", "by_time/"))


class SummaryWriter:
    """TensorBoard scalars without TensorFlow (tensorboard's own event-file writer), each under three x-axes:
    `{tag}` at the environment-step count (the paper's x-axis) in `logdir`, `by_tokens/{tag}` at generated tokens
    in `logdir/by_tokens`, and `by_time/{tag}` at walltime seconds in `logdir/by_time`.

    Each axis is its own TensorBoard run (directory), so that a resumed run can purge each at its own step:
    with `resumed_at=(env_steps, tokens, walltime)` every axis gets a `SessionLog.START` event at the step after
    the restored count, which makes TensorBoard (and `EventAccumulator`) discard the events the killed run logged
    past its checkpoint; the redone phases then appear once.

    In a multi-process job only process 0 writes (the others' writers do nothing, so one run has one set of event
    files); `enabled` overrides that choice.
    """

    def __init__(self, logdir: str, *, resumed_at: tuple[int, int, float] | None = None, enabled: bool | None = None):
        enabled = is_main_process() if enabled is None else enabled
        self._writers = (
            [EventFileWriter(os.path.join(logdir, sub), flush_secs=10) for sub, _ in AXES] if enabled else []
        )
        if resumed_at is not None and self._writers:
            env_steps, tokens, walltime = resumed_at
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            for writer, step in zip(self._writers, (env_steps, tokens, int(walltime)), strict=True):
                writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step) + 1, session_log=start))
                writer.flush()

    def scalars(self, values: dict[str, float], env_steps: int, *, tokens: int, walltime: float) -> None:
        """Writes `values` (tag → number) at the three x-axes' steps."""
        if not self._writers:
            return
        now = time.time()
        for writer, (_, prefix), step in zip(self._writers, AXES, (env_steps, tokens, int(walltime)), strict=True):
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=prefix + k, simple_value=float(v)) for k, v in values.items()]
            )
            writer.add_event(event_pb2.Event(wall_time=now, step=int(step), summary=summary))
            writer.flush()

    def hparams(self, values: Mapping[str, bool | int | float | str], *, start_time: float) -> None:
        """Writes `values` (a flat key → value table, e.g. the run's config with dotted keys) as the run's
        hyperparameters (TensorBoard's HPARAMS tab: one row per run of the log directory, its values beside its
        scalars), at step 0 of the environment-step axis. TensorBoard keeps the first one a run wrote: a resumed run's
        table is that of its start."""
        if not self._writers:
            return
        summary = hparams_summary.hparams_pb(dict(values), start_time_secs=start_time)
        self._writers[0].add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))
        self._writers[0].flush()

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
