"""The RLTL;DR objective, L = L_GRPO + λ·L_SFT, as pure functions.

Conventions:
- `logprobs[b, t] = log π(ids[b, t] | ids[b, :t])`: per-token log-probabilities aligned with the *target*
  tokens, so the masks of `tokenization.Context` (`action_mask`, `insight_mask`) apply as they are.
- Every loss term returns `(sum, count)`, never a mean. The trainer sums both over micro-batches and devices
  and divides once, by the count of the whole update batch. That makes the value (and the gradient) exact
  under gradient accumulation and data parallelism (the failure mode of trl#3021, ms-swift#10117).
- GRPO is the paper's (eq. 3.1 and A.3): Dr. GRPO advantages (reward minus the group mean, no std), PPO-clip
  with ε = 0.2, token-level (DAPO) aggregation, no KL term.
- L_SFT is the next-token NLL of the insight-sentence tokens in the same contexts (the flipped backprop mask
  of §3.3), with its own token count, so the number of insight tokens does not rescale the GRPO term.
- Not in the paper: a KL-to-reference term (`kl_loss`, Schulman's k3 estimator over the action tokens), the second
  replication round's stabiliser; off unless `loss.terms` lists `kl`.

The train step combines these as data: `loss_terms.LossTerm`s (GRPO, insight SFT, writer SFT and any registered
term), each coef · sum / count over its own mask (`loss_terms.combine`; `rltldr_loss` below is the same sum for the
three built-in terms).

Host-side rollout filters (zero-advantage groups, positive-ratio filtering of A.3.2) are numpy functions:
they choose which rollouts enter the update batch and are not differentiated.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


# ----------------------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------------------


def group_advantages(rewards: Array, group_ids: Array, std_normalize: bool = False, eps: float = 1e-6) -> Array:
    """Group-relative advantages: each reward minus the mean reward of its group.

    Dr. GRPO (the paper's default): A_k = r_k − mean_{i ∈ group(k)} r_i. With `std_normalize` (the
    "GRPO-style std normalization" ablation of Table 9) the result is divided by the group's sample standard
    deviation (ddof = 1, as torch.std in TRL and verl) plus `eps`; a group of one has advantage 0.

    Args:
      rewards: [N] float rewards of N rollouts.
      group_ids: [N] int group (task) of each rollout; any integer labels.
      std_normalize: divide by the group's reward std.
      eps: added to the std before dividing.

    Returns:
      [N] float32 advantages.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    group_ids = jnp.asarray(group_ids)
    same = (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)  # [N, N]
    size = same.sum(axis=1)
    mean = same @ rewards / size
    advantages = rewards - mean
    if std_normalize:
        var = same @ (rewards**2) / size - mean**2
        std = jnp.sqrt(jnp.maximum(var, 0.0) * size / jnp.maximum(size - 1.0, 1.0))
        advantages = advantages / (std + eps)
    return advantages


# ----------------------------------------------------------------------------------------------------
# Loss terms, each (sum, count)
# ----------------------------------------------------------------------------------------------------


class GRPOTerms(NamedTuple):
    """Sums over the masked tokens of a micro-batch; divide by the global `count` after reduction."""

    loss_sum: Array  #: Σ −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)
    count: Array  #: number of action tokens
    clipped: Array  #: tokens whose gradient the clip zeroes (ρ > 1+ε with A > 0, or ρ < 1−ε with A < 0)
    ratio_sum: Array  #: Σ ρ, for the mean importance ratio


class SFTTerms(NamedTuple):
    loss_sum: Array  #: Σ −log π(insight token | prefix)
    count: Array  #: number of insight tokens


