"""Shared pieces of the benchmark scripts (imported as `from common import ...` when run from benchmarks/)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best wall time of each function over `repeat` rounds, the functions taking turns within each round (so that
    a change in the machine's load hits all of them alike), after one warm-up call each."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def small_qwen_config():
    """A small Qwen 3.5 for CPU benchmarks: 2 blocks (6 DeltaNet + 2 attention layers), hidden 512, vocab 32k."""
    import transformers

    return transformers.Qwen3_5TextConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )


def small_models(seed: int = 0):
    """(config, transformers model, our model) of `small_qwen_config()` with the same random weights."""
    import tempfile

    import torch
    import transformers

    from rltldr_jax.models import load_pretrained

    cfg = small_qwen_config()
    torch.manual_seed(seed)
    hf = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        ours = load_pretrained(path)
    return cfg, hf, ours
