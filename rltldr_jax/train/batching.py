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
with `ExampleConfig.keep_filtered_as_sft` (`loss.sft_on_filtered`, and always when the GRPO term is off: the "no
GRPO" ablation), where insight-conditioned attempts stay in as SFT-only examples (advantage 0, empty action mask).
An attempt's per-step examples themselves (`Example`, `attempt_examples`) are built in `agent.step_examples`.

How insight-conditioned attempts enter the update (`loss.insight_rollouts`, Table 1 / Table 9) is a rollout mode:
a small class with its advantages and its examples (`InContext`, `OffPolicy`, `SelfDistill`: see their
docstrings), registered by name in `INSIGHT_ROLLOUTS`; a new baseline is one class and one entry there.
Writer SFT (Table 8, RLTF-FM / self-play insight SFT, `writer_examples`) adds to any mode: the insight in the
insight writer's own context (A.1 prompt with the failed rollout and report), π(f | τ), as `writer_mask` targets.

    config = ExampleConfig.of(settings)                             # the loss.* settings, built once
    examples, stats = phase_examples(attempts, builder, config, writer_outputs=..., seed=...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from rltldr_jax.agent.episode import Attempt, task_text
from rltldr_jax.agent.insight import WriterOutput
from rltldr_jax.agent.step_examples import Example, attempt_examples
from rltldr_jax.envs.base import Task
from rltldr_jax.losses import group_advantages, nonzero_advantage_groups, positive_ratio_filter
from rltldr_jax.settings import Settings, build, choices
from rltldr_jax.tokenization import ContextBuilder, Insight
from rltldr_jax.train.step import BASE_MASKS, TrainBatch


def _mask_names(examples: Sequence[Example]) -> tuple[str, ...]:
    """The masks of a batch of `examples`: the built-in three (`BASE_MASKS`, always), then any extra ones, sorted."""
    extra = sorted({k for e in examples for k in e.extra_masks} - set(BASE_MASKS))
    return (*BASE_MASKS, *extra)


def insight_prefix_example(
    task: Task, insights: Sequence[Insight], builder: ContextBuilder, attempt: int = 0
) -> Example:
    """The task and insights alone, SFT mask on the insights: π(f_1..f_I | task) without a rollout."""
    ctx = builder.build(task_text(task), insights)
    n = len(ctx)
    return Example(
        ctx.ids, np.zeros(n, np.float32), np.zeros(n, bool), ctx.insight_mask, 0.0, task.task_id, attempt, -1
    )


def writer_examples(
    attempts: Sequence[Attempt],
    writer_outputs: Sequence[tuple[str, int, WriterOutput]],
    builder: ContextBuilder,
    *,
    only_next_success: bool = False,
) -> list[Example]:
    """Insight-generator SFT examples (Table 8): the writer's prompt (task, failed rollout, report), then an answer
    that is exactly the insight; `writer_mask` on the insight tokens.

    Args:
      only_next_success: self-play insight SFT: only insights after which the task's next attempt (in the same
        phase, with that insight in context) succeeded.
    """
    tok = builder.tokenizer
    by_key = {(a.task.task_id, a.index): a for a in attempts}
    out = []
    for task_id, index, writer_output in writer_outputs:
        if not writer_output.insight or not writer_output.prompt_ids:
            continue
        if only_next_success:
            nxt = by_key.get((task_id, index + 1))
            if nxt is None or not nxt.success or writer_output.insight not in [i.text for i in nxt.insights]:
                continue
        prompt = list(writer_output.prompt_ids)
        if tok.think_end_id not in prompt[-3:]:  # an open think block: close it (the think trace is not trained)
            prompt += tok.think_close_ids
        target = tok.encode(writer_output.insight)
        ids = np.array([*prompt, *target, tok.im_end_id], np.int32)
        mask = np.zeros(len(ids), bool)
        mask[len(prompt) : len(prompt) + len(target)] = True
        n = len(ids)
        out.append(
            Example(
                ids,
                np.zeros(n, np.float32),
                np.zeros(n, bool),
                np.zeros(n, bool),
                0.0,
                task_id,
                index,
                -1,
                writer_mask=mask,
            )
        )
    return out


# ----------------------------------------------------------------------------------------------------
# Rollout modes: how insight-conditioned attempts enter the update (`loss.insight_rollouts`)
# ----------------------------------------------------------------------------------------------------


class RolloutMode:
    """How insight-conditioned attempts enter the update: their advantages and their examples.

    The base class holds what the modes share: Dr. GRPO advantages, and attempts trained as sampled (with their
    insights in context). A mode overrides what it changes and is registered in `INSIGHT_ROLLOUTS`.
    """

    #: Whether every example's context is the one its tokens were sampled in: only then does the first minibatch's
    #: logprob gap measure the engine-vs-trainer mismatch (`train.max_logprob_gap`).
    as_sampled: ClassVar[bool] = True

    def advantages(self, attempts: Sequence[Attempt], groups: np.ndarray, *, std_normalize: bool) -> np.ndarray:
        """The attempts' advantages, [N] float32 (N = len(attempts); `groups`: [N] group ids): the reward minus
        its group's mean (Dr. GRPO), divided by the group's std with `std_normalize` (Table 9 ablation)."""
        rewards = _rewards(attempts)
        return np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(groups), std_normalize=std_normalize))

    def examples(
        self, attempt: Attempt, advantage: float, builder: ContextBuilder, config: ExampleConfig
    ) -> list[Example]:
        """The examples of an attempt the filters kept: one per step, as sampled."""
        return attempt_examples(attempt, advantage, builder)

    def sft_only_examples(self, attempt: Attempt, builder: ContextBuilder) -> list[Example]:
        """The SFT-only examples of an insight-conditioned attempt the filters dropped (with
        `ExampleConfig.keep_filtered_as_sft`): its steps with the insight mask and an empty action mask."""
        return attempt_examples(attempt, 0.0, builder, train_actions=False)