def grpo_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    action_mask: Array,
    clip_eps: float | Array = 0.2,
    detach_ratio: Array | None = None,
) -> GRPOTerms:
    """PPO-clip surrogate of GRPO, summed over action tokens (token-level aggregation, no KL).

    Args:
      logprobs: [B, T] log π_θ of the target tokens under the current parameters.
      old_logprobs: [B, T] log π_old of the same tokens (the sampler's logprobs).
      advantages: [B] per-rollout advantages (broadcast over tokens) or [B, T] per-token.
      action_mask: [B, T] bool/0-1, the tokens sampled in the example's step.
      clip_eps: ε of the clip (a Python float or a traced scalar).
      detach_ratio: optional [B] bool (or [B, T] per token, packed rows): rows trained without an importance ratio
        (RLTF-SD's advantage-weighted likelihood): their old logprobs are the current ones, detached, so the ratio
        is 1 (never clipped) and the gradient is −A·∇log π_θ.

    Returns:
      `GRPOTerms` of scalar sums; the loss contribution is `loss_sum / global_count`.
    """
    mask = jnp.asarray(action_mask, jnp.float32)
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    if detach_ratio is not None:
        detach = jnp.asarray(detach_ratio, bool)
        detach = detach[:, None] if detach.ndim == 1 else detach
        old_logprobs = jnp.where(detach, jax.lax.stop_gradient(logprobs), old_logprobs)
    ratio = jnp.exp(logprobs.astype(jnp.float32) - jax.lax.stop_gradient(old_logprobs).astype(jnp.float32))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -jnp.minimum(unclipped, clipped)
    is_clipped = ((ratio > 1.0 + clip_eps) & (advantages > 0)) | ((ratio < 1.0 - clip_eps) & (advantages < 0))
    return GRPOTerms(
        loss_sum=jnp.sum(per_token * mask),
        count=jnp.sum(mask),
        clipped=jnp.sum(is_clipped * mask),
        ratio_sum=jax.lax.stop_gradient(jnp.sum(ratio * mask)),
    )


def insight_sft_loss(logprobs: Array, insight_mask: Array) -> SFTTerms:
    """Next-token NLL of the insight tokens (L_SFT), summed.

    Args:
      logprobs: [B, T] log π_θ of the target tokens.
      insight_mask: [B, T] bool/0-1, the insight-sentence tokens.
    """
    mask = jnp.asarray(insight_mask, jnp.float32)
    return SFTTerms(loss_sum=-jnp.sum(logprobs.astype(jnp.float32) * mask), count=jnp.sum(mask))


class KLTerms(NamedTuple):
    """Sums over the masked tokens of a micro-batch; divide by the global `count` after reduction."""

    loss_sum: Array  #: Σ k3 = Σ exp(r) − r − 1, r = log π_ref − log π_θ
    count: Array  #: number of masked tokens
    k1_sum: Array  #: Σ −r = Σ log π_θ − log π_ref (the plain k1 estimate of the same KL, for monitoring)


def kl_loss(logprobs: Array, ref_logprobs: Array, mask: Array) -> KLTerms:
    """Schulman's k3 estimate of KL(π_θ || π_ref), summed over the masked tokens (not in the paper: Dr. GRPO has no
    KL term; the second replication round's stabiliser, `loss_terms` term "kl").

    Per token, with r = log π_ref(y) − log π_θ(y) of the sampled token y: k3 = exp(r) − r − 1 (computed as
    expm1(r) − r). It is ≥ 0, exactly 0 when the two logprobs are equal, and its mean over samples of π_θ is the KL
    (unbiased; the samples here come from π_old ≈ π_θ). Its gradient in log π_θ is 1 − exp(r): 0 at r = 0.

    Args:
      logprobs: [B, T] log π_θ of the target tokens (differentiated).
      ref_logprobs: [B, T] log π_ref of the same tokens (a constant: never differentiated).
      mask: [B, T] bool/0-1, the tokens the term covers (the action tokens).

    Returns:
      `KLTerms` of scalar sums; the loss contribution is `loss_sum / global_count`.
    """
    m = jnp.asarray(mask, jnp.float32)
    ref = jax.lax.stop_gradient(jnp.asarray(ref_logprobs, jnp.float32))
    r = jnp.where(m > 0, ref - logprobs.astype(jnp.float32), 0.0)  # 0 off the mask: no exp of a padding value
    k3 = jnp.expm1(r) - r
    return KLTerms(loss_sum=jnp.sum(k3 * m), count=jnp.sum(m), k1_sum=jax.lax.stop_gradient(-jnp.sum(r * m)))


def safe_divide(total: Array, count: Array) -> Array:
    """total / count, and 0 where count is 0 (a term with no tokens in the whole batch contributes nothing)."""
    count = jnp.asarray(count, jnp.float32)
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)


