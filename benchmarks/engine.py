"""Decode throughput and prefix reuse of the JaxEngine vs transformers `generate`, same small Qwen 3.5, on CPU.

    python benchmarks/engine.py

Decode: `BATCH` prompts of `PROMPT` tokens, `NEW` tokens each, sampled at temperature 1 (no stop token), by our
engine with float32 weights, with bfloat16 weights (`weights_dtype="bfloat16"`) and by transformers (float32),
taking turns (best of `REPEAT` after a warm-up); prints tokens/s and each ratio to transformers (goal: >= 2x), and
the bfloat16 engine's logprob gap: the mean over its sampled tokens of (float32 teacher-forced logprob - engine
logprob), what the trainer logs as first_minibatch/logprob_gap.

Prefix reuse: `K` requests share one `SHARED`-token prompt (the attempts of one task), `PREFIX_NEW` new tokens each;
the engine with and without its prefix cache (a fresh random prompt each round, so every round starts cold).

Fused decode, at the small-scale replication's shapes (configs/replicate.py: model preset `replicate_xs`, random
weights, `engine.max_batch` 64, `rollout.max_context_tokens` 512): `FUSED_BATCH` concurrent seeded requests, prompts
of `FUSED_PROMPT` ± 8 tokens, `FUSED_NEW` new tokens each (no stop token), by the engine with `decode_steps` x
`decode_group` = 1 x 64 (one `[64, 1]` call per token for every slot: the engine before the fused loop), 1 x 8
(groups only), 32 x 64 (fused only) and 32 x 8 (the defaults), taking turns; prints tokens/s end to end (prefill
included) and of the decode alone (the run minus a 1-token run), each ratio to 1 x 64 (goal >= 10x), and whether all
settings sampled the same tokens (expected, though groups of 8 and 64 rows may round logits differently).

    python benchmarks/engine.py [decode] [prefix] [fused]     # the sections to run (default: all)
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of, small_models

from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams
from rltldr_jax.models import ModelSpec, get_preset, sequence_logprobs

BATCH, PROMPT, NEW, REPEAT = 8, 64, 64, 2
K, SHARED, PREFIX_NEW = 8, 1024, 16
FUSED_BATCH, FUSED_PROMPT, FUSED_NEW, FUSED_SLOTS, FUSED_LEN, FUSED_REPEAT = 8, 100, 96, 64, 512, 5
FUSED_SETTINGS = ((1, 64), (1, 8), (32, 64), (32, 8))  # (decode_steps, decode_group); the first is the reference


def decode(cfg, hf, ours) -> None:
    import torch

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


def fused() -> None:
    model = ModelSpec(get_preset("replicate_xs")).build(seed=0)
    rng = np.random.default_rng(2)
    lengths = rng.integers(FUSED_PROMPT - 8, FUSED_PROMPT + 9, FUSED_BATCH)
    prompts = [tuple(rng.integers(0, model.config.vocab_size, n).tolist()) for n in lengths]

    def requests(new: int) -> list[GenerationRequest]:
        return [GenerationRequest(p, SamplingParams(max_new_tokens=new, seed=i)) for i, p in enumerate(prompts)]

    engines = [
        JaxEngine(model, max_batch=FUSED_SLOTS, max_len=FUSED_LEN, decode_steps=steps, decode_group=group)
        for steps, group in FUSED_SETTINGS
    ]
    results = {}

    def run(i: int, new: int) -> None:
        results[i, new] = engines[i].generate_many(requests(new))
        assert all(len(r.token_ids) == new for r in results[i, new])

    try:
        times = best_of(
            [lambda i=i, new=new: run(i, new) for i in range(len(engines)) for new in (FUSED_NEW, 1)], FUSED_REPEAT
        )
    finally:
        for engine in engines:
            engine.close()
    tokens = [[r.token_ids for r in results[i, FUSED_NEW]] for i in range(len(engines))]
    total, decoded = FUSED_BATCH * FUSED_NEW, FUSED_BATCH * (FUSED_NEW - 1)
    e2e = [total / times[2 * i] for i in range(len(engines))]
    dec = [decoded / (times[2 * i] - times[2 * i + 1]) for i in range(len(engines))]
    print(
        f"fused decode, replicate_xs, {FUSED_BATCH} requests of ~{FUSED_PROMPT} prompt + {FUSED_NEW} new tokens, "
        f"max_batch {FUSED_SLOTS}, max_len {FUSED_LEN} (decode_steps x decode_group: end to end tok/s, decode-only "
        f"tok/s, ratios to 1 x 64; the same tokens in every setting: {all(t == tokens[0] for t in tokens)}):"
    )
    for (steps, group), a, b in zip(FUSED_SETTINGS, e2e, dec, strict=True):
        print(f"  {steps:2d} x {group:2d}: {a:6.0f} tok/s ({a / e2e[0]:5.2f}x), decode {b:6.0f} ({b / dec[0]:5.2f}x)")


SECTIONS = ("decode", "prefix", "fused")


def main() -> None:
    sections = sys.argv[1:] or list(SECTIONS)
    if unknown := set(sections) - set(SECTIONS):
        sys.exit(f"unknown section(s) {sorted(unknown)}: choose from {SECTIONS}")
    if "decode" in sections or "prefix" in sections:
        cfg, hf, ours = small_models()
        if "decode" in sections:
            decode(cfg, hf, ours)
        if "prefix" in sections:
            prefix(cfg, ours)
    if "fused" in sections:
        fused()


if __name__ == "__main__":
    main()