class InContext(RolloutMode):
    """`in_context` (RLTL;DR): insight-conditioned attempts are trained as sampled, insights in context, the SFT
    mask on them."""


class WithoutInsights(RolloutMode):
    """The modes that train insight-conditioned attempts with the insights removed from the context; L_SFT keeps
    its signal through SFT-only examples of the task and the insights alone (`insight_prefix_example`), one per
    step of such an attempt (the same insight tokens, the same per-step weight as in context)."""

    as_sampled = False

    def sft_only_examples(self, attempt: Attempt, builder: ContextBuilder) -> list[Example]:
        return step_prefix_examples(attempt, builder)


class OffPolicy(WithoutInsights):
    """`off_policy` (Table 9): the insights are removed from the context; the old logprobs stay the engine's
    (sampled *with* insights), so the PPO ratio is π_θ(y | task) / π_old(y | task + insights). A kept
    insight-conditioned attempt also brings its insights-only SFT examples (none when λ = 0)."""

    def examples(
        self, attempt: Attempt, advantage: float, builder: ContextBuilder, config: ExampleConfig
    ) -> list[Example]:
        if not attempt.insights:
            return attempt_examples(attempt, advantage, builder)
        out = attempt_examples(attempt, advantage, builder, with_insights=False)
        return out + step_prefix_examples(attempt, builder) if config.lam > 0 else out


class SelfDistill(WithoutInsights):
    """`self_distill` (RLTF-SD, Song et al. 2026): the insights are removed; the attempt is trained by an
    advantage-weighted likelihood without importance ratio (`detach_ratio`), with advantage r − (mean reward of the
    task's attempts *without* insights in the phase; the group mean if there are none; the group std is not
    used). Attempts without insights use the same baseline, with the usual ratio."""

    def advantages(self, attempts: Sequence[Attempt], groups: np.ndarray, *, std_normalize: bool) -> np.ndarray:
        rewards = _rewards(attempts)
        plain = np.array([not a.insights for a in attempts])
        out = np.zeros(len(attempts), np.float32)
        for g in np.unique(groups):
            members = groups == g
            without = members & plain
            baseline = rewards[without].mean() if without.any() else rewards[members].mean()
            out[members] = rewards[members] - baseline
        return out

    def examples(
        self, attempt: Attempt, advantage: float, builder: ContextBuilder, config: ExampleConfig
    ) -> list[Example]:
        if not attempt.insights:
            return attempt_examples(attempt, advantage, builder)
        return attempt_examples(attempt, advantage, builder, with_insights=False, detach_ratio=True)


