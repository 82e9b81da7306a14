"""The gated delta rule on CPU: our jitted `chunk_gated_delta_rule` vs transformers' `torch_chunk_gated_delta_rule`.

    python benchmarks/delta_rule.py

Both run on the same random float32 inputs with Qwen 3.5's settings (L2-normalized q and k, chunk size 64, a non-zero
initial state); torch with all cores, under `torch.no_grad()` for the forward. Each timing is the best of several
runs after warm-up, ours and torch's taking turns. Prints, per shape, the forward and forward+backward (gradients of
sum(o * w) with respect to q, k, v, g and beta) times with the ratio torch / ours, and how far apart the results are.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of

from rltldr_jax.models.gated_delta import chunk_gated_delta_rule

# (B, T, Hk, Hv, D): a long prefill of a small layer, and a batch of shorter ones with Qwen 3.5's 16 / 32 heads.
SHAPES = [(1, 2048, 4, 8, 128), (4, 512, 16, 32, 128)]


def _inputs(rng: np.random.Generator, batch: int, length: int, k_heads: int, v_heads: int, dim: int):
    """float32 (q, k, v, g, beta, initial_state, w) with Qwen 3.5's parametrization of g and beta; w weights o."""
    q, k = rng.normal(size=(2, batch, length, k_heads, dim))
    v = rng.normal(size=(batch, length, v_heads, dim))
    a_log = np.log(rng.uniform(0.05, 1.0, size=v_heads))
    g = -np.exp(a_log) * np.logaddexp(0.0, rng.normal(size=(batch, length, v_heads)))
    beta = 1 / (1 + np.exp(-rng.normal(size=(batch, length, v_heads))))
    state = 0.5 * rng.normal(size=(batch, v_heads, dim, dim))
    w = rng.normal(size=(batch, length, v_heads, dim))
    return tuple(x.astype(np.float32) for x in (q, k, v, g, beta, state, w))


def main() -> None:
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    print(f"CPU, {cores} cores; jax {jax.__version__}, torch {torch.__version__}")

    forward = jax.jit(chunk_gated_delta_rule)

    @jax.jit
    def gradients(q, k, v, g, beta, state, w):
        def loss(q, k, v, g, beta):
            return jnp.sum(chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state)[0] * w)

        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta)

    rng = np.random.default_rng(0)
    for batch, length, k_heads, v_heads, dim in SHAPES:
        arrays = _inputs(rng, batch, length, k_heads, v_heads, dim)
        ours_in = [jnp.asarray(x) for x in arrays]
        q, k, v, g, beta, state, w = ours_in
        theirs_in = [torch.from_numpy(x) for x in arrays]
        kwargs = dict(initial_state=theirs_in[5], output_final_state=True, use_qk_l2norm_in_kernel=True)

        def torch_forward(theirs_in=theirs_in, kwargs=kwargs):
            with torch.no_grad():
                return torch_chunk_gated_delta_rule(*theirs_in[:5], **kwargs)

        def torch_gradients(theirs_in=theirs_in, kwargs=kwargs):
            leaves = [x.clone().requires_grad_() for x in theirs_in[:5]]
            o, _ = torch_chunk_gated_delta_rule(*leaves, **kwargs)
            o.backward(theirs_in[6])
            return [x.grad for x in leaves]

        o, s = forward(q, k, v, g, beta, initial_state=state)
        o_ref, s_ref = torch_forward()
        grads, grads_ref = gradients(*ours_in), torch_gradients()
        grad_error = max(
            float(np.max(np.abs(np.asarray(a) - b.numpy())) / np.max(np.abs(b.numpy())))
            for a, b in zip(grads, grads_ref, strict=True)
        )

        ours, theirs = best_of(
            [
                lambda q=q, k=k, v=v, g=g, beta=beta, state=state: jax.block_until_ready(
                    forward(q, k, v, g, beta, initial_state=state)
                ),
                torch_forward,
            ],
            repeat=10,
        )
        ours_grad, theirs_grad = best_of(
            [lambda ours_in=ours_in: jax.block_until_ready(gradients(*ours_in)), torch_gradients], repeat=5
        )
        print(
            f"B={batch} T={length} Hk={k_heads} Hv={v_heads} D={dim}: "
            f"forward ours {ours * 1e3:.0f} ms, torch {theirs * 1e3:.0f} ms, ratio torch/ours = {theirs / ours:.2f}x; "
            f"forward+backward ours {ours_grad * 1e3:.0f} ms, torch {theirs_grad * 1e3:.0f} ms, "
            f"ratio = {theirs_grad / ours_grad:.2f}x; max |Δ| o {np.max(np.abs(np.asarray(o) - o_ref.numpy())):.1e}, "
            f"state {np.max(np.abs(np.asarray(s) - s_ref.numpy())):.1e}, max relative Δ of gradients {grad_error:.1e}"
        )


if __name__ == "__main__":
    main()
