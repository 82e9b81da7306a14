"""Full Qwen 3.5 forward: ours (jitted JAX) vs transformers (torch fallback kernels) on CPU, same weights.

    python benchmarks/forward.py

A small random Qwen 3.5 (2 blocks of 3 × DeltaNet + 1 × attention, real head layout, reduced width and
vocabulary) is saved by transformers and loaded by `load_pretrained`; both run the same ids in fp32 and
the script prints the time of each, their ratio (torch / ours; > 1 means ours is faster) and the max |Δ|.

Ours runs twice: with its default attention (`attention_impl="auto"`, on CPU the block-skipping
`blocked_causal_attention`) and with the reference `causal_attention` ("xla", which computes every query against
every key and masks); the last column is their ratio, which a loaded machine disturbs less than the torch ratio
(torch's threads suffer more from sharing cores).
"""

from __future__ import annotations

import jax
import numpy as np
import torch
from common import best_of, small_models

from rltldr_jax.models.qwen3_5 import resolve_attention_impl, with_attention_impl

SHAPES = [(1, 1024), (4, 512), (1, 4096)]  # (batch, tokens)


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg, hf, ours = small_models()
    reference = with_attention_impl(ours, "xla")
    forward = jax.jit(lambda m, x: m(x))
    impl = resolve_attention_impl(ours.attention_impl, ours.dtype, cfg.head_dim)
    print(
        f"config: hidden {cfg.hidden_size}, 8 layers (6 DeltaNet + 2 attention), vocab {cfg.vocab_size}; "
        f"torch threads {torch.get_num_threads()}, jax devices {jax.devices()}; our attention: {impl}"
    )
    for b, t in SHAPES:
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
        x = torch.from_numpy(ids.astype(np.int64))
        with torch.no_grad():
            ref = hf(x).logits.numpy()
            got = np.asarray(forward(ours, ids))  # compiles
            hf_s, ours_s, xla_s = best_of(
                [
                    lambda x=x: hf(x),
                    lambda ids=ids: forward(ours, ids).block_until_ready(),
                    lambda ids=ids: forward(reference, ids).block_until_ready(),
                ],
                repeat=3,
            )
        print(
            f"B={b} T={t}: transformers {hf_s * 1e3:.0f} ms, ours {ours_s * 1e3:.0f} ms ({impl}), ratio "
            f"{hf_s / ours_s:.2f}x, max |Δ logits| {np.abs(got - ref).max():.1e}; ours with reference attention "
            f"{xla_s * 1e3:.0f} ms (ratio {hf_s / xla_s:.2f}x); {impl} / reference speed-up {xla_s / ours_s:.2f}x"
        )


if __name__ == "__main__":
    main()
