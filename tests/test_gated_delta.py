"""The gated delta rule: parity with transformers' Qwen 3.5 reference, chunked == recurrent, prefill in pieces,
padding tokens, gradients, bf16 inputs and shape errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rltldr_jax.models.gated_delta import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule

B, HK, HV, D = 2, 2, 4, 16

_chunked = jax.jit(chunk_gated_delta_rule, static_argnames=("chunk_size", "use_qk_l2norm"))
_recurrent = jax.jit(recurrent_gated_delta_rule, static_argnames=("use_qk_l2norm",))


# Every keyword is always passed, so that calls with the same shapes reuse one compilation.
def chunked(q, k, v, g, beta, *, initial_state, chunk_size: int = 64, use_qk_l2norm: bool = True):
    return _chunked(q, k, v, g, beta, initial_state=initial_state, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm)


def recurrent(q, k, v, g, beta, *, initial_state, use_qk_l2norm: bool = True):
    return _recurrent(q, k, v, g, beta, initial_state=initial_state, use_qk_l2norm=use_qk_l2norm)


def make_inputs(seed: int, length: int, num_k_heads: int = HK, num_v_heads: int = HV, dim: int = D):
    """float32 numpy (q, k, v, g, beta, initial_state) with Qwen 3.5's parametrization of g and beta."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, length, num_k_heads, dim))
    k = rng.normal(size=(B, length, num_k_heads, dim))
    v = rng.normal(size=(B, length, num_v_heads, dim))
    a = rng.normal(size=(B, length, num_v_heads))
    a_log = np.log(rng.uniform(0.05, 1.0, size=num_v_heads))
    dt_bias = rng.normal(size=num_v_heads)
    g = -np.exp(a_log) * np.logaddexp(0.0, a + dt_bias)  # -exp(A_log) * softplus(a + dt_bias), in about [-3, 0)
    beta = 1 / (1 + np.exp(-rng.normal(size=(B, length, num_v_heads))))
    state = 0.5 * rng.normal(size=(B, num_v_heads, dim, dim))
    return tuple(x.astype(np.float32) for x in (q, k, v, g, beta, state))


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


@functools.cache
def torch_reference():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5.torch_chunk_gated_delta_rule, modeling_qwen3_5.torch_recurrent_gated_delta_rule


@pytest.mark.parametrize(
    "length, num_k_heads, use_qk_l2norm",
    [(150, HK, True), (37, HK, True), (1, HK, True), (70, HV, False)],
)
def test_matches_transformers(length, num_k_heads, use_qk_l2norm):
    import torch

    q, k, v, g, beta, state = make_inputs(0, length, num_k_heads)
    if not use_qk_l2norm:  # keep |k| near 1 so that the recurrence stays stable
        q, k = q / np.sqrt(D), k / np.sqrt(D)
    torch_chunk, torch_recurrent = torch_reference()
    args = [torch.from_numpy(x) for x in (q, k, v, g, beta)]
    kwargs = dict(initial_state=torch.from_numpy(state), output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm)
    o_ref, s_ref = torch_chunk(*args, **kwargs)
    o, s = chunked(q, k, v, g, beta, initial_state=state, use_qk_l2norm=use_qk_l2norm)
    assert o.shape == (B, length, HV, D) and o.dtype == jnp.float32 and s.shape == (B, HV, D, D)
    assert max_abs(o, o_ref.numpy()) <= 1e-5 and max_abs(s, s_ref.numpy()) <= 1e-5

    o_ref, s_ref = torch_recurrent(*args, **kwargs)
    o_rec, s_rec = recurrent(q, k, v, g, beta, initial_state=state, use_qk_l2norm=use_qk_l2norm)
    assert max_abs(o_rec, o_ref.numpy()) <= 1e-5 and max_abs(s_rec, s_ref.numpy()) <= 1e-5

    assert max_abs(o, o_rec) <= 1e-5 and max_abs(s, s_rec) <= 1e-5
    assert float(jnp.max(jnp.abs(o))) > 0.05  # the comparison is not between near-zero outputs


def test_other_chunk_size():
    q, k, v, g, beta, state = make_inputs(1, 150)
    o_rec, s_rec = recurrent(q, k, v, g, beta, initial_state=state)
    o, s = chunked(q, k, v, g, beta, initial_state=state, chunk_size=16)
    assert max_abs(o, o_rec) <= 1e-5 and max_abs(s, s_rec) <= 1e-5


def test_strongly_correlated_keys():
    """Nearly parallel (and alternating-sign) keys with β ≈ 1 and almost no decay stress the UT solve."""
    q, k, v, _, _, state = make_inputs(2, 150)
    rng = np.random.default_rng(3)
    k = (rng.normal(size=(B, 1, HK, D)) + 0.01 * rng.normal(size=k.shape)).astype(np.float32)
    k[:, 1::2] *= -1
    g = np.full((B, 150, HV), -1e-3, np.float32)
    beta = np.full((B, 150, HV), 0.99, np.float32)
    o, s = chunked(q, k, v, g, beta, initial_state=state)
    o_rec, s_rec = recurrent(q, k, v, g, beta, initial_state=state)
    assert max_abs(o, o_rec) <= 1e-5 and max_abs(s, s_rec) <= 2e-5  # measured 7.2e-7 and 3.0e-6


