"""The RLTL;DR objective: hand-computed values and exactness under micro-batching."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rltldr_jax.losses import (
    GRPOTerms,
    SFTTerms,
    group_advantages,
    grpo_loss,
    insight_sft_loss,
    nonzero_advantage_groups,
    positive_ratio_filter,
    rltldr_loss,
)


def test_group_advantages_dr_grpo():
    rewards = [1, 0, 0, 0, 1, 1, 0, 0]
    groups = [0, 0, 0, 0, 7, 7, 7, 7]  # any labels
    np.testing.assert_allclose(group_advantages(rewards, groups), [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    # Interleaved groups and a group of one (advantage 0).
    np.testing.assert_allclose(group_advantages([1.0, 3.0, 2.0, 5.0], [1, 2, 1, 3]), [-0.5, 0.0, 0.5, 0.0])


def test_group_advantages_std_normalized():
    adv = group_advantages([1, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1], std_normalize=True)
    # group 0: sample std of (1,0,0,0) = sqrt(0.75/3) = 0.5; group 1: sqrt(1/3).
    s1 = 0.5 / np.sqrt(1 / 3)
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5, s1, s1, -s1, -s1], rtol=1e-5)
    # A group with equal rewards stays at 0 instead of dividing 0 by 0.
    np.testing.assert_allclose(group_advantages([1, 1, 0], [0, 0, 1], std_normalize=True), [0, 0, 0])


def _log(x):
    return float(np.log(x))


def test_grpo_loss_hand_computed():
    # Row 0: A = +1, ratios (1, 1.5, 0.5, 1.1), first token masked out.
    # Row 1: A = −2, ratios (1.5, 0.5, 1.1, 1.0).
    old = jnp.zeros((2, 4))
    logprobs = jnp.array([[0.0, _log(1.5), _log(0.5), _log(1.1)], [_log(1.5), _log(0.5), _log(1.1), 0.0]])
    mask = jnp.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    terms = grpo_loss(logprobs, old, jnp.array([1.0, -2.0]), mask, clip_eps=0.2)
    # Row 0: −min(1.5, 1.2) − min(0.5, 0.8) − min(1.1, 1.1) = −1.2 − 0.5 − 1.1 = −2.8   (1 clipped: ratio 1.5)
    # Row 1: −min(−3, −2.4) − min(−1, −1.6) − min(−2.2, −2.2) − min(−2, −2) = 3 + 1.6 + 2.2 + 2 = 8.8 (1 clipped: 0.5)
    np.testing.assert_allclose(terms.loss_sum, 6.0, rtol=1e-6)
    assert float(terms.count) == 7
    assert float(terms.clipped) == 2
    np.testing.assert_allclose(terms.ratio_sum, 1.5 + 0.5 + 1.1 + 1.5 + 0.5 + 1.1 + 1.0, rtol=1e-6)


def test_grpo_gradient_vanishes_exactly_on_clipped_tokens():
    old = jnp.zeros((1, 4))
    logprobs = jnp.array([[_log(1.5), _log(0.5), _log(1.5), _log(0.5)]])
    adv = jnp.array([[1.0, 1.0, -1.0, -1.0]])
    grad = jax.grad(lambda lp: grpo_loss(lp, old, adv, jnp.ones((1, 4))).loss_sum)(logprobs)
    # dL/dlogπ = −ρ·A where the unclipped term is active, 0 where the clip is.
    np.testing.assert_allclose(grad, [[0.0, -0.5, 1.5, 0.0]], rtol=1e-6)


def test_grpo_old_logprobs_get_no_gradient():
    grad = jax.grad(lambda old: grpo_loss(jnp.zeros((1, 2)), old, jnp.ones(1), jnp.ones((1, 2))).loss_sum)(
        jnp.zeros((1, 2))
    )
    np.testing.assert_array_equal(grad, 0.0)


def test_detached_rows_train_without_ratio():
    # RLTF-SD rows: ratio 1 whatever the old logprobs (never clipped), gradient −A per token; other rows as PPO.
    old = jnp.array([[0.0, 0.0], [-5.0, -5.0]])
    logprobs = jnp.array([[_log(1.5), _log(1.5)], [_log(1.5), _log(1.5)]])
    adv = jnp.array([1.0, 2.0])
    detach = jnp.array([False, True])
    terms = grpo_loss(logprobs, old, adv, jnp.ones((2, 2)), clip_eps=0.2, detach_ratio=detach)
    # Row 0: clipped at 1.2 → −2.4; row 1: ratio 1 → −2 per token → −4.
    np.testing.assert_allclose(terms.loss_sum, -6.4, rtol=1e-6)
    assert float(terms.clipped) == 2 and float(terms.ratio_sum) == pytest.approx(1.5 * 2 + 2)
    grad = jax.grad(lambda lp: grpo_loss(lp, old, adv, jnp.ones((2, 2)), detach_ratio=detach).loss_sum)(logprobs)
    np.testing.assert_allclose(grad, [[0.0, 0.0], [-2.0, -2.0]], rtol=1e-6)


def test_insight_sft_loss():
    terms = insight_sft_loss(jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]]), jnp.array([[0, 1, 1], [1, 0, 0]]))
    np.testing.assert_allclose(terms.loss_sum, 5.5)
    assert float(terms.count) == 3


def test_rltldr_loss_combines_normalized_terms():
    grpo = GRPOTerms(jnp.float32(6.0), jnp.float32(7.0), jnp.float32(0), jnp.float32(7))
    sft = SFTTerms(jnp.float32(5.0), jnp.float32(2.0))
    np.testing.assert_allclose(rltldr_loss(grpo, sft, lam=0.5), 6 / 7 + 0.5 * 5 / 2, rtol=1e-6)
    np.testing.assert_allclose(rltldr_loss(grpo, sft, lam=0.0), 6 / 7, rtol=1e-6)
    np.testing.assert_allclose(rltldr_loss(grpo, sft, lam=0.5, grpo_coef=0.0), 1.25, rtol=1e-6)
    # Global denominators replace the micro-batch's own counts.
    np.testing.assert_allclose(
        rltldr_loss(grpo, sft, lam=0.5, grpo_count=14, sft_count=10), 6 / 14 + 0.5 * 5 / 10, rtol=1e-6
    )
    # The writer-SFT term of Table 8 (RLTF-FM) adds with its own weight and global count.
    writer = SFTTerms(jnp.float32(3.0), jnp.float32(4.0))
    np.testing.assert_allclose(
        rltldr_loss(grpo, sft, lam=0.5, writer=writer, writer_sft_coef=0.5), 6 / 7 + 1.25 + 0.5 * 3 / 4, rtol=1e-6
    )
    np.testing.assert_allclose(
        rltldr_loss(grpo, sft, lam=0.5, writer=writer, writer_sft_coef=0.5, writer_count=6),
        6 / 7 + 1.25 + 0.25,
        rtol=1e-6,
    )
    # A batch without insight tokens: the SFT term is 0, not NaN.
    no_sft = SFTTerms(jnp.float32(0.0), jnp.float32(0.0))
    np.testing.assert_allclose(rltldr_loss(grpo, no_sft, lam=0.5), 6 / 7, rtol=1e-6)


# --- exactness under gradient accumulation -------------------------------------------------------------

V, D, B, T = 11, 5, 8, 6


def _toy_logprobs(params, ids):
    """A bigram LM: logprobs[b, t] = log p(ids[b, t] | ids[b, t−1]); position 0 gets 0 (never a target)."""
    logits = params["emb"][ids[:, :-1]] @ params["out"]  # [B, T−1, V]
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(lp, ((0, 0), (1, 0)))


@pytest.fixture(scope="module")
def toy_batch():
    rng = np.random.default_rng(0)
    params = {
        "emb": jnp.asarray(rng.normal(size=(V, D)), jnp.float32),
        "out": jnp.asarray(rng.normal(size=(D, V)), jnp.float32),
    }
    ids = jnp.asarray(rng.integers(0, V, size=(B, T)))
    action = rng.random((B, T)) < 0.5
    action[:, 0] = False
    action[3] = False  # an example with no GRPO target
    insight = (rng.random((B, T)) < 0.3) & ~action
    insight[:, 0] = False
    insight[[0, 1, 5]] = False  # examples without insights: token counts differ strongly per micro-batch
    old = _toy_logprobs(params, ids) + jnp.asarray(rng.normal(scale=0.3, size=(B, T)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=B), jnp.float32)
    batch = dict(ids=ids, old=old, adv=adv, action=jnp.asarray(action), insight=jnp.asarray(insight))
    return params, batch


def _loss(params, b, lam, grpo_count=None, sft_count=None):
    lp = _toy_logprobs(params, b["ids"])
    grpo = grpo_loss(lp, b["old"], b["adv"], b["action"], clip_eps=0.2)
    sft = insight_sft_loss(lp, b["insight"])
    return rltldr_loss(grpo, sft, lam=lam, grpo_count=grpo_count, sft_count=sft_count)


def test_micro_batches_give_the_full_batch_loss_and_gradient(toy_batch):
    params, batch = toy_batch
    full_loss, full_grad = jax.value_and_grad(_loss)(params, batch, 0.5)

    grpo_count = float(batch["action"].sum())
    sft_count = float(batch["insight"].sum())
    acc_loss, acc_grad = 0.0, jax.tree.map(jnp.zeros_like, params)
    naive = 0.0
    for i in range(0, B, 2):  # 4 micro-batches of 2
        mb = {k: v[i : i + 2] for k, v in batch.items()}
        loss, grad = jax.value_and_grad(_loss)(params, mb, 0.5, grpo_count, sft_count)
        acc_loss += loss
        acc_grad = jax.tree.map(jnp.add, acc_grad, grad)
        naive += _loss(params, mb, 0.5) / 4  # per-micro-batch means, averaged: the classic bug

    np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(acc_grad[k], full_grad[k], rtol=1e-4, atol=1e-6)
    # The check has teeth: averaging per-micro-batch means is measurably different here.
    assert abs(float(naive) - float(full_loss)) > 1e-2


# --- filters -------------------------------------------------------------------------------------------


def test_nonzero_advantage_groups():
    adv = np.array([0.0, 0.0, 0.5, -0.5, 0.0, 0.0])
    groups = np.array([0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(nonzero_advantage_groups(adv, groups), [False, False, True, True, False, False])


@pytest.mark.parametrize("n_pos,n_neg,kept_neg", [(2, 10, 0), (3, 5, 1), (6, 5, 2), (9, 2, 2), (4, 0, 0), (0, 5, 0)])
def test_positive_ratio_filter_counts(n_pos, n_neg, kept_neg):
    adv = np.array([1.0] * n_pos + [-1.0] * n_neg)
    keep = positive_ratio_filter(adv, 0.75, rng=0)
    assert keep[:n_pos].all()
    assert keep[n_pos:].sum() == kept_neg
    if keep.any():
        assert keep[:n_pos].sum() / keep.sum() >= 0.75


def test_positive_ratio_filter_is_seeded_and_respects_earlier_filters():
    adv = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1, -1, -1, -1, -1, -1, 0.0])
    a = positive_ratio_filter(adv, 0.75, rng=3)
    b = positive_ratio_filter(adv, 0.75, rng=3)
    np.testing.assert_array_equal(a, b)
    assert a.sum() == 8  # 6 positives + floor(6/3) others
    prior = np.ones(13, bool)
    prior[0] = False  # dropped by an earlier filter: stays dropped and no longer counts as a positive
    c = positive_ratio_filter(adv, 0.75, rng=3, keep=prior)
    assert not c[0] and c[1:6].all() and c[6:].sum() == 1
    np.testing.assert_array_equal(positive_ratio_filter(adv, 0.0), np.ones(13, bool))
    with pytest.raises(ValueError, match="min_positive"):
        positive_ratio_filter(adv, 1.0)
