"""Decode throughput and prefix reuse of the JaxEngine vs transformers `generate`, same small Qwen 3.5, on CPU.

    python benchmarks/engine.py

Decode: `BATCH` prompts of `PROMPT` tokens, `NEW` tokens each, sampled at temperature 1 (no stop token), by our
engine with float32 weights, with bfloat16 weights (`weights_dtype="bfloat16"`) and by transformers (float32),
taking turns (best of `REPEAT` after a warm-up); prints tokens/s and each ratio to transformers (goal: >= 2x), and
the bfloat16 engine's logprob gap: the mean over its sampled tokens of (float32 teacher-forced logprob - engine
logprob), what the trainer logs as first_minibatch/logprob_gap.

Prefix reuse: `K` requests share one `SHARED`-token prompt (the attempts of one task), `PREFIX_NEW` new tokens each;
the engine with and without its prefix cache (a fresh random prompt each round, so every round starts cold).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from common import best_of, small_models

from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams
from rltldr_jax.models import sequence_logprobs

BATCH, PROMPT, NEW, REPEAT = 8, 64, 64, 2
K, SHARED, PREFIX_NEW = 8, 1024, 16


def decode(cfg, hf, ours) -> None:
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (BATCH, PROMPT))
    requests = [
        GenerationRequest(tuple(p), SamplingParams(max_new_tokens=NEW, seed=i)) for i, p in enumerate(prompts.tolist())
    ]

    def run_hf() -> None:
        with torch.no_grad():
            out = hf.generate(
                torch.from_numpy(prompts),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                pad_token_id=0,
            )
        assert out.shape == (BATCH, PROMPT + NEW)

    fp32 = JaxEngine(ours, max_batch=BATCH, max_len=PROMPT + NEW)
    bf16 = JaxEngine(ours, max_batch=BATCH, max_len=PROMPT + NEW, weights_dtype="bfloat16")
    results = {}

    def run(engine: JaxEngine, name: str) -> None:
        results[name] = engine.generate_many(requests)
        assert all(len(r.token_ids) == NEW for r in results[name])

    try:
        fp32_s, bf16_s, hf_s = best_of([lambda: run(fp32, "fp32"), lambda: run(bf16, "bf16"), run_hf], REPEAT)
    finally:
        fp32.close()
        bf16.close()
    forward = jax.jit(lambda m, x: sequence_logprobs(m, x)[0])
    ids = jnp.asarray([[*p, *r.token_ids] for p, r in zip(prompts.tolist(), results["bf16"], strict=True)])
    teacher = np.asarray(forward(ours, ids))[:, PROMPT:]
    gap = float(np.mean(teacher - np.asarray([r.logprobs for r in results["bf16"]])))
    tokens = BATCH * NEW
    print(
        f"decode, batch {BATCH}, prompt {PROMPT}, {NEW} new tokens each: transformers {tokens / hf_s:.0f} tok/s; "
        f"JaxEngine fp32 {tokens / fp32_s:.0f} tok/s ({hf_s / fp32_s:.2f}x), bf16 weights {tokens / bf16_s:.0f} tok/s "
        f"({hf_s / bf16_s:.2f}x; {fp32_s / bf16_s:.2f}x fp32); bf16 logprob gap {gap:+.4f} nats/token"
    )


def prefix(cfg, ours) -> None:
    rng = np.random.default_rng(1)

    def run(engine: JaxEngine) -> None:
        prompt = tuple(rng.integers(0, cfg.vocab_size, SHARED).tolist())
        results = engine.generate_many(
            [GenerationRequest(prompt, SamplingParams(max_new_tokens=PREFIX_NEW, seed=i)) for i in range(K)]
        )
        assert all(len(r.token_ids) == PREFIX_NEW for r in results)

    plain = JaxEngine(ours, max_batch=K, max_len=SHARED + PREFIX_NEW, prefix_cache_bytes=0)
    cached = JaxEngine(ours, max_batch=K, max_len=SHARED + PREFIX_NEW, prefix_cache_bytes=256 << 20)
    try:
        plain_s, cached_s = best_of([lambda: run(plain), lambda: run(cached)], REPEAT)
        stats = cached.prefix_stats()
    finally:
        plain.close()
        cached.close()
    print(
        f"prefix reuse, {K} requests sharing a {SHARED}-token prompt, {PREFIX_NEW} new tokens each: without cache "
        f"{plain_s:.2f} s, with cache {cached_s:.2f} s ({plain_s / cached_s:.2f}x); reused {stats['reused_tokens']} "
        f"of {stats['reused_tokens'] + stats['prefilled_tokens']} prompt tokens over all rounds"
    )


def main() -> None:
    cfg, hf, ours = small_models()
    decode(cfg, hf, ours)
    prefix(cfg, ours)


if __name__ == "__main__":
    main()
