"""A frozen copy of the train step before loss terms became data (issue 24, commit 7d02a12 of rltldr_jax/train/step.py):
the reference that tests/test_loss_terms.py holds the term-driven `train_step` to, bit for bit. Do not edit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from rltldr_jax.losses import grpo_loss, insight_sft_loss, rltldr_loss, safe_divide
from rltldr_jax.models.qwen3_5 import sequence_logprobs


@struct.dataclass
class LegacyBatch:
    """The examples of one optimizer step, as A micro-batches of M rows of T tokens: one example per row, or with
    `segments` several examples packed in a row (`batching.pack`, `batch.pack_rows`).

    ids: [A, M, T] int32 context + current step ids (right-padded).
    old_logprobs: [A, M, T] float32 logprobs of the sampled tokens under the sampling policy.
    advantages: [A, M] float32 per-example advantage, or [A, M, T] per token (packed rows).
    action_mask: [A, M, T] bool, GRPO targets (tokens sampled in the example's step).
    insight_mask: [A, M, T] bool, SFT targets (insight sentences; for the offline SFT baselines, whatever the
      baseline trains on).
    writer_mask: [A, M, T] bool, insight-generator SFT targets (the insight in the writer's context, Table 8);
      None = none.
    detach_ratio: [A, M] (or [A, M, T], packed rows) bool, examples trained without an importance ratio (RLTF-SD);
      None = none.
    segments: [A, M, T] int32 segment ids of packed rows (`Qwen35.hidden_states`): 1, 2, ... one per example in
      row order, 0 after the last one; None = one example per row.
    """

    ids: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array
    action_mask: jax.Array
    insight_mask: jax.Array
    writer_mask: jax.Array | None = None
    detach_ratio: jax.Array | None = None
    segments: jax.Array | None = None


#: Sums that `_micro_loss` reports next to the loss, accumulated over micro-batches.
AUX_KEYS = (
    "grpo_sum",
    "clipped",
    "ratio_sum",
    "sft_sum",
    "writer_sum",
    "entropy_sum",
    "trainer_logprob_sum",
    "sampler_logprob_sum",
)


def _micro_loss(params, graphdef, mb: dict[str, jax.Array], counts: tuple[jax.Array, ...], loss_cfg: Any):
    grpo_count, sft_count, writer_count = counts
    model = nnx.merge(graphdef, params)
    needed = mb["action_mask"] | mb["insight_mask"] | mb["writer_mask"]
    lp, entropy = sequence_logprobs(
        model, mb["ids"], chunk=loss_cfg.logprob_chunk, needed=needed, segments=mb.get("segments")
    )
    grpo = grpo_loss(lp, mb["old_logprobs"], mb["advantages"], mb["action_mask"], loss_cfg.clip_eps, mb["detach_ratio"])
    sft = insight_sft_loss(lp, mb["insight_mask"])
    writer = insight_sft_loss(lp, mb["writer_mask"])
    loss = rltldr_loss(
        grpo,
        sft,
        lam=loss_cfg.lam,
        grpo_count=grpo_count,
        sft_count=sft_count,
        grpo_coef=loss_cfg.grpo_coef,
        writer=writer,
        writer_sft_coef=loss_cfg.writer_sft_coef,
        writer_count=writer_count,
    )
    aux = {
        "grpo_sum": grpo.loss_sum,
        "clipped": grpo.clipped,
        "ratio_sum": grpo.ratio_sum,
        "sft_sum": sft.loss_sum,
        "writer_sum": writer.loss_sum,
        "entropy_sum": jnp.sum(entropy * mb["action_mask"]),
        "trainer_logprob_sum": jnp.sum(lp * mb["action_mask"]),
        "sampler_logprob_sum": jnp.sum(mb["old_logprobs"] * mb["action_mask"]),
    }
    return loss, aux


def train_step(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    opt_state: Any,
    batch: LegacyBatch,
    *,
    tx: optax.GradientTransformation,
    loss_cfg: Any,
) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """Accumulates gradients over the A micro-batches of `batch`, then applies one optimizer update.

    A step whose loss or gradient norm is not finite changes nothing: the parameters and the optimizer state
    are returned as they came, and the metric `skipped_nonfinite` is 1 (else 0). A micro-batch without any loss
    target (the all-padding rows that fill the last batch of a phase, or the unused rows of packed steps) is skipped
    at run time (`lax.cond`): it would add exactly zero to the loss and the gradient.

    Args:
      graphdef, params, opt_state: the policy's structure, parameters and optimizer state.
      batch: A micro-batches of M rows of T tokens (`TrainBatch`).
      tx: the optimizer.
      loss_cfg: the coefficients, as Python floats (constants of the program) or float32 scalars (`LossConfig.traced`:
        arguments of a jitted step, one program for every value); only used arithmetically, never branched on.

    Returns:
      (new params, new optimizer state, metrics): loss, grpo_loss, sft_nll, clip_fraction, importance ratio,
      entropy, grad_norm (before clipping), token counts, sampler-vs-trainer mean logprob gap, skipped_nonfinite.
    """
    writer_mask = jnp.zeros_like(batch.insight_mask) if batch.writer_mask is None else batch.writer_mask
    detach = jnp.zeros(batch.advantages.shape, bool) if batch.detach_ratio is None else batch.detach_ratio
    grpo_count = jnp.sum(batch.action_mask).astype(jnp.float32)
    sft_count = jnp.sum(batch.insight_mask).astype(jnp.float32)
    writer_count = jnp.sum(writer_mask).astype(jnp.float32)
    grad_fn = jax.value_and_grad(_micro_loss, has_aux=True)

    def compute(mb):
        return grad_fn(params, graphdef, mb, (grpo_count, sft_count, writer_count), loss_cfg)

    def accumulate(carry, mb):
        grads, loss, aux = carry
        targets = jnp.any(mb["action_mask"] | mb["insight_mask"] | mb["writer_mask"])
        (micro_loss, a), g = jax.lax.cond(targets, compute, lambda _: nothing, mb)
        return (jax.tree.map(jnp.add, grads, g), loss + micro_loss, jax.tree.map(jnp.add, aux, a)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    aux0 = {k: jnp.float32(0) for k in AUX_KEYS}
    micro = {
        "ids": batch.ids,
        "old_logprobs": batch.old_logprobs,
        "advantages": batch.advantages,
        "action_mask": batch.action_mask,
        "insight_mask": batch.insight_mask,
        "writer_mask": writer_mask,
        "detach_ratio": detach,
    }
    if batch.segments is not None:
        micro["segments"] = batch.segments
    # What a micro-batch without targets contributes: zeros shaped like `compute`'s outputs.
    shapes = jax.eval_shape(compute, jax.tree.map(lambda x: x[0], micro))
    nothing = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    (grads, loss, aux), _ = jax.lax.scan(accumulate, (zeros, jnp.float32(0), aux0), micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite loss or gradient (an infinite advantage, a -inf old logprob, an overflow) would make the
    # parameters and AdamW's moments NaN for good: such a step keeps both as they were (a select, so the
    # donated buffers are still updated in place).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    params, opt_state = jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state)
    metrics = {
        "loss": loss,
        "grpo_loss": safe_divide(aux["grpo_sum"], grpo_count),
        "sft_nll": safe_divide(aux["sft_sum"], sft_count),
        "writer_sft_nll": safe_divide(aux["writer_sum"], writer_count),
        "clip_fraction": safe_divide(aux["clipped"], grpo_count),
        "importance_ratio": safe_divide(aux["ratio_sum"], grpo_count),
        "entropy": safe_divide(aux["entropy_sum"], grpo_count),
        "logprob_gap": safe_divide(aux["trainer_logprob_sum"] - aux["sampler_logprob_sum"], grpo_count),
        "grad_norm": grad_norm,
        "grpo_tokens": grpo_count,
        "sft_tokens": sft_count,
        "writer_sft_tokens": writer_count,
        "detached_examples": _detached_examples(detach, batch.action_mask, batch.segments),
        "skipped_nonfinite": (~finite).astype(jnp.float32),
    }
    return params, opt_state, metrics


def _detached_examples(detach: jax.Array, action_mask: jax.Array, segments: jax.Array | None) -> jax.Array:
    """How many examples with GRPO tokens are trained without an importance ratio: rows ([A, M] `detach`), or the
    segments of packed rows ([A, M, T] `detach` and `segments`)."""
    if segments is None:
        return jnp.sum(detach & (jnp.sum(action_mask, -1) > 0)).astype(jnp.float32)
    t = segments.shape[-1]
    rows = jnp.arange(segments.size // t, dtype=jnp.int32).reshape(segments.shape[:-1])[..., None]
    ids = (rows * t + segments).reshape(-1)  # a distinct id per (row, segment)
    hit = jax.ops.segment_max((detach & action_mask).reshape(-1).astype(jnp.int32), ids, num_segments=segments.size)
    return jnp.sum(jnp.maximum(hit, 0)).astype(jnp.float32)