def test_prefill_in_pieces_then_decode():
    """Chunked over [0:188] == chunked over [0:37], then [37:187] from that state, then one recurrent step."""
    inputs = make_inputs(4, 188)
    state = inputs[-1]
    o, s = chunked(*inputs[:5], initial_state=state)
    o1, s1 = chunked(*(x[:, :37] for x in inputs[:5]), initial_state=state)
    o2, s2 = chunked(*(x[:, 37:-1] for x in inputs[:5]), initial_state=s1)
    o3, s3 = recurrent(*(x[:, -1:] for x in inputs[:5]), initial_state=s2)
    assert max_abs(jnp.concatenate([o1, o2, o3], axis=1), o) <= 1e-5 and max_abs(s3, s) <= 1e-5


def test_padding_tokens_leave_the_state_unchanged():
    """Tokens with g = 0 and β = 0 change nothing, whatever their q, k and v."""
    q, k, v, g, beta, state = make_inputs(5, 37)
    pq, pk, pv, _, _, _ = make_inputs(6, 113)
    zeros = np.zeros((B, 113, HV), np.float32)
    for rule in (chunked, recurrent):
        # From any state, a run of padding tokens returns the state bit for bit.
        _, s = rule(pq[:, :37], pk[:, :37], pv[:, :37], zeros[:, :37], zeros[:, :37], initial_state=state)
        np.testing.assert_array_equal(s, state)
        # Appended after real tokens (here filling the rest of the first chunk and two more), they change neither
        # the state nor the real tokens' outputs. Bit-exact in many cases; programs compiled for different lengths
        # may round the real tokens' arithmetic differently (measured 3.3e-7).
        o, s = rule(q, k, v, g, beta, initial_state=state)
        o_padded, s_padded = rule(
            *(np.concatenate(pair, axis=1) for pair in ((q, pq), (k, pk), (v, pv), (g, zeros), (beta, zeros))),
            initial_state=state,
        )
        assert max_abs(s_padded, s) <= 1e-6 and max_abs(o_padded[:, :37], o) <= 1e-6


def test_gradients_match_recurrent():
    q, k, v, g, beta, state = make_inputs(7, 70)
    w = np.random.default_rng(8).normal(size=(B, 70, HV, D)).astype(np.float32)

    def loss(rule, *args):
        o, s = rule(*args[:5], initial_state=args[5])
        return jnp.sum(o * w) + jnp.sum(s)

    argnums = tuple(range(6))
    grads = jax.jit(jax.grad(functools.partial(loss, chunk_gated_delta_rule), argnums))(q, k, v, g, beta, state)
    expected = jax.jit(jax.grad(functools.partial(loss, recurrent_gated_delta_rule), argnums))(q, k, v, g, beta, state)
    for name, got, want in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, expected, strict=False):
        scale = float(jnp.max(jnp.abs(want)))
        assert scale > 0 and max_abs(got, want) <= 1e-4 * scale, name


def test_bf16_inputs():
    q, k, v, g, beta, state = make_inputs(9, 150)
    bf16 = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, g, beta)]
    for rule in (chunked, recurrent):
        o, s = rule(*bf16, initial_state=state)
        assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
        # All math is float32: the result is the float32 one on the upcast inputs, rounded to bf16 (2^-8 relative).
        o32, s32 = rule(*(x.astype(jnp.float32) for x in bf16), initial_state=state)
        np.testing.assert_allclose(np.asarray(o, np.float32), o32, rtol=2**-8, atol=1e-6)
        np.testing.assert_allclose(s, s32, atol=1e-6)
        # Rounding the inputs to bf16 moved outputs (max |o| = 0.5) by 2.0e-3 and states (max 1.65) by 5.0e-3.
        o_exact, s_exact = rule(q, k, v, g, beta, initial_state=state)
        assert max_abs(o, o_exact) <= 5e-3 and max_abs(s, s_exact) <= 1e-2


def test_l2norm():
    x = jnp.asarray([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(l2norm(x), [[3 / np.sqrt(25 + 1e-6), 4 / np.sqrt(25 + 1e-6)], [0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("rule", [chunk_gated_delta_rule, recurrent_gated_delta_rule])
def test_shape_errors(rule):
    q, k, v, g, beta, state = make_inputs(10, 5)
    with pytest.raises(ValueError, match=r"multiple of the number of query/key heads Hk = 3.*q \(2, 5, 3, 16\)"):
        rule(q[:, :, [0, 1, 1]], k[:, :, [0, 1, 1]], v, g, beta)
    with pytest.raises(ValueError, match=r"expected q, k \[B, T, Hk, Dk\].*q \(5, 2, 16\)"):
        rule(q[0], k, v, g, beta)
    with pytest.raises(ValueError, match=r"q and k must have the same shape.*k \(2, 5, 2, 8\)"):
        rule(q, k[..., :8], v, g, beta)
    with pytest.raises(ValueError, match=r"v must be \[B, T, Hv, Dv\] with q's B and T.*v \(2, 4, 4, 16\)"):
        rule(q, k, v[:, :4], g, beta)
    with pytest.raises(ValueError, match=r"g and beta must be \[B, T, Hv\] = \(2, 5, 4\).*beta \(2, 5, 2\)"):
        rule(q, k, v, g, beta[..., :2])
    with pytest.raises(ValueError, match=r"initial_state must be \[B, Hv, Dk, Dv\] = \(2, 4, 16, 16\); got \(4, 16,"):
        rule(q, k, v, g, beta, initial_state=state[0])


def test_chunk_size_must_be_a_power_of_two():
    q, k, v, g, beta, _ = make_inputs(11, 5)
    with pytest.raises(ValueError, match="chunk_size must be a power of 2; got 48"):
        chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=48)
