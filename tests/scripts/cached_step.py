"""`python tests/scripts/cached_step.py CACHE_DIR LAM`: one `ShardedUpdate` step of a 2-layer tiny policy with loss.lam
= LAM, with JAX's persistent compilation cache in CACHE_DIR (`rltldr_jax.compile_cache.enable_compile_cache`, as
every launcher sets it up). Prints a JSON line: how many compilations went through the cache and how many of those
were read from it (cache hits), and the step's loss, grpo_loss and sft_nll.

Used by tests/test_compile_cache.py: a second process (another λ: another arm of a grid) compiles nothing.
"""

import dataclasses
import json
import sys

import jax
import numpy as np

from rltldr_jax.compile_cache import enable_compile_cache

enable_compile_cache(sys.argv[1])  # before anything compiles, as the launchers do
counts = {"/jax/compilation_cache/compile_requests_use_cache": 0, "/jax/compilation_cache/cache_hits": 0}


def _count(event: str, **_: object) -> None:
    if event in counts:
        counts[event] += 1


jax.monitoring.register_event_listener(_count)

from rltldr_jax.agent.step_examples import Example  # noqa: E402
from rltldr_jax.models import ModelSpec, get_preset  # noqa: E402
from rltldr_jax.sharding import MeshConfig  # noqa: E402
from rltldr_jax.train.batching import pack  # noqa: E402
from rltldr_jax.train.setup import ShardedUpdate  # noqa: E402
from rltldr_jax.train.step import LossConfig, make_optimizer  # noqa: E402

T = 16
model = ModelSpec(dataclasses.replace(get_preset("tiny"), vocab_size=128, num_hidden_layers=2, layer_types=())).build(
    seed=0
)
update = ShardedUpdate(
    MeshConfig(data=-1, fsdp=1, tensor=1),
    model,
    make_optimizer(1e-3),
    LossConfig(lam=float(sys.argv[2])),
    micro_batch_size=1,
)
positions = np.arange(T)
example = Example(
    ids=(positions * 7 + 3).astype(np.int32) % 128,
    old_logprobs=np.full(T, -2.0, np.float32),
    action_mask=positions >= 8,
    insight_mask=(positions >= 4) & (positions < 8),
    advantage=1.0,
    task_id="t",
    attempt=1,
    step=0,
)
(batch,) = pack([example], micro_batch_size=1, grad_accum_steps=1, pad_to_multiple=T)
metrics = {k: float(v) for k, v in update.step(batch).items()}
print(
    json.dumps(
        {
            "requests": counts["/jax/compilation_cache/compile_requests_use_cache"],
            "hits": counts["/jax/compilation_cache/cache_hits"],
            **{k: metrics[k] for k in ("loss", "grpo_loss", "sft_nll")},
        }
    )
)