#: The rollout modes by name: the choices of `loss.insight_rollouts` (rltldr_jax/settings.py).
INSIGHT_ROLLOUTS: dict[str, type[RolloutMode]] = {
    "in_context": InContext,
    "off_policy": OffPolicy,
    "self_distill": SelfDistill,
}

#: Values of `loss.writer_sft_filter`: every insight, or only those after which the task's next attempt succeeded.
WRITER_SFT_FILTERS = choices("loss.writer_sft_filter")


def _rewards(attempts: Sequence[Attempt]) -> np.ndarray:
    """[N] float32: 1 for a successful attempt, else 0."""
    return np.array([float(a.success) for a in attempts], np.float32)


def step_prefix_examples(attempt: Attempt, builder: ContextBuilder) -> list[Example]:
    """One insights-only SFT example (`insight_prefix_example`) per step of `attempt`."""
    return [insight_prefix_example(attempt.task, attempt.insights, builder, attempt.index)] * len(attempt.steps)


# ----------------------------------------------------------------------------------------------------
# A phase's examples
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
    """How a phase's attempts become examples: the `loss.*` keys the examples depend on (the defaults are the
    paper's, with the rollout filters of A.3.2).

    Attributes:
      lam: λ; with off_policy, λ = 0 adds no insights-only SFT examples for kept attempts.
      grpo_coef: weight of L_GRPO; 0 keeps filtered insight-conditioned attempts as SFT-only examples.
      std_normalize: divide advantages by the group std (Table 9 ablation).
      filter_zero_advantage: drop groups whose advantages are all zero.
      positive_ratio: keep rollouts so that at least this share has a positive advantage (0 = off).
      split_advantages: insight-conditioned and unconditioned attempts of a task form separate groups (Table 9).
      sft_on_filtered: keep dropped insight-conditioned attempts as SFT-only examples (not in the paper).
      insight_rollouts: the rollout mode, a key of `INSIGHT_ROLLOUTS`.
      writer_sft_coef: weight of writer SFT (Table 8); > 0 adds the writer-SFT examples.
      writer_sft_filter: which insights writer SFT trains on, one of `WRITER_SFT_FILTERS`.
    """

    lam: float = 0.5
    grpo_coef: float = 1.0
    std_normalize: bool = False
    filter_zero_advantage: bool = True
    positive_ratio: float = 0.75
    split_advantages: bool = False
    sft_on_filtered: bool = False
    insight_rollouts: str = "in_context"
    writer_sft_coef: float = 0.0
    writer_sft_filter: str = "all"

    def __post_init__(self):
        if self.insight_rollouts not in INSIGHT_ROLLOUTS:
            raise ValueError(f"insight_rollouts={self.insight_rollouts!r}; choose one of {', '.join(INSIGHT_ROLLOUTS)}")
        if self.writer_sft_filter not in WRITER_SFT_FILTERS:
            raise ValueError(
                f"writer_sft_filter={self.writer_sft_filter!r}; choose one of {', '.join(WRITER_SFT_FILTERS)}"
            )

    @classmethod
    def of(cls, settings: Settings) -> ExampleConfig:
        """The settings of a run's `loss.*`."""
        return build(cls, settings.loss)

    @property
    def keep_filtered_as_sft(self) -> bool:
        """Whether insight-conditioned attempts the filters dropped stay in as SFT-only examples: with
        `sft_on_filtered`, and always when the GRPO term is off (grpo_coef = 0: L_SFT is then all there is)."""
        return self.grpo_coef == 0 or self.sft_on_filtered

    @property
    def rollout_mode(self) -> RolloutMode:
        """The rollout mode of `insight_rollouts`."""
        return INSIGHT_ROLLOUTS[self.insight_rollouts]()


@dataclasses.dataclass(frozen=True)
class ExampleStats:
    """What the filters did (for logging)."""

    attempts: int
    kept_attempts: int
    zero_advantage_groups: int
    sft_only_attempts: int
    examples: int
    writer_examples: int = 0


