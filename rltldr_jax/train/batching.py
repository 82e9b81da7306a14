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

How insight-conditioned attempts enter the update (`insight_rollouts`, Table 1 / Table 9):
- `in_context` (RLTL;DR): as sampled, insights in context, SFT mask on them.
- `off_policy`: the insights are removed from the context; the old logprobs stay the engine's (sampled *with*
  insights), so the PPO ratio is π_θ(y | task) / π_old(y | task + insights). L_SFT keeps its signal through one
  SFT-only example per step of such an attempt: the task and the insights alone (the same insight tokens, the
  same per-step weight as in context).
- `self_distill` (RLTF-SD, Song et al. 2026): the insights are removed; the attempt is trained by an
  advantage-weighted likelihood without importance ratio (`detach_ratio`), with advantage r − (mean reward of
  the task's attempts *without* insights in the phase; the group mean if there are none). Attempts without
  insights use the same baseline, with the usual ratio.
Judge SFT (Table 8, RLTF-FM / self-play insight SFT, `judge_examples`): the insight in the insight writer's own
context (A.1 prompt with the failed rollout and report), π(f | τ), as `judge_mask` targets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from rltldr_jax.agent.episode import Attempt, task_text
from rltldr_jax.envs.base import Task
from rltldr_jax.agent.insight import Judgement
from rltldr_jax.losses import group_advantages, nonzero_advantage_groups, positive_ratio_filter
from rltldr_jax.tokenization import ContextBuilder, Insight, Step
from rltldr_jax.train.step import TrainBatch


INSIGHT_ROLLOUTS = ("in_context", "off_policy", "self_distill")


@dataclasses.dataclass(frozen=True)
class Example:
    """One step of one attempt (or one judge context), ready for the loss. Arrays are [T].

    `judge_mask` marks insight-generator SFT targets (None: none); `detach_ratio` trains the action tokens
    without importance ratio (RLTF-SD); `step` is -1 for SFT-only prefix and judge examples.
    """

    ids: np.ndarray
    old_logprobs: np.ndarray
    action_mask: np.ndarray
    insight_mask: np.ndarray
    advantage: float
    task_id: str
    attempt: int
    step: int
    judge_mask: np.ndarray | None = None
    detach_ratio: bool = False

    def __len__(self) -> int:
        return len(self.ids)


def attempt_examples(
    attempt: Attempt, advantage: float, builder: ContextBuilder, *, train_actions: bool = True, with_insights: bool = True,
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
        out.append(Example(ctx.ids, old, action, ctx.insight_mask, float(advantage), attempt.task.task_id, attempt.index, k,
                           detach_ratio=detach_ratio))  # fmt: skip
    return out


def insight_prefix_example(task: Task, insights: Sequence[Insight], builder: ContextBuilder, attempt: int = 0) -> Example:
    """The task and insights alone, SFT mask on the insights: π(f_1..f_I | task) without a rollout."""
    ctx = builder.build(task_text(task), insights)
    n = len(ctx)
    return Example(ctx.ids, np.zeros(n, np.float32), np.zeros(n, bool), ctx.insight_mask, 0.0, task.task_id, attempt, -1)


def judge_examples(
    attempts: Sequence[Attempt], judgements: Sequence[tuple[str, int, Judgement]], builder: ContextBuilder, *, only_next_success: bool = False
) -> list[Example]:
    """Insight-generator SFT examples (Table 8): the judge's prompt (task, failed rollout, report), then an answer
    that is exactly the insight; `judge_mask` on the insight tokens.

    Args:
      only_next_success: self-play insight SFT: only insights after which the task's next attempt (in the same
        phase, with that insight in context) succeeded.
    """
    tok = builder.tokenizer
    by_key = {(a.task.task_id, a.index): a for a in attempts}
    out = []
    for task_id, index, judgement in judgements:
        if not judgement.insight or not judgement.prompt_ids:
            continue
        if only_next_success:
            nxt = by_key.get((task_id, index + 1))
            if nxt is None or not nxt.success or judgement.insight not in [i.text for i in nxt.insights]:
                continue
        prompt = list(judgement.prompt_ids)
        if tok.think_end_id not in prompt[-3:]:  # an open think block: close it (the think trace is not trained)
            prompt += [tok.think_end_id, *tok.encode("\n\n")]
        target = tok.encode(judgement.insight)
        ids = np.array([*prompt, *target, tok.im_end_id], np.int32)
        mask = np.zeros(len(ids), bool)
        mask[len(prompt) : len(prompt) + len(target)] = True
        n = len(ids)
        out.append(Example(ids, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), 0.0, task_id, index, -1, judge_mask=mask))
    return out


@dataclasses.dataclass(frozen=True)
class ExampleStats:
    """What the filters did (for logging)."""

    attempts: int
    kept_attempts: int
    zero_advantage_groups: int
    sft_only_attempts: int
    examples: int
    judge_examples: int = 0


def _advantages(attempts: Sequence[Attempt], groups: np.ndarray, std_normalize: bool, no_insight_baseline: bool) -> np.ndarray:
    rewards = np.array([float(a.success) for a in attempts], np.float32)
    adv = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(groups), std_normalize=std_normalize))
    if not no_insight_baseline:
        return adv
    out = adv.copy()
    for g in np.unique(groups):
        members = groups == g
        plain = members & np.array([not a.insights for a in attempts])
        baseline = rewards[plain].mean() if plain.any() else rewards[members].mean()
        out[members] = rewards[members] - baseline
    return out


