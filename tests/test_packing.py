"""Sequence packing (`batch.pack_rows`): several examples in one row, each computed as if it were alone.

The gated delta rule, the model's logprobs and a whole train step on packed rows are compared with the same
sequences one per row; `pack` is checked against a layout worked out by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rltldr_jax.agent.step_examples import Example
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.models.gated_delta import chunk_gated_delta_rule
from rltldr_jax.models.qwen3_5 import segment_positions, sequence_logprobs, unroll, with_attention_impl
from rltldr_jax.train.batching import pack
from rltldr_jax.train.step import LossConfig, make_optimizer, train_step

# Sequence boundaries of the packed rows: a 1-token sequence, one across a 64-token chunk boundary, one that ends
# exactly on one, and padding after the last.
CUTS = ([0, 30, 64, 100, 150], [0, 64, 128, 129, 150])


def _segments(cuts_per_row, length):
    seg = np.zeros((len(cuts_per_row), length), np.int32)
    for row, cuts in enumerate(cuts_per_row):
        for i in range(len(cuts) - 1):
            seg[row, cuts[i] : cuts[i + 1]] = i + 1
    return seg


def test_segment_positions():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 2, 0, 1, 0, 0, 1]])


def test_delta_rule_packed_equals_each_sequence_alone():
    r = np.random.default_rng(0)
    b, t = 2, 160
    q, k = (jnp.asarray(r.normal(size=(b, t, 2, 16)), jnp.float32) for _ in range(2))
    v = jnp.asarray(r.normal(size=(b, t, 4, 16)), jnp.float32)
    g = -0.1 * jnp.abs(jnp.asarray(r.normal(size=(b, t, 4)), jnp.float32))
    beta = jax.nn.sigmoid(jnp.asarray(r.normal(size=(b, t, 4)), jnp.float32))
    seg = _segments(CUTS, t)  # the tokens after 150 are a padding segment (0)
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, segments=jnp.asarray(seg))
    for row, cuts in enumerate(CUTS):
        for start, end in zip(cuts[:-1], cuts[1:], strict=True):
            alone, _ = chunk_gated_delta_rule(*(x[row : row + 1, start:end] for x in (q, k, v, g, beta)))
            np.testing.assert_allclose(out[row, start:end], alone[0], atol=2e-6)
        _, last_state = chunk_gated_delta_rule(*(x[row : row + 1, 150:] for x in (q, k, v, g, beta)))
        np.testing.assert_allclose(state[row], last_state[0], atol=2e-6)  # the final state is the last segment's
    # One segment is the unsegmented rule.
    plain = chunk_gated_delta_rule(q, k, v, g, beta)
    single = chunk_gated_delta_rule(q, k, v, g, beta, segments=jnp.ones((b, t), jnp.int32))
    for a, c in zip(plain, single, strict=True):
        np.testing.assert_allclose(a, c, atol=1e-6)


@pytest.fixture(scope="module")
def small_model():
    return ModelSpec(get_preset("replicate_xs"), dtype=jnp.float32, param_dtype=jnp.float32).build(seed=0)


@pytest.mark.parametrize("impl", ["xla", "blocked"])
def test_model_logprobs_packed_equal_alone(small_model, impl):
    model = with_attention_impl(small_model, impl)
    r = np.random.default_rng(1)
    t = 300
    cuts = [0, 70, 200, 201, 290]  # then 10 padding tokens
    ids = r.integers(1, 512, (1, t)).astype(np.int32)
    seg = jnp.asarray(_segments([cuts], t))
    lp, ent = sequence_logprobs(model, jnp.asarray(ids), chunk=128, segments=seg)
    for start, end in zip(cuts[:-1], cuts[1:], strict=True):
        alone_lp, alone_ent = sequence_logprobs(model, jnp.asarray(ids[:, start:end]), chunk=128)
        # Position `start` is "predicted" from the previous segment: no loss reads it.
        np.testing.assert_allclose(lp[0, start + 1 : end], alone_lp[0, 1:], atol=5e-6)
        np.testing.assert_allclose(ent[0, start + 1 : end], alone_ent[0, 1:], atol=5e-6)
    # The unrolled twin (the engine's layout) takes segments too.
    h_stacked, _ = model.hidden_states(jnp.asarray(ids), segments=seg)
    h_unrolled, _ = unroll(model).hidden_states(jnp.asarray(ids), segments=seg)
    np.testing.assert_allclose(h_stacked, h_unrolled, atol=1e-5)


def _example(r, n, *, advantage, detach=False, insight=False):
    ids = r.integers(1, 512, n).astype(np.int32)
    action = np.zeros(n, bool)
    action[n // 2 :] = True
    insight_mask = np.zeros(n, bool)
    if insight:
        insight_mask[3:8] = True
    return Example(
        ids=ids,
        old_logprobs=-r.uniform(4, 8, n).astype(np.float32),
        action_mask=action,
        insight_mask=insight_mask,
        advantage=advantage,
        task_id="t",
        attempt=0,
        step=0,
        detach_ratio=detach,
    )


def test_pack_layout_by_hand():
    r = np.random.default_rng(2)
    lengths = [40, 100, 30, 90, 20]
    examples = [_example(r, n, advantage=float(i)) for i, n in enumerate(lengths)]
    (batch,) = pack(examples, micro_batch_size=3, grad_accum_steps=2, pad_to_multiple=64, max_len=128, pack_rows=2)
    # 6 examples per step -> 3 micro-batches of 2 rows of 128; first-fit decreasing: 100 -> row 0, 90 -> row 1,
    # 40 -> row 2 (no room before), 30 -> row 1 (120), 20 -> row 0 (120).
    assert batch.ids.shape == (3, 2, 128)
    rows = np.asarray(batch.ids).reshape(6, 128)
    seg = np.asarray(batch.segments).reshape(6, 128)
    adv = np.asarray(batch.advantages).reshape(6, 128)
    np.testing.assert_array_equal(rows[0, :100], examples[1].ids)
    np.testing.assert_array_equal(rows[0, 100:120], examples[4].ids)
    np.testing.assert_array_equal(rows[1, :90], examples[3].ids)
    np.testing.assert_array_equal(rows[1, 90:120], examples[2].ids)
    np.testing.assert_array_equal(rows[2, :40], examples[0].ids)
    assert list(np.unique(seg[0], return_counts=True)[1]) == [8, 100, 20]  # segments 0 (padding), 1, 2
    assert seg[1, 89] == 1 and seg[1, 90] == 2 and seg[1, 120] == 0 and seg[2, 39] == 1 and seg[2, 40] == 0
    assert not seg[3:].any() and not np.asarray(batch.action_mask).reshape(6, 128)[3:].any()
    assert adv[0, 99] == 1.0 and adv[0, 100] == 4.0 and adv[1, 95] == 2.0 and adv[2, 0] == 0.0
    with pytest.raises(ValueError, match="packed row length 128"):
        pack(
            [_example(r, 129, advantage=0.0)],
            micro_batch_size=1,
            grad_accum_steps=1,
            pad_to_multiple=64,
            max_len=200,
            length_buckets=(64, 128),
            pack_rows=1,
        )


@pytest.mark.parametrize("rows", [1, 2])
def test_train_step_packed_equals_one_example_per_row(small_model, rows):
    r = np.random.default_rng(3)
    cases = [(90, 1.0, False, True), (60, -0.5, False, False), (130, 0.25, True, True), (20, 2.0, False, False)]
    cases.append((75, -1.0, False, True))
    examples = [_example(r, n, advantage=a, detach=d, insight=s) for n, a, d, s in cases]
    common = dict(micro_batch_size=3, grad_accum_steps=2, pad_to_multiple=64, max_len=256)
    (plain,) = pack(examples, **common)
    (packed,) = pack(examples, **common, pack_rows=rows)
    assert packed.ids.shape == (6 // rows, rows, 256) and plain.ids.shape == (2, 3, 192)
    tx = make_optimizer(1.0, name="sgd", grad_clip_norm=0.0)  # new params = params - gradient
    graphdef, params = nnx.split(small_model)
    opt = tx.init(params)
    cfg = LossConfig(lam=0.5).traced()
    step = jax.jit(lambda p, o, b: train_step(graphdef, p, o, b, tx=tx, loss_cfg=cfg))
    p1, _, m1 = step(params, opt, plain)
    p2, _, m2 = step(params, opt, packed)
    for key in ("loss", "grpo_loss", "sft_nll", "grad_norm", "importance_ratio", "entropy", "grpo_tokens"):
        np.testing.assert_allclose(m2[key], m1[key], rtol=2e-5, atol=1e-6, err_msg=key)
    assert float(m1["detached_examples"]) == float(m2["detached_examples"]) == 1.0
    for before, a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(before - b, before - a, rtol=1e-3, atol=2e-6)  # the gradients