def phase_examples(
    attempts: Sequence[Attempt],
    builder: ContextBuilder,
    config: ExampleConfig = ExampleConfig(),
    *,
    writer_outputs: Sequence[tuple[str, int, WriterOutput]] = (),
    seed: int = 0,
) -> tuple[list[Example], ExampleStats]:
    """Advantages per group, the filters, then the rollout mode's examples of every kept attempt (in task, attempt
    order), the SFT-only examples of dropped insight-conditioned ones (`ExampleConfig.keep_filtered_as_sft`), and
    last the writer-SFT examples (when `writer_sft_coef` > 0).

    Args:
      attempts: a phase's attempts (any order).
      config: the advantages, filters, rollout mode and writer SFT.
      writer_outputs: the phase's (task_id, attempt index, writer_output), for writer SFT.
      seed: positive-ratio filter sampling.
    """
    mode = config.rollout_mode
    attempts = sorted(attempts, key=lambda a: (a.task.task_id, a.index))
    writer: list[Example] = []
    if config.writer_sft_coef > 0:
        only_next_success = config.writer_sft_filter == "next_success"
        writer = writer_examples(attempts, writer_outputs, builder, only_next_success=only_next_success)
    if not attempts:
        return writer, ExampleStats(0, 0, 0, 0, len(writer), len(writer))
    keys = [(a.task.task_id, bool(a.insights) if config.split_advantages else False) for a in attempts]
    group_of = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    groups = np.array([group_of[k] for k in keys])
    adv = mode.advantages(attempts, groups, std_normalize=config.std_normalize)
    keep = np.ones(len(attempts), bool)
    if config.filter_zero_advantage:
        keep &= nonzero_advantage_groups(adv, groups)
    zero_groups = len(set(groups.tolist())) - len(set(groups[keep].tolist()))
    if config.positive_ratio > 0:
        keep &= positive_ratio_filter(adv, config.positive_ratio, rng=seed, keep=keep)
    examples: list[Example] = []
    sft_only = 0
    for a, advantage, kept in zip(attempts, adv, keep, strict=True):
        if kept:
            examples += mode.examples(a, float(advantage), builder, config)
        elif config.keep_filtered_as_sft and a.insights:
            examples += mode.sft_only_examples(a, builder)
            sft_only += 1
    examples += writer
    return examples, ExampleStats(len(attempts), int(keep.sum()), zero_groups, sft_only, len(examples), len(writer))


#: Named rules of `batch.length_buckets` (else an explicit comma-separated list of lengths).
LENGTH_BUCKET_RULES = ("geometric", "multiples")


