"""An attempt's steps as training examples: each step's context rebuilt from the token segments the engine saw.

`attempt_examples` turns one attempt into one `Example` per step (task, the attempt's insights, earlier steps
without think traces, then this step's think and action), with the action mask, the insight mask and the engine's
old logprobs. The trainer (`train.batching`) builds its batches from such examples; the analyses
(`analysis.reliance`) score the same contexts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from rltldr_jax.agent.episode import Attempt, task_text
from rltldr_jax.tokenization import ContextBuilder, Step


@dataclasses.dataclass(frozen=True)
class Example:
    """One step of one attempt (or one writer context), ready for the loss. Arrays are [T].

    `writer_mask` marks insight-generator SFT targets (None: none); `detach_ratio` trains the action tokens
    without importance ratio (RLTF-SD); `step` is -1 for SFT-only prefix and writer examples. `extra_masks` holds the
    [T] masks of registered loss terms beyond the built-in three, by `TrainBatch.masks` name (`loss_terms`).
    """

    ids: np.ndarray
    old_logprobs: np.ndarray
    action_mask: np.ndarray
    insight_mask: np.ndarray
    advantage: float
    task_id: str
    attempt: int
    step: int
    writer_mask: np.ndarray | None = None
    detach_ratio: bool = False
    extra_masks: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def masks(self) -> dict[str, np.ndarray]:
        """Every [T] mask of the example by `TrainBatch.masks` name ("writer" only when it has one)."""
        masks = {"action": self.action_mask, "insight": self.insight_mask}
        if self.writer_mask is not None:
            masks["writer"] = self.writer_mask
        return {**masks, **self.extra_masks}


def attempt_examples(
    attempt: Attempt,
    advantage: float,
    builder: ContextBuilder,
    *,
    train_actions: bool = True,
    with_insights: bool = True,
    detach_ratio: bool = False,
) -> list[Example]:
    """The examples of one attempt (one per step).

    Args:
      train_actions: False clears the action mask (SFT only).
      with_insights: False rebuilds every step's context without the attempt's insights (off-policy / RLTF-SD);
        the old logprobs stay those the engine sampled with.
      detach_ratio: train the actions without importance ratio (RLTF-SD).
    """
    goal = task_text(attempt.task)
    insights = attempt.insights if with_insights else ()
    out = []
    for k, step in enumerate(attempt.steps):
        earlier = [s.as_step() for s in attempt.steps[:k]]
        ctx = builder.build(goal, insights, earlier, Step(step.action_ids, None, step.forced))
        old = np.zeros(len(ctx), np.float32)
        old[ctx.prompt_length :] = step.logprobs
        action = ctx.action_mask if train_actions else np.zeros(len(ctx), bool)
        out.append(
            Example(
                ctx.ids,
                old,
                action,
                ctx.insight_mask,
                float(advantage),
                attempt.task.task_id,
                attempt.index,
                k,
                detach_ratio=detach_ratio,
            )
        )
    return out
