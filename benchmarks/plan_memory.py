"""Memory plan of the 9B RLTL;DR training step on an 8-GPU mesh, from abstract shapes (no weights allocated).

    python benchmarks/plan_memory.py                       # paper micro-batch, SAPI-length contexts
    python benchmarks/plan_memory.py --mesh=1,4,2          # data, fsdp, tensor
    python benchmarks/plan_memory.py --search              # also the largest micro-batch × length per GPU

It AOT-compiles the real train step (`rltldr_jax.train.step.train_step`: forward, backward with per-layer
remat, gradient accumulation, AdamW) for 8 fake CPU devices and reads XLA's per-device buffer assignment:
arguments (params, optimizer state, batch) + outputs + temporaries − donated aliases.

Precision (documented choice): fp32 master parameters and AdamW moments, bf16 compute (matmuls and
activations), fp32 islands for norms, the delta rule, attention softmax and logprobs; fp32 gradient
accumulators. Sharding: parameters, gradients and optimizer state FSDP-sharded over all 8 devices by
default; the micro-batch is split across the data-parallel devices (paper: 4 examples per GPU).

Caveat: CPU XLA's buffer assignment is a proxy for the GPU one (different fusions; no cuDNN flash attention;
our attention materialises [chunk=512, S] score blocks per head). Treat the numbers as a plan, ±10–20 %.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from rltldr_jax import sharding  # noqa: E402
from rltldr_jax.models import ModelSpec, get_preset  # noqa: E402
from rltldr_jax.train.step import LossConfig, TrainBatch, make_optimizer, train_step  # noqa: E402

GIB = 2**30
GPUS = {"B200": 180 * 10**9, "H200": 141 * 10**9}  # HBM in bytes, as the vendors state it
HEADROOM = 0.20


def compile_step(preset: str, mesh_sizes: tuple[int, int, int], micro_per_device: int, length: int):
    """Compiles the step for one micro-batch shape; returns (per-device peak bytes, breakdown, seconds)."""
    mesh = sharding.make_mesh(*mesh_sizes)
    spec = ModelSpec(get_preset(preset), dtype=jnp.bfloat16, param_dtype=jnp.float32, remat=True)
    graphdef, params = nnx.split(spec.abstract())
    tx = make_optimizer(3e-6)
    opt_state = jax.eval_shape(tx.init, params)
    rows = micro_per_device * mesh.shape["data"] * mesh.shape["fsdp"]
    shape = (1, rows, length)  # one micro-batch per step call; accumulation adds no activation memory
    batch = TrainBatch(
        ids=jax.ShapeDtypeStruct(shape, jnp.int32),
        old_logprobs=jax.ShapeDtypeStruct(shape, jnp.float32),
        advantages=jax.ShapeDtypeStruct(shape[:2], jnp.float32),
        action_mask=jax.ShapeDtypeStruct(shape, jnp.bool_),
        insight_mask=jax.ShapeDtypeStruct(shape, jnp.bool_),
    )
    p_sh = sharding.param_shardings(params, mesh)
    o_sh = sharding.optimizer_shardings(tx, opt_state, p_sh, mesh)
    b_sh = jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"), *([None] * (len(x.shape) - 2)))), batch
    )
    step = jax.jit(
        lambda p, o, b: train_step(graphdef, p, o, b, tx=tx, loss_cfg=LossConfig(lam=0.5, logprob_chunk=1024)),
        in_shardings=(p_sh, o_sh, b_sh),
        out_shardings=(p_sh, o_sh, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=(0, 1),
    )
    start = time.perf_counter()
    with sharding.activate(mesh):
        compiled = step.lower(params, opt_state, batch).compile()
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    breakdown = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
    }
    return peak, breakdown, seconds


def _row(micro: int, length: int, peak: int, breakdown: dict, seconds: float) -> str:
    fits = ", ".join(f"{g} {'fits' if peak <= cap * (1 - HEADROOM) else 'NO'}" for g, cap in GPUS.items())
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in breakdown.items())
    return (
        f"micro {micro:>2} × {length:>6} tokens: peak {peak / GIB:6.1f} GiB/device ({parts}) [{fits}] "
        f"({seconds:.0f} s to compile)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3_5_9b")
    parser.add_argument("--mesh", default="1,8,1", help="data,fsdp,tensor sizes (8 devices in all)")
    parser.add_argument("--micro", type=int, default=4, help="examples per device per micro-batch (paper: 4)")
    parser.add_argument("--lengths", default="4096,16384", help="sequence lengths to plan (SAPI contexts reach ~16k)")
    parser.add_argument("--search", action="store_true", help="find the largest micro × length per GPU")
    args = parser.parse_args()
    mesh = tuple(int(x) for x in args.mesh.split(","))
    config = get_preset(args.preset)
    print(
        f"{args.preset}: {config.num_params() / 1e9:.2f}B params; mesh data,fsdp,tensor = {mesh}; "
        "fp32 params + AdamW, bf16 compute, remat"
    )
    for length in (int(x) for x in args.lengths.split(",")):
        print(_row(args.micro, length, *compile_step(args.preset, mesh, args.micro, length)))
    if not args.search:
        return
    for gpu, cap in GPUS.items():
        budget = cap * (1 - HEADROOM)
        print(f"{gpu}: {cap / 1e9:.0f} GB, budget with {HEADROOM:.0%} headroom {budget / GIB:.1f} GiB/device")
        for micro in (1, 2, 4, 8):
            fits = lambda length, micro=micro: compile_step(args.preset, mesh, micro, length)[0]  # noqa: E731
            low, high = None, 1024  # doubling, then bisection to a multiple of 1024 tokens
            while high <= 262144 and fits(high) <= budget:
                low, high = high, high * 2
            if low is None:
                print(f"  micro {micro}: not even {high} tokens per example fit")
                continue
            while high - low > 1024:
                mid = (low + high) // 2 // 1024 * 1024
                low, high = (mid, high) if fits(mid) <= budget else (low, mid)
            print(f"  micro {micro}: up to {low} tokens per example ({micro * low} per device) fits; {high} does not")


if __name__ == "__main__":
    main()
