"""TensorBoard scalars for the RL and SFT trainers, written with tensorboard's own event-file writer."""

from __future__ import annotations

import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class SummaryWriter:
    """TensorBoard scalars without TensorFlow (tensorboard's own event-file writer), each under three x-axes:
    `{tag}` at the environment-step count (the paper's x-axis), `by_tokens/{tag}` at generated tokens, and
    `by_time/{tag}` at walltime seconds."""

    def __init__(self, logdir: str):
        self._writer = EventFileWriter(logdir, flush_secs=10)

    def scalars(self, values: dict[str, float], env_steps: int, *, tokens: int, walltime: float) -> None:
        now = time.time()
        for prefix, step in (("", env_steps), ("by_tokens/", tokens), ("by_time/", int(walltime))):
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=prefix + k, simple_value=float(v)) for k, v in values.items()]
            )
            self._writer.add_event(event_pb2.Event(wall_time=now, step=int(step), summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
