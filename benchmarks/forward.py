"""Full Qwen 3.5 forward: ours (jitted JAX) vs transformers (torch fallback kernels) on CPU, same weights.

    python benchmarks/forward.py

A small random Qwen 3.5 (2 blocks of 3 × DeltaNet + 1 × attention, real head layout, reduced width and
vocabulary) is saved by transformers and loaded by `load_pretrained`; both run the same ids in fp32 and
the script prints the time of each, their ratio (torch / ours; > 1 means ours is faster) and the max |Δ|.
"""

from __future__ import annotations


import jax
import numpy as np
import torch

from common import best_of, small_models

SHAPES = [(1, 1024), (4, 512), (1, 4096)]  # (batch, tokens)


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg, hf, ours = small_models()
    forward = jax.jit(lambda m, x: m(x))
    print(f"config: hidden {cfg.hidden_size}, 8 layers (6 DeltaNet + 2 attention), vocab {cfg.vocab_size}; "
          f"torch threads {torch.get_num_threads()}, jax devices {jax.devices()}")  # fmt: skip
    for b, t in SHAPES:
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
        x = torch.from_numpy(ids.astype(np.int64))
        with torch.no_grad():
            ref = hf(x).logits.numpy()
            got = np.asarray(forward(ours, ids))  # compiles
            hf_s, ours_s = best_of([lambda: hf(x), lambda: forward(ours, ids).block_until_ready()], repeat=3)
        print(f"B={b} T={t}: transformers {hf_s * 1e3:.0f} ms, ours {ours_s * 1e3:.0f} ms, "
              f"ratio {hf_s / ours_s:.2f}x, max |Δ logits| {np.abs(got - ref).max():.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
