"""Decode throughput: JaxEngine vs transformers `generate` on the same small Qwen 3.5 and batch, on CPU.

    python benchmarks/engine.py

Both generate `NEW` tokens for `BATCH` prompts of `PROMPT` tokens with sampling at temperature 1 (no stop
token), after a warm-up run; the script prints tokens/s of each and the ratio (goal: ours >= 2x).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams
from common import small_models

BATCH, PROMPT, NEW = 8, 64, 64


def main() -> None:
    cfg, hf, ours = small_models()
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (BATCH, PROMPT))

    def run_hf() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(torch.from_numpy(prompts), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0)  # fmt: skip
        assert out.shape == (BATCH, PROMPT + NEW)
        return time.perf_counter() - start

    with JaxEngine(ours, max_batch=BATCH, max_len=PROMPT + NEW) as engine:

        def run_ours() -> float:
            requests = [GenerationRequest(tuple(p), SamplingParams(max_new_tokens=NEW, seed=i)) for i, p in enumerate(prompts.tolist())]
            start = time.perf_counter()
            results = engine.generate_many(requests)
            assert all(len(r.token_ids) == NEW for r in results)
            return time.perf_counter() - start

        run_ours(), run_hf()  # warm-up (compilation, caches)
        ours_s = min(run_ours() for _ in range(2))
        hf_s = min(run_hf() for _ in range(2))
    tokens = BATCH * NEW
    print(f"batch {BATCH}, prompt {PROMPT}, {NEW} new tokens each: transformers {tokens / hf_s:.0f} tok/s, "
          f"JaxEngine {tokens / ours_s:.0f} tok/s, ratio {hf_s / ours_s:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