def rltldr_loss(
    grpo: GRPOTerms,
    sft: SFTTerms,
    *,
    lam: float | Array,
    grpo_count: Array | float | None = None,
    sft_count: Array | float | None = None,
    grpo_coef: float | Array = 1.0,
    writer: SFTTerms | None = None,
    writer_sft_coef: float | Array = 0.0,
    writer_count: Array | float | None = None,
) -> Array:
    """L = grpo_coef · grpo_sum / grpo_count + λ · sft_sum / sft_count [+ writer_sft_coef · writer_sum / writer_count].

    The counts are those of the *whole update batch* (all micro-batches and devices). They are known from the
    masks before any forward pass, so each micro-batch can be scaled by them and the summed gradients are
    exactly those of the whole batch. With counts None, the terms' own counts are used (one micro-batch).

    Args:
      grpo, sft: the terms of this micro-batch (or of the reduced batch).
      lam: λ, the insight internalisation strength (0.5 in the paper). The coefficients may be traced scalars (the
        trainer passes them so: one compiled step for every value); they are never branched on.
      grpo_count, sft_count: global token counts of the two terms.
      grpo_coef: weight of the GRPO term (1 in the paper; 0 for the "no GRPO, only L_SFT" row of Table 2).
      writer, writer_sft_coef, writer_count: the optional insight-generator SFT term of Table 8 (RLTF-FM, π(f | τ): the
        insight tokens in the insight writer's own context), its weight and global count.

    Returns:
      A scalar float32 loss.
    """
    g = grpo.count if grpo_count is None else grpo_count
    s = sft.count if sft_count is None else sft_count
    loss = grpo_coef * safe_divide(grpo.loss_sum, g) + lam * safe_divide(sft.loss_sum, s)
    if writer is not None:
        loss = loss + writer_sft_coef * safe_divide(
            writer.loss_sum, writer.count if writer_count is None else writer_count
        )
    return loss


# ----------------------------------------------------------------------------------------------------
# Rollout filters (host side)
# ----------------------------------------------------------------------------------------------------


def nonzero_advantage_groups(advantages: np.ndarray, group_ids: np.ndarray, atol: float = 1e-8) -> np.ndarray:
    """[N] bool: rollouts whose group has at least one non-zero advantage (all-equal-reward groups carry no
    GRPO signal and are dropped, A.3.2)."""
    advantages = np.asarray(advantages, np.float64)
    group_ids = np.asarray(group_ids)
    nonzero = np.abs(advantages) > atol
    keep_group = {g for g in np.unique(group_ids) if nonzero[group_ids == g].any()}
    return np.array([g in keep_group for g in group_ids], dtype=bool)


def positive_ratio_filter(
    advantages: np.ndarray,
    min_positive: float = 0.75,
    rng: np.random.Generator | int | None = 0,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """Positive-ratio filtering (A.3.2): keep every positive-advantage rollout and a random subset of the
    others, so that at least `min_positive` of the kept rollouts have a positive advantage.

    On very hard tasks most advantages are negative; without this, GRPO mostly pushes likelihood down and
    entropy up. With p positives, at most floor(p·(1−r)/r) non-positives are kept (r = `min_positive`); if
    there is no positive rollout, nothing is kept. `min_positive` = 0 disables the filter.

    Args:
      advantages: [N] per-rollout advantages.
      min_positive: r ∈ [0, 1).
      rng: a numpy Generator or a seed, for which non-positive rollouts are kept.
      keep: optional [N] bool of rollouts already kept by earlier filters; others stay dropped.

    Returns:
      [N] bool mask of kept rollouts.
    """
    if not 0.0 <= min_positive < 1.0:
        raise ValueError(f"min_positive must be in [0, 1), got {min_positive}")
    advantages = np.asarray(advantages, np.float64)
    keep = np.ones(advantages.shape, bool) if keep is None else np.asarray(keep, bool).copy()
    if min_positive == 0.0:
        return keep
    positive = keep & (advantages > 0)
    others = np.flatnonzero(keep & ~(advantages > 0))
    n_pos = int(positive.sum())
    # Largest m with n_pos / (n_pos + m) >= r, computed in integers to avoid rounding at the boundary.
    max_others = int(np.floor(n_pos * (1.0 - min_positive) / min_positive + 1e-9))
    if len(others) > max_others:
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        dropped = rng.choice(others, size=len(others) - max_others, replace=False)
        keep[dropped] = False
    return keep
