"""The attention implementations of the Qwen 3.5 gated-attention layers against the reference `causal_attention`.

`blocked_causal_attention` skips key blocks no query of a chunk can see (online softmax over key blocks); it must
give the reference's values and gradients within fp32 rounding for any positions: a full forward, ragged valid
lengths (padding), a prefill into a longer decode cache, under jit and grad. The cuDNN path needs an NVIDIA GPU and
is checked by benchmarks/device.py; here only its selection and its clear refusal on CPU are tested.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rltldr_jax.models import ModelSpec, get_preset, init_decode_state, qwen3_5
from rltldr_jax.models.qwen3_5 import (
    ATTENTION_IMPLS,
    blocked_causal_attention,
    causal_attention,
    cudnn_attention_problem,
    resolve_attention_impl,
    unroll,
    with_attention_impl,
)

B, T, H, KV, D = 3, 150, 4, 2, 16  # GQA 2; T not a multiple of the chunk or block sizes below
LENGTHS = (150, 97, 1)  # ragged valid lengths: row 2 holds a single token


def _qkv(seed: int = 0, t: int = T, s: int = T):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, t, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, s, KV, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, s, KV, D)), jnp.float32)
    return q, k, v


def _valid_positions(lengths=LENGTHS, t: int = T):
    """Positions of right-padded rows: arange for valid tokens; padded keys get a position no query reaches and
    padded queries position 0 (their outputs are ignored, as the model ignores padded rows)."""
    idx = np.arange(t)
    valid = idx[None, :] < np.asarray(lengths)[:, None]
    q_pos = np.where(valid, idx, 0).astype(np.int32)
    k_pos = np.where(valid, idx, 10**6).astype(np.int32)
    return jnp.asarray(valid), jnp.asarray(q_pos), jnp.asarray(k_pos)


@pytest.mark.parametrize("chunk,key_block", [(32, 48), (64, 64), (512, 512)])
def test_blocked_equals_reference_values_and_gradients_with_ragged_lengths(chunk, key_block):
    q, k, v = _qkv()
    valid, q_pos, k_pos = _valid_positions()
    w = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, D)), jnp.float32) * valid[:, :, None, None]

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, q_pos, k_pos) * w)  # only valid queries count

    ref_fn = lambda q, k, v, qp, kp: causal_attention(q, k, v, qp, kp, chunk=64)  # noqa: E731
    blk_fn = lambda q, k, v, qp, kp: blocked_causal_attention(q, k, v, qp, kp, chunk=chunk, key_block=key_block)  # noqa: E731
    ref, got = ref_fn(q, k, v, q_pos, k_pos), jax.jit(blk_fn)(q, k, v, q_pos, k_pos)
    mask = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(ref)[mask], atol=2e-6, rtol=1e-5)
    # Row 2's single valid query sees only its own key: the output is that key's value exactly.
    np.testing.assert_allclose(np.asarray(got)[2, 0], np.repeat(np.asarray(v)[2, 0], H // KV, axis=0), atol=1e-6)

    g_ref = jax.jit(jax.grad(loss(ref_fn), argnums=(0, 1, 2)))(q, k, v)
    g_blk = jax.jit(jax.grad(loss(blk_fn), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g_ref, g_blk, strict=False):
        assert float(jnp.abs(a).max()) > 0.1, name  # the gradients are not trivially zero
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4, err_msg=f"d{name}")
    # Padded keys get no gradient (no valid query sees them).
    assert float(jnp.abs(g_blk[1][1, LENGTHS[1] :]).max()) == 0.0


def test_blocked_prefill_into_a_longer_cache_and_bf16():
    """Queries at lengths[b] + arange(t) against a cache of s slots (keys past a row's end masked): the engine's
    prefill; and bf16 inputs stay within bf16 rounding of the fp32 reference."""
    t, s = 40, 300
    q, k, v = _qkv(seed=2, t=t, s=s)
    start = jnp.asarray([0, 100, 230], jnp.int32)
    q_pos = start[:, None] + jnp.arange(t, dtype=jnp.int32)
    slots = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (B, s))
    ref = causal_attention(q, k, v, q_pos, slots)
    got = jax.jit(lambda *a: blocked_causal_attention(*a, chunk=16, key_block=64))(q, k, v, q_pos, slots)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-6, rtol=1e-5)

    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    got_bf = blocked_causal_attention(*bf, q_pos, slots, chunk=16, key_block=64)
    ref_bf = causal_attention(*bf, q_pos, slots)
    assert got_bf.dtype == jnp.bfloat16
    err_blk = float(jnp.abs(got_bf.astype(jnp.float32) - ref).max())
    err_ref = float(jnp.abs(ref_bf.astype(jnp.float32) - ref).max())
    assert err_blk < 2e-2 and err_blk <= 2 * err_ref + 1e-3, (err_blk, err_ref)


def test_blocked_skips_blocks_nobody_sees():
    """Keys in blocks past every query's position do not influence the result, even if they are NaN: they are
    never computed (a masked-but-computed NaN key would poison the max and the sum)."""
    t, s = 8, 256
    q, k, v = _qkv(seed=3, t=t, s=s)
    k = k.at[:, 64:].set(jnp.nan)
    v = v.at[:, 64:].set(jnp.nan)
    q_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (B, t))
    slots = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (B, s))
    got = blocked_causal_attention(q, k, v, q_pos, slots, chunk=8, key_block=64)
    ref = causal_attention(q[:, :, :, :], k[:, :64], v[:, :64], q_pos, slots[:, :64])
    assert bool(jnp.all(jnp.isfinite(got)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-6, rtol=1e-5)


def test_implementation_choice_and_errors():
    assert resolve_attention_impl("auto", jnp.float32, 256) == "blocked"  # CPU
    assert resolve_attention_impl("xla", jnp.bfloat16, 256) == "xla"
    assert cudnn_attention_problem(jnp.bfloat16, 256, jax.devices("cpu")[0]).startswith("no NVIDIA GPU")
    with pytest.raises(ValueError, match="attention_impl='cudnn' cannot run here: no NVIDIA GPU"):
        resolve_attention_impl("cudnn", jnp.bfloat16, 256)
    with pytest.raises(ValueError, match="attention_impl='flash' is not an attention implementation; choose one of"):
        ModelSpec(get_preset("tiny"), attention_impl="flash").build()
    assert set(ATTENTION_IMPLS) == {"auto", "xla", "blocked", "cudnn"}


@pytest.fixture(scope="module")
def tiny_models():
    """The tiny preset with a 256-id vocabulary, reference and auto (= blocked on CPU) attention, same weights."""
    config = dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ref = ModelSpec(config, attention_impl="xla").build(seed=0)
    auto = ModelSpec(config).build(seed=0)
    return ref, auto


def test_model_forward_grad_and_prefill_match_reference(tiny_models, monkeypatch):
    """The whole model with the default attention (blocked on CPU) against the reference: logits, parameter
    gradients, a ragged prefill into a decode cache and the decode step after it. Blocks of 32 (instead of 256) so
    that 150 tokens span 5 query chunks and 5 key blocks, of which the causal mask skips 10 of 25."""
    monkeypatch.setattr(qwen3_5, "ATTENTION_BLOCK", 32)
    ref, auto = tiny_models
    assert auto.attention_impl == "auto" and unroll(auto).attention_impl == "auto"
    assert with_attention_impl(auto, "xla").attention_impl == "xla"
    ids = jnp.asarray(np.random.default_rng(4).integers(0, 256, (2, 150)), jnp.int32)
    forward = nnx.jit(lambda m, x: m(x))
    np.testing.assert_allclose(np.asarray(forward(auto, ids)), np.asarray(forward(ref, ids)), atol=2e-5)

    grad = nnx.jit(nnx.grad(lambda m, x: jnp.mean(jax.nn.log_softmax(m(x))[..., 0])))
    g_ref, g_auto = jax.tree.leaves(nnx.state(grad(ref, ids))), jax.tree.leaves(nnx.state(grad(auto, ids)))
    assert len(g_ref) == len(g_auto) > 10
    for a, b in zip(g_ref, g_auto, strict=False):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-4)

    # Ragged prefill into a 256-slot decode cache (valid masks), then one decode step: same logits either way.
    valid = jnp.asarray(np.arange(150)[None, :] < np.asarray([150, 61])[:, None])

    @nnx.jit
    def prefill_and_step(model, ids, valid):
        logits, state = model(ids, state=init_decode_state(model.config, 2, 256), valid=valid)
        step, _ = model(ids[:, :1], state=state)
        return logits, step

    (l_ref, s_ref), (l_auto, s_auto) = prefill_and_step(ref, ids, valid), prefill_and_step(auto, ids, valid)
    mask = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(l_auto)[mask], np.asarray(l_ref)[mask], atol=2e-5)
    np.testing.assert_allclose(np.asarray(s_auto), np.asarray(s_ref), atol=2e-5)
