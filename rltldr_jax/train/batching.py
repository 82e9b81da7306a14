"""From a phase's attempts to training examples and packed `TrainBatch`es.

One example is one step of one attempt (A.4: "the update minibatch is one step"): the step's context rebuilt from
the same token segments the engine saw (task, the attempt's insights, earlier steps without think traces, then
this step's think and action), with
- `action_mask` on the tokens the policy sampled in this step (GRPO targets; forced tokens excluded),
- `insight_mask` on every insight sentence in the context (the flipped backprop mask of L_SFT, §3.3 / App. B),
- `old_logprobs` = the engine's logprobs of those sampled tokens,
- the attempt's advantage: its reward (1 for success, else 0) minus its group's mean (Dr. GRPO; a group is one
  task's attempts in the phase).
Filters (A.3.2): groups whose advantages are all zero, then positive-ratio filtering, drop attempts. Dropped
attempts take their SFT signal with them (L_SFT rides on the GRPO examples, "without increasing runtime"), except
when the GRPO term is off (`keep_sft_only`, the "no GRPO" ablation), where insight-conditioned attempts stay in as
SFT-only examples (advantage 0, empty action mask).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from rltldr_jax.agent.episode import Attempt, task_text
from rltldr_jax.losses import group_advantages, nonzero_advantage_groups, positive_ratio_filter
from rltldr_jax.tokenization import ContextBuilder, Step
from rltldr_jax.train.step import TrainBatch


@dataclasses.dataclass(frozen=True)
class Example:
    """One step of one attempt, ready for the loss. Arrays are [T]."""

    ids: np.ndarray
    old_logprobs: np.ndarray
    action_mask: np.ndarray
    insight_mask: np.ndarray
    advantage: float
    task_id: str
    attempt: int
    step: int

    def __len__(self) -> int:
        return len(self.ids)


def attempt_examples(attempt: Attempt, advantage: float, builder: ContextBuilder, *, train_actions: bool = True) -> list[Example]:
    """The examples of one attempt (one per step); `train_actions=False` clears the action mask (SFT only)."""
    goal = task_text(attempt.task)
    out = []
    for k, step in enumerate(attempt.steps):
        earlier = [s.as_step() for s in attempt.steps[:k]]
        ctx = builder.build(goal, attempt.insights, earlier, Step(step.action_ids, None, step.forced))
        old = np.zeros(len(ctx), np.float32)
        old[ctx.prompt_length :] = step.logprobs
        action = ctx.action_mask if train_actions else np.zeros(len(ctx), bool)
        out.append(Example(ctx.ids, old, action, ctx.insight_mask, float(advantage), attempt.task.task_id, attempt.index, k))
    return out


@dataclasses.dataclass(frozen=True)
class ExampleStats:
    """What the filters did (for logging)."""

    attempts: int
    kept_attempts: int
    zero_advantage_groups: int
    sft_only_attempts: int
    examples: int


def phase_examples(
    attempts: Sequence[Attempt],
    builder: ContextBuilder,
    *,
    std_normalize: bool = False,
    filter_zero_advantage: bool = True,
    positive_ratio: float = 0.75,
    split_advantages: bool = False,
    keep_sft_only: bool = False,
    seed: int = 0,
) -> tuple[list[Example], ExampleStats]:
    """Advantages per group, the filters, then one example per step of every kept attempt.

    Args:
      attempts: a phase's attempts (any order).
      std_normalize: divide advantages by the group std (Table 9 ablation).
      filter_zero_advantage: drop groups whose advantages are all zero.
      positive_ratio: keep rollouts so that at least this share has a positive advantage (0 = off).
      split_advantages: insight-conditioned and unconditioned attempts of a task form separate groups (Table 9).
      keep_sft_only: keep dropped insight-conditioned attempts as SFT-only examples (for grpo_coef = 0).
      seed: positive-ratio filter sampling.
    """
    attempts = sorted(attempts, key=lambda a: (a.task.task_id, a.index))
    if not attempts:
        return [], ExampleStats(0, 0, 0, 0, 0)
    keys = [(a.task.task_id, bool(a.insights) if split_advantages else False) for a in attempts]
    group_of = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    groups = np.array([group_of[k] for k in keys])
    rewards = np.array([float(a.success) for a in attempts], np.float32)
    adv = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(groups), std_normalize=std_normalize))
    keep = np.ones(len(attempts), bool)
    if filter_zero_advantage:
        keep &= nonzero_advantage_groups(adv, groups)
    zero_groups = len(set(groups.tolist())) - len(set(groups[keep].tolist()))
    if positive_ratio > 0:
        keep &= positive_ratio_filter(adv, positive_ratio, rng=seed, keep=keep)
    examples: list[Example] = []
    sft_only = 0
    for a, advantage, kept in zip(attempts, adv, keep):
        if kept:
            examples += attempt_examples(a, float(advantage), builder)
        elif keep_sft_only and a.insights:
            examples += attempt_examples(a, 0.0, builder, train_actions=False)
            sft_only += 1
    return examples, ExampleStats(len(attempts), int(keep.sum()), zero_groups, sft_only, len(examples))


def pack(
    examples: Sequence[Example], *, micro_batch_size: int, grad_accum_steps: int, pad_to_multiple: int = 256, max_len: int | None = None
) -> list[TrainBatch]:
    """Optimizer-step batches of `grad_accum_steps` micro-batches × `micro_batch_size` rows.

    Examples are taken in the given order (shuffle before for PPO epochs); each batch is right-padded to its
    longest example rounded up to `pad_to_multiple`; missing rows are all-padding (empty masks). An example
    longer than `max_len` is an error naming the fix.
    """
    per_step = micro_batch_size * grad_accum_steps
    batches = []
    for start in range(0, len(examples), per_step):
        chunk = list(examples[start : start + per_step])
        longest = max(len(e) for e in chunk)
        if max_len is not None and longest > max_len:
            raise ValueError(f"an example has {longest} tokens, more than max_len={max_len}: raise it or lower rollout budgets")
        t = -(-longest // pad_to_multiple) * pad_to_multiple
        ids = np.zeros((per_step, t), np.int32)
        old = np.zeros((per_step, t), np.float32)
        action = np.zeros((per_step, t), bool)
        insight = np.zeros((per_step, t), bool)
        adv = np.zeros((per_step,), np.float32)
        for r, e in enumerate(chunk):
            n = len(e)
            ids[r, :n], old[r, :n], action[r, :n], insight[r, :n], adv[r] = e.ids, e.old_logprobs, e.action_mask, e.insight_mask, e.advantage
        shape = (grad_accum_steps, micro_batch_size)
        batches.append(
            TrainBatch(
                ids=jnp.asarray(ids.reshape(*shape, t)),
                old_logprobs=jnp.asarray(old.reshape(*shape, t)),
                advantages=jnp.asarray(adv.reshape(shape)),
                action_mask=jnp.asarray(action.reshape(*shape, t)),
                insight_mask=jnp.asarray(insight.reshape(*shape, t)),
            )
        )
    return batches