def phase_examples(
    attempts: Sequence[Attempt],
    builder: ContextBuilder,
    *,
    std_normalize: bool = False,
    filter_zero_advantage: bool = True,
    positive_ratio: float = 0.75,
    split_advantages: bool = False,
    keep_sft_only: bool = False,
    insight_rollouts: str = "in_context",
    sft_prefix: bool = True,
    judgements: Sequence[tuple[str, int, Judgement]] = (),
    judge_sft: str | None = None,
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
      insight_rollouts: in_context | off_policy | self_distill (module docstring).
      sft_prefix: with off_policy, add the insights-only SFT examples (off when λ = 0).
      judgements: the phase's (task_id, attempt index, judgement), for judge SFT.
      judge_sft: None (off) | "all" | "next_success": add judge-SFT examples (Table 8).
      seed: positive-ratio filter sampling.
    """
    if insight_rollouts not in INSIGHT_ROLLOUTS:
        raise ValueError(f"insight_rollouts={insight_rollouts!r}; choose one of {', '.join(INSIGHT_ROLLOUTS)}")
    if judge_sft not in (None, "all", "next_success"):
        raise ValueError(f'judge_sft={judge_sft!r}; choose None, "all" or "next_success"')
    attempts = sorted(attempts, key=lambda a: (a.task.task_id, a.index))
    judge = judge_examples(attempts, judgements, builder, only_next_success=judge_sft == "next_success") if judge_sft else []
    if not attempts:
        return judge, ExampleStats(0, 0, 0, 0, len(judge), len(judge))
    keys = [(a.task.task_id, bool(a.insights) if split_advantages else False) for a in attempts]
    group_of = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    groups = np.array([group_of[k] for k in keys])
    adv = _advantages(attempts, groups, std_normalize, no_insight_baseline=insight_rollouts == "self_distill")
    keep = np.ones(len(attempts), bool)
    if filter_zero_advantage:
        keep &= nonzero_advantage_groups(adv, groups)
    zero_groups = len(set(groups.tolist())) - len(set(groups[keep].tolist()))
    if positive_ratio > 0:
        keep &= positive_ratio_filter(adv, positive_ratio, rng=seed, keep=keep)
    examples: list[Example] = []
    sft_only = 0
    for a, advantage, kept in zip(attempts, adv, keep):
        conditioned = bool(a.insights)
        moved = conditioned and insight_rollouts != "in_context"  # trained without its insights in context
        # Off-policy keeps L_SFT with one insights-only example per step (the per-step weight it has in context).
        prefixes = [insight_prefix_example(a.task, a.insights, builder, a.index)] * len(a.steps) if moved else []
        if kept:
            examples += attempt_examples(a, float(advantage), builder, with_insights=not moved,
                                         detach_ratio=moved and insight_rollouts == "self_distill")  # fmt: skip
            if insight_rollouts == "off_policy" and sft_prefix:
                examples += prefixes
        elif keep_sft_only and conditioned:
            if moved:
                examples += prefixes
            else:
                examples += attempt_examples(a, 0.0, builder, train_actions=False)
            sft_only += 1
    examples += judge
    return examples, ExampleStats(len(attempts), int(keep.sum()), zero_groups, sft_only, len(examples), len(judge))


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
        judge = np.zeros((per_step, t), bool)
        detach = np.zeros((per_step,), bool)
        adv = np.zeros((per_step,), np.float32)
        for r, e in enumerate(chunk):
            n = len(e)
            ids[r, :n], old[r, :n], action[r, :n], insight[r, :n], adv[r] = e.ids, e.old_logprobs, e.action_mask, e.insight_mask, e.advantage
            if e.judge_mask is not None:
                judge[r, :n] = e.judge_mask
            detach[r] = e.detach_ratio
        shape = (grad_accum_steps, micro_batch_size)
        batches.append(
            TrainBatch(
                ids=jnp.asarray(ids.reshape(*shape, t)),
                old_logprobs=jnp.asarray(old.reshape(*shape, t)),
                advantages=jnp.asarray(adv.reshape(shape)),
                action_mask=jnp.asarray(action.reshape(*shape, t)),
                insight_mask=jnp.asarray(insight.reshape(*shape, t)),
                judge_mask=jnp.asarray(judge.reshape(*shape, t)),
                detach_ratio=jnp.asarray(detach.reshape(shape)),
            )
        )
    return batches