def length_buckets(spec: str, pad_to_multiple: int, max_len: int) -> tuple[int, ...] | None:
    """The padded lengths T an optimizer step's batch may have (`batch.length_buckets`); `pack` pads each batch to
    the smallest one that holds its longest example. Every distinct T compiles the train step once (then the
    compilation cache has it), so a run should see few of them.

    - "geometric": `pad_to_multiple` × 1, 2, 3, 4, 6, 8, 12, 16, 24, ... up to `max_len` rounded up to
      `pad_to_multiple`, which is the last bucket: two shapes per doubling of the length (the paper's 32,768 tokens
      at 256: 14 shapes, where "multiples" has 128; the replication's 512 at 64: 64, 128, 192, 256, 384, 512). From
      2 × pad_to_multiple on, each bucket is at most 1.5× the one before, so T < 1.5× the batch's longest example.
    - "multiples": every multiple of `pad_to_multiple` (the least padding, one program per multiple); returns None.
    - "L1,L2,...": these lengths (increasing; the last must hold `max_len`); `pad_to_multiple` is not applied.

    Measured on the quick replication (`configs/replicate.py:quick`, pad_to_multiple=64, 16-row steps, 10 phases,
    155 examples of 42-367 tokens, 30 optimizer steps): "multiples" compiled T = 256, 320, 384 (three compilations,
    13-40 s each on 2 CPU cores) for 8 / 14 / 8 steps, with 39.6 % of the steps' row × T slots holding tokens;
    "geometric" compiles T = 256, 384 for 8 / 22 steps, 36.2 % filled: one compilation fewer for 9 % more padded
    positions (most padding is the partial last batch's empty rows, which every rule keeps). A step at T = 384 took
    ~8 % longer than at 320 (2.6 vs 2.4 s on the loaded machine; 256: 1.4 s), about +3 s over those 30 steps.

    Args:
      spec: "geometric", "multiples" or a comma-separated list of lengths.
      pad_to_multiple: the rounding unit of the named rules.
      max_len: the longest an example may be (`rollout.max_context_tokens`).

    Returns:
      The increasing bucket lengths, or None for "multiples" (round up to `pad_to_multiple`).

    Raises:
      ValueError: `length_buckets_error`'s message.
    """
    problem = length_buckets_error(spec, pad_to_multiple, max_len)
    if problem:
        raise ValueError(problem)
    if spec == "multiples":
        return None
    if spec != "geometric":
        return tuple(int(v) for v in spec.split(","))
    top = -(-max_len // pad_to_multiple)  # in units of pad_to_multiple
    factors = sorted({f for k in range(top.bit_length() + 1) for f in (1 << k, 3 << k) if f < top})
    return tuple(f * pad_to_multiple for f in factors) + (top * pad_to_multiple,)


def length_buckets_error(spec: str, pad_to_multiple: int, max_len: int, *, prefix: str = "batch.") -> str | None:
    """What is wrong with `batch.length_buckets` (see `length_buckets`), None if nothing; `prefix` prefixes the keys
    named in the message."""
    if spec in LENGTH_BUCKET_RULES:
        return None
    try:
        values = [int(v) for v in spec.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        return (
            f"{prefix}length_buckets={spec!r} is not one of {', '.join(map(repr, LENGTH_BUCKET_RULES))} nor an "
            "increasing comma-separated list of positive lengths: use e.g. 'geometric' or '256,512,1024'"
        )
    if values[-1] < max_len:
        return (
            f"{prefix}length_buckets={spec!r}: the longest bucket {values[-1]} is shorter than "
            f"rollout.max_context_tokens={max_len}: add a bucket >= {max_len}, or lower rollout.max_context_tokens"
        )
    return None


def pack(
    examples: Sequence[Example],
    *,
    micro_batch_size: int,
    grad_accum_steps: int,
    pad_to_multiple: int = 256,
    max_len: int | None = None,
    length_buckets: Sequence[int] | None = None,
    pack_rows: int = 0,
) -> list[TrainBatch]:
    """Optimizer-step batches of `grad_accum_steps` micro-batches × `micro_batch_size` rows, or with `pack_rows` the
    same examples per step packed several to a row (below).

    Examples are taken in the given order (shuffle before for PPO epochs). Every batch has the full
    [grad_accum_steps, micro_batch_size, T] shape, the last one too: its missing rows are all-padding (empty masks,
    advantage 0), which contribute nothing to either loss term. T is the smallest of `length_buckets` that holds the
    batch's longest example (right-padded), or with `length_buckets` None that longest example rounded up to
    `pad_to_multiple`. An example longer than `max_len` or than the last bucket is an error naming the fix.

    Packing (`pack_rows` = R > 0, `batch.pack_rows`): a step still takes the next `micro_batch_size ×
    grad_accum_steps` examples (the same optimizer steps, the same loss), but lays them out first-fit decreasing into
    rows of one length T (the longest bucket, or `max_len` rounded up to `pad_to_multiple`), R rows per micro-batch,
    with `TrainBatch.segments` telling the examples of a row apart (the model computes each as if alone, see
    `Qwen35.hidden_states`) and per-token advantages. Every step has the same [ceil(examples / R), R, T] shape, so
    the train step compiles once; the micro-batches left without examples are skipped at run time (`train_step`).
    On the quick replication 16 examples of ~150 tokens fill ~5 rows of 512 instead of 16 rows of 256-384.

    Returns:
      The batches, each a `TrainBatch` of [A, M, T] / [A, M] arrays (A = grad_accum_steps, M = micro_batch_size;
      packed: A = ceil(M × grad_accum_steps / R), M = R, advantages and detach_ratio [A, M, T]).
    """
    per_step = micro_batch_size * grad_accum_steps
    names = _mask_names(examples)  # every batch has the same masks: one pytree, one compiled step
    batches = []
    for start in range(0, len(examples), per_step):
        chunk = list(examples[start : start + per_step])
        longest = max(len(e) for e in chunk)
        if max_len is not None and longest > max_len:
            raise ValueError(
                f"an example has {longest} tokens, more than max_len={max_len}: raise it or lower rollout budgets"
            )
        if pack_rows:
            limit = (
                length_buckets[-1] if length_buckets else -(-(max_len or longest) // pad_to_multiple) * pad_to_multiple
            )
            if longest > limit:
                raise ValueError(
                    f"an example has {longest} tokens, more than the packed row length {limit}: add a longer "
                    "bucket to batch.length_buckets or lower rollout.max_context_tokens"
                )
            batches.append(_packed_batch(chunk, pack_rows, -(-per_step // pack_rows), limit, names))
            continue
        if length_buckets is None:
            t = -(-longest // pad_to_multiple) * pad_to_multiple
        else:
            fits = [b for b in length_buckets if b >= longest]
            if not fits:
                raise ValueError(
                    f"an example has {longest} tokens, more than the longest of batch.length_buckets "
                    f"{tuple(length_buckets)}: add a longer bucket or lower rollout.max_context_tokens"
                )
            t = min(fits)
        ids = np.zeros((per_step, t), np.int32)
        old = np.zeros((per_step, t), np.float32)
        masks = {name: np.zeros((per_step, t), bool) for name in names}
        detach = np.zeros((per_step,), bool)
        adv = np.zeros((per_step,), np.float32)
        for r, e in enumerate(chunk):
            n = len(e)
            ids[r, :n], old[r, :n], adv[r] = e.ids, e.old_logprobs, e.advantage
            for name, mask in e.masks.items():
                masks[name][r, :n] = mask
            detach[r] = e.detach_ratio
        shape = (grad_accum_steps, micro_batch_size)
        batches.append(
            TrainBatch(
                ids=jnp.asarray(ids.reshape(*shape, t)),
                old_logprobs=jnp.asarray(old.reshape(*shape, t)),
                advantages=jnp.asarray(adv.reshape(shape)),
                masks={name: jnp.asarray(m.reshape(*shape, t)) for name, m in masks.items()},
                detach_ratio=jnp.asarray(detach.reshape(shape)),
            )
        )
    return batches


def _packed_batch(
    chunk: Sequence[Example], rows_per_micro: int, micro_batches: int, length: int, names: Sequence[str] = BASE_MASKS
) -> TrainBatch:
    """One optimizer step's examples packed first-fit decreasing into [micro_batches, rows_per_micro, length] rows
    (`pack`), with the masks `names`; segment ids 1, 2, ... in each row, 0 on the padding after them."""
    n_rows = micro_batches * rows_per_micro
    order = sorted(range(len(chunk)), key=lambda i: -len(chunk[i]))  # stable: ties keep the given order
    used = [0] * n_rows
    place = {}
    for i in order:
        row = next(r for r in range(n_rows) if used[r] + len(chunk[i]) <= length)  # exists: <= one example per row
        place[i] = (row, used[row])
        used[row] += len(chunk[i])
    shape = (n_rows, length)
    ids, segments = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    old, adv = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    detach = np.zeros(shape, bool)
    masks = {name: np.zeros(shape, bool) for name in names}
    count = [0] * n_rows
    for i in sorted(place, key=lambda i: place[i]):  # row by row, left to right
        e, (row, at) = chunk[i], place[i]
        count[row] += 1
        span = slice(at, at + len(e))
        ids[row, span], old[row, span] = e.ids, e.old_logprobs
        for name, mask in e.masks.items():
            masks[name][row, span] = mask
        segments[row, span], adv[row, span], detach[row, span] = count[row], e.advantage, e.detach_ratio
    grid = (micro_batches, rows_per_micro, length)
    return TrainBatch(
        ids=jnp.asarray(ids.reshape(grid)),
        old_logprobs=jnp.asarray(old.reshape(grid)),
        advantages=jnp.asarray(adv.reshape(grid)),
        masks={name: jnp.asarray(m.reshape(grid)) for name, m in masks.items()},
        detach_ratio=jnp.asarray(detach.reshape(grid)),
        segments=jnp.asarray(segments.reshape(grid)),
    )
