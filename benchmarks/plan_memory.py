"""Memory plan of the RLTL;DR training step, from abstract shapes (no weights allocated): the 9B on an 8-GPU mesh
by default, LoRA and single GPUs on request.

    python benchmarks/plan_memory.py                       # paper micro-batch, SAPI-length contexts
    python benchmarks/plan_memory.py --mesh=1,4,2          # data, fsdp, tensor
    python benchmarks/plan_memory.py --search              # also the largest micro-batch × length per GPU
    python benchmarks/plan_memory.py --preset=qwen3_5_2b --mesh=1,1,1 --gpus=T4,L4 --lora_rank=16   # LoRA, 1 GPU
    python benchmarks/plan_memory.py --lora_table          # LoRA r = 16, 64 vs full fine-tuning, one GPU each

It AOT-compiles the real train step (`rltldr_jax.train.step.train_step`: forward, backward with per-layer
remat, gradient accumulation, AdamW) for fake CPU devices (as many as the mesh has, up to 8) and reads XLA's
per-device buffer assignment: arguments (params, optimizer state, batch) + outputs + temporaries − donated aliases.

Precision (documented choice): fp32 master parameters and AdamW moments, bf16 compute (matmuls and
activations), fp32 islands for norms, the delta rule, attention softmax and logprobs; fp32 gradient
accumulators. Sharding: parameters, gradients and optimizer state FSDP-sharded over all 8 devices by
default; the micro-batch is split across the data-parallel devices (paper: 4 examples per GPU).

LoRA (`--lora_rank=R`, α = 2R, `rltldr_jax.models.lora`: adapters on every attention, DeltaNet and MLP projection):
the base is frozen and held in `--base_dtype` (bf16 by default with LoRA); only the fp32 adapters have gradient
accumulators and AdamW moments. `--lora_table` plans the 0.8B and 2B on one 16 GB T4 and one 24 GB L4, the 9B on
one H200 and one B200, each at r = 16 and 64 and, for comparison, fully fine-tuned (fp32 master weights).

The loss's logprobs project `--logprob_chunk` positions at a time onto the vocabulary (default: the trainer's
`DEFAULT_LOGPROB_CHUNK`, 128; the 2026-11-29 8-device table in benchmarks/README.md was measured with 1024, whose
[rows, chunk, 248k] fp32 logits are larger). With bf16 weights the step is compiled without XLA's loop-invariant
code motion (`--hoist`, `hoist_of`): on CPU it hoists fp32 copies of the bf16 weights that a GPU never makes.

Caveat: CPU XLA's buffer assignment is a proxy for the GPU one (different fusions; no cuDNN flash attention;
our attention materialises [chunk=512, S] score blocks per head). Treat the numbers as a plan, ±10–20 %.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from rltldr_jax import sharding  # noqa: E402
from rltldr_jax.models import ModelSpec, get_preset, lora  # noqa: E402
from rltldr_jax.train.step import (  # noqa: E402
    DEFAULT_LOGPROB_CHUNK,
    LossConfig,
    TrainBatch,
    make_optimizer,
    train_step,
)

GIB = 2**30
#: HBM in bytes, as the vendors state it (B200 as in DGX B200, 180 GB per GPU).
GPUS = {"B200": 180 * 10**9, "H200": 141 * 10**9, "L4": 24 * 10**9, "T4": 16 * 10**9}
HEADROOM = 0.20
#: GPUs without bf16 tensor cores: the plan holds for memory, not for speed.
NO_BF16 = {
    "T4": "T4 (compute capability 7.5) has no bf16 tensor cores: bf16 compute is emulated there (slow); memory "
    "is what this plan covers"
}
#: `--lora_table`: each preset with the single GPUs it is planned on.
LORA_TABLE = (("qwen3_5_0_8b", ("T4", "L4")), ("qwen3_5_2b", ("T4", "L4")), ("qwen3_5_9b", ("H200", "B200")))
LORA_TABLE_RANKS = (16, 64)
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
#: XLA's pass that `--hoist=off` disables, and the choices of `--hoist` (`hoist_of`).
LICM_PASS = "while-loop-invariant-code-motion"
HOIST_CHOICES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class Plan:
    """One compiled step's memory, per device (bytes).

    Attributes:
      peak: arguments + outputs + temporaries − donated aliases (XLA's buffer assignment).
      breakdown: those four terms by name.
      seconds: the compile's wall time.
      trainable: parameters (scalars) the optimizer updates: the adapters with LoRA, else all.
      param_bytes: the model's parameters (base and adapters) on one device.
      trainable_bytes: the trainable part of `param_bytes`.
      optimizer_bytes: the optimizer state on one device.
      compile_rss: how far the process's peak resident memory rose while compiling (bytes; 0 if it did not).
    """

    peak: int
    breakdown: dict[str, int]
    seconds: float
    trainable: int
    param_bytes: int
    trainable_bytes: int
    optimizer_bytes: int
    compile_rss: int


def hoist_of(lora_rank: int, base_dtype: str | None, hoist: str) -> bool:
    """Whether to compile with XLA's while-loop-invariant code motion (`--hoist`): "on", "off", or "auto" = off
    exactly when the weights are bf16.

    XLA:CPU has no bf16 matmul: it converts bf16 operands to fp32, and that pass then hoists the conversion of the
    stacked [n_blocks, run, ...] weights out of the layer scan, a whole fp32 copy of the bf16 weights (measured: 2.8
    GiB of the 0.8B's 9.4 GiB LoRA plan at 4 × 4,096, 31 GiB of the 9B's 64 GiB) that a GPU, which multiplies in bf16,
    never makes. With fp32 weights there is no such copy and the default compile is kept."""
    if hoist not in HOIST_CHOICES:
        raise ValueError(f"hoist={hoist!r}: choose one of {', '.join(HOIST_CHOICES)}")
    if hoist != "auto":
        return hoist == "on"
    return base_dtype_of(lora_rank, base_dtype) != jnp.bfloat16


def base_dtype_of(lora_rank: int, base_dtype: str | None) -> Any:
    """The frozen base's (or, without LoRA, the master weights') dtype: `base_dtype`, else bf16 with LoRA and fp32
    without."""
    if base_dtype is None:
        return jnp.bfloat16 if lora_rank else jnp.float32
    return DTYPES[base_dtype]


def abstract_state(preset: str, lora_rank: int = 0, base_dtype: str | None = None) -> tuple[Any, Any, Any, Any]:
    """(graphdef, params, tx, opt_state) of the policy as the trainer holds it, with ShapeDtypeStruct leaves: bf16
    compute, remat, AdamW; with `lora_rank` > 0, adapters (α = 2·rank, `lora.DEFAULT_TARGETS`, fp32) on the base and
    optimizer state for the adapters alone (`ShardedUpdate`)."""
    spec = ModelSpec(
        get_preset(preset), dtype=jnp.bfloat16, param_dtype=base_dtype_of(lora_rank, base_dtype), remat=True
    )
    if lora_rank:
        adapters = lora.LoraSpec(rank=lora_rank, alpha=2 * lora_rank)
        model = nnx.eval_shape(lambda: lora.attach(spec.build(), adapters))
    else:
        model = spec.abstract()
    graphdef, params = nnx.split(model)
    tx = make_optimizer(3e-6)
    opt_state = jax.eval_shape(tx.init, lora.split_trainable(params)[0])
    return graphdef, params, tx, opt_state


def _device_bytes(tree: Any, shardings: Any) -> int:
    """Bytes of `tree`'s leaves on one device, under `shardings` (same structure)."""
    sizes = jax.tree.map(lambda x, s: math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize, tree, shardings)
    return int(sum(jax.tree.leaves(sizes)))


def _rss() -> int:
    """This process's resident memory now (bytes)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ram_available() -> int:
    """The host's available memory (bytes, /proc/meminfo's MemAvailable)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def make_plan_mesh(mesh_sizes: tuple[int, int, int]) -> jax.sharding.Mesh:
    """The (data, fsdp, tensor) mesh over the first devices it needs (all 8 fake ones when a size is -1)."""
    devices = jax.devices() if -1 in mesh_sizes else jax.devices()[: math.prod(mesh_sizes)]
    return sharding.make_mesh(*mesh_sizes, devices=devices)


def compile_step(
    preset: str,
    mesh_sizes: tuple[int, int, int],
    micro_per_device: int,
    length: int,
    *,
    lora_rank: int = 0,
    base_dtype: str | None = None,
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK,
    hoist: str = "auto",
) -> Plan:
    """Compiles the step for one micro-batch shape (`micro_per_device` examples of `length` tokens per
    data-parallel device) and reads its per-device memory. `logprob_chunk`: positions per vocabulary-projection
    chunk of the loss (the trainer's `DEFAULT_LOGPROB_CHUNK`; its [rows, chunk, vocab] fp32 logits are the largest
    temporaries of small models). `hoist`: whether XLA may hoist loop invariants out of the layer scans ("on",
    "off", or "auto": off with bf16 weights, `hoist_of`)."""
    mesh = make_plan_mesh(mesh_sizes)
    graphdef, params, tx, opt_state = abstract_state(preset, lora_rank, base_dtype)
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
    trainable, t_sh = lora.split_trainable(params)[0], lora.split_trainable(p_sh)[0]
    o_sh = sharding.optimizer_shardings(tx, opt_state, t_sh, mesh)
    b_sh = jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"), *([None] * (len(x.shape) - 2)))), batch
    )
    step = jax.jit(
        lambda p, o, b: train_step(graphdef, p, o, b, tx=tx, loss_cfg=LossConfig(lam=0.5, logprob_chunk=logprob_chunk)),
        in_shardings=(p_sh, o_sh, b_sh),
        out_shardings=(p_sh, o_sh, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=(0, 1),
    )
    rss = _rss()
    start = time.perf_counter()
    with sharding.activate(mesh):
        options = None if hoist_of(lora_rank, base_dtype, hoist) else {"xla_disable_hlo_passes": LICM_PASS}
        compiled = step.lower(params, opt_state, batch).compile(options)
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    breakdown = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
    }
    return Plan(
        peak=peak,
        breakdown=breakdown,
        seconds=seconds,
        trainable=sum(math.prod(x.shape) for x in jax.tree.leaves(trainable)),
        param_bytes=_device_bytes(params, p_sh),
        trainable_bytes=_device_bytes(trainable, t_sh),
        optimizer_bytes=_device_bytes(opt_state, o_sh),
        compile_rss=max(0, peak_rss - rss),
    )


def fits(peak: int, gpu: str) -> bool:
    """Whether `peak` bytes per device fit `gpu` with `HEADROOM` left."""
    return peak <= GPUS[gpu] * (1 - HEADROOM)


def _row(micro: int, length: int, plan: Plan, gpus: Sequence[str]) -> str:
    fit = ", ".join(f"{g} {'fits' if fits(plan.peak, g) else 'NO'}" for g in gpus)
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in plan.breakdown.items())
    return (
        f"micro {micro:>2} × {length:>6} tokens: peak {plan.peak / GIB:6.1f} GiB/device ({parts}) [{fit}] "
        f"({plan.seconds:.0f} s to compile)"
    )


def search(
    peak_of: Callable[[int, int], int | None], gpus: Sequence[str], micros: Sequence[int] = (1, 2, 4, 8)
) -> None:
    """Prints, per GPU and micro-batch, the largest tokens per example (doubling from 1,024, then bisection to a
    multiple of 1,024) whose `peak_of(micro, length)` fits with `HEADROOM`; `peak_of` returns None for a shape it
    could not plan (the search for that micro-batch stops there)."""
    for gpu in gpus:
        cap = GPUS[gpu]
        budget = cap * (1 - HEADROOM)
        print(f"{gpu}: {cap / 1e9:.0f} GB, budget with {HEADROOM:.0%} headroom {budget / GIB:.1f} GiB/device")
        too_big = None  # the smallest micro-batch that does not fit even 1024 tokens: larger ones do not either
        for micro in micros:
            if too_big is not None:
                print(f"  micro {micro}: not even 1024 tokens per example fit (nor at micro {too_big})")
                continue
            low, high, peak = None, 1024, 0  # doubling, then bisection to a multiple of 1024 tokens
            while high <= 262144:
                peak = peak_of(micro, high)
                if peak is None or peak > budget:
                    break
                low, high = high, high * 2
            if peak is None:
                print(f"  micro {micro}: {high} tokens per example not planned (skipped); {low or 0} fit")
                continue
            if low is None:
                print(f"  micro {micro}: not even {high} tokens per example fit")
                too_big = micro
                continue
            while high - low > 1024:
                mid = (low + high) // 2 // 1024 * 1024
                peak = peak_of(micro, mid)
                if peak is None:
                    print(f"  micro {micro}: {mid} tokens per example not planned (skipped)")
                    break
                low, high = (mid, high) if peak <= budget else (low, mid)
            print(
                f"  micro {micro}: up to {low} tokens per example ({micro * low} per device) fits; {high} does not",
                flush=True,
            )


class Planner:
    """`compile_step` on `mesh` with its results kept per shape; with `min_free` (bytes), a refusal (None, with a
    message) to compile when the host has less memory available than `ram_needed` (estimated from the largest compile
    so far); without it, every shape compiles."""

    def __init__(
        self,
        mesh: tuple[int, int, int],
        *,
        min_free: int | None = None,
        logprob_chunk: int = DEFAULT_LOGPROB_CHUNK,
        hoist: str = "auto",
    ):
        self.mesh, self.logprob_chunk, self.hoist = mesh, logprob_chunk, hoist
        self.min_free = min_free
        self.plans: dict[tuple[str, int, str | None, int, int], Plan] = {}
        self.largest_compile = 0

    def ram_needed(self) -> int:
        """What one more compile is expected to need: 1.5 × the largest RSS rise seen so far, at least `min_free`."""
        return max(self.min_free or 0, int(1.5 * self.largest_compile))

    def plan(self, preset: str, lora_rank: int, base_dtype: str | None, micro: int, length: int) -> Plan | None:
        """The plan of this shape (compiled once), or None when the host lacks the memory to compile it."""
        key = (preset, lora_rank, base_dtype, micro, length)
        if key not in self.plans:
            need = self.ram_needed()
            if self.min_free is not None and (free := ram_available()) < need:
                print(
                    f"  skipped {preset} rank {lora_rank} micro {micro} × {length}: compiling needs ~{need / GIB:.1f} "
                    f"GiB of host RAM, {free / GIB:.1f} GiB available",
                    flush=True,
                )
                return None
            plan = compile_step(
                preset,
                self.mesh,
                micro,
                length,
                lora_rank=lora_rank,
                base_dtype=base_dtype,
                logprob_chunk=self.logprob_chunk,
                hoist=self.hoist,
            )
            self.largest_compile = max(self.largest_compile, plan.compile_rss)
            self.plans[key] = plan
        return self.plans[key]


def lora_table(
    micro: int,
    lengths: Sequence[int],
    base_dtype: str | None,
    *,
    min_free: int,
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK,
    hoist: str = "auto",
) -> None:
    """Prints `LORA_TABLE` as a markdown table: per preset and length, full fine-tuning and LoRA at
    `LORA_TABLE_RANKS` on each of the preset's single GPUs; then, for a T4 that the shortest length does not fit
    with LoRA, the largest micro-batch × length that does."""
    planner = Planner((1, 1, 1), min_free=min_free, logprob_chunk=logprob_chunk, hoist=hoist)
    columns = sorted({g for _, gpus in LORA_TABLE for g in gpus}, key=GPUS.__getitem__)  # smallest first
    budgets = ", ".join(f"{g} {GPUS[g] * (1 - HEADROOM) / GIB:.1f}" for g in columns)
    hoisting = {
        h: "on" if hoist_of(r, base_dtype if r else None, hoist) else "off" for h, r in (("full", 0), ("LoRA", 1))
    }
    print(
        f"One device (mesh 1,1,1), {micro} examples per micro-batch, bf16 compute, remat, logprob chunk "
        f"{logprob_chunk}; full = fp32 master weights + AdamW; LoRA: α = 2r on every attention / DeltaNet / MLP "
        f"projection, base {base_dtype or 'bfloat16'}, fp32 adapters + AdamW. XLA loop-invariant hoisting: full "
        f"{hoisting['full']}, LoRA {hoisting['LoRA']} (--hoist={hoist}). Budgets with {HEADROOM:.0%} headroom (GiB): "
        f"{budgets}.\n",
        flush=True,
    )
    print(
        "| preset | fine-tuning | trainable params | micro × tokens | peak GiB/device | weights + AdamW GiB | "
        + " | ".join(f"fits {g}" for g in columns)
        + " |"
    )
    print("|---" * (6 + len(columns)) + "|", flush=True)
    for preset, gpus in LORA_TABLE:
        for length in lengths:
            for rank in (0, *LORA_TABLE_RANKS):
                dtype = None if rank == 0 else base_dtype
                plan = planner.plan(preset, rank, dtype, micro, length)
                kind = "full (fp32)" if rank == 0 else f"LoRA r={rank} ({dtype or 'bfloat16'} base)"
                if plan is None:
                    cells = ["", "skipped (host RAM)", "", *([""] * len(columns))]
                else:
                    verdicts = [("yes" if fits(plan.peak, g) else "no") if g in gpus else "—" for g in columns]
                    weights = (plan.param_bytes + plan.optimizer_bytes) / GIB
                    cells = [f"{plan.trainable:,}", f"{plan.peak / GIB:.1f}", f"{weights:.1f}", *verdicts]
                row = f"| {preset} | {kind} | {cells[0]} | {micro} × {length:,} | " + " | ".join(cells[1:]) + " |"
                print(row, flush=True)
    for gpu, note in NO_BF16.items():
        if gpu in columns:
            print(f"\n{note}.")
    rank, shortest = LORA_TABLE_RANKS[0], min(lengths)
    for preset, gpus in LORA_TABLE:
        if "T4" not in gpus:
            continue
        plan = planner.plan(preset, rank, base_dtype, micro, shortest)
        if plan is None or fits(plan.peak, "T4"):
            continue
        print(f"\n{preset}, LoRA r={rank}, does not fit a T4 at {micro} × {shortest:,}: the largest that does")
        search(lambda m, n, preset=preset: getattr(planner.plan(preset, rank, base_dtype, m, n), "peak", None), ("T4",))
    total = sum(p.seconds for p in planner.plans.values())
    print(f"\n{len(planner.plans)} compiles, {total:.0f} s compiling", flush=True)


def _parse_mesh(text: str) -> tuple[int, int, int]:
    """`--mesh`'s three sizes; ValueError with the reason otherwise."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh={text}: give three integer sizes data,fsdp,tensor") from None
    if len(sizes) != 3:
        raise ValueError(f"--mesh={text}: give three sizes data,fsdp,tensor")
    problem = sharding.mesh_sizes_error(*sizes)
    if problem:
        raise ValueError(f"--mesh={text}: {problem}")
    if -1 not in sizes and math.prod(sizes) > len(jax.devices()):
        raise ValueError(f"--mesh={text} needs {math.prod(sizes)} devices; this plan has {len(jax.devices())}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3_5_9b")
    parser.add_argument("--mesh", default="1,8,1", help="data,fsdp,tensor sizes (8 devices at most; 1,1,1: one GPU)")
    parser.add_argument("--micro", type=int, default=4, help="examples per device per micro-batch (paper: 4)")
    parser.add_argument("--lengths", default="4096,16384", help="sequence lengths to plan (SAPI contexts reach ~16k)")
    parser.add_argument("--search", action="store_true", help="find the largest micro × length per GPU")
    parser.add_argument("--gpus", default="B200,H200", help=f"GPUs to check the plan against, of {', '.join(GPUS)}")
    parser.add_argument("--lora_rank", type=int, default=0, help="LoRA rank (α = 2·rank); 0: full fine-tuning")
    parser.add_argument(
        "--base_dtype", choices=sorted(DTYPES), help="the base's dtype (default: bfloat16 with LoRA, float32 without)"
    )
    parser.add_argument(
        "--lora_table",
        action="store_true",
        help="LoRA vs full fine-tuning on single GPUs, a table (sets the presets, mesh and GPUs itself)",
    )
    parser.add_argument(
        "--min_free_gib", type=float, default=4.0, help="--lora_table skips a compile with less host RAM available"
    )
    parser.add_argument(
        "--logprob_chunk",
        type=int,
        default=DEFAULT_LOGPROB_CHUNK,
        help="positions per vocabulary-projection chunk of the loss (default: the trainer's)",
    )
    parser.add_argument(
        "--hoist",
        choices=HOIST_CHOICES,
        default="auto",
        help="XLA's loop-invariant code motion (auto: off with bf16 weights, whose fp32 copies it hoists on CPU only)",
    )
    args = parser.parse_args()
    try:
        mesh = _parse_mesh(args.mesh)
        config = get_preset(args.preset)
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError as e:
        if "invalid literal" in str(e):
            parser.error(f"--lengths={args.lengths}: give comma-separated token counts")
        parser.error(str(e))
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if unknown := [g for g in gpus if g not in GPUS]:
        parser.error(f"--gpus: unknown {', '.join(unknown)}; choose from {', '.join(GPUS)}")
    if args.lora_rank < 0 or args.micro < 1 or min(lengths) < 1 or args.logprob_chunk < 1:
        parser.error(
            f"--lora_rank={args.lora_rank}, --micro={args.micro}, --lengths={args.lengths}, "
            f"--logprob_chunk={args.logprob_chunk}: give rank >= 0 and positive micro, lengths and chunk"
        )
    if args.lora_table:
        lora_table(
            args.micro,
            lengths,
            args.base_dtype,
            min_free=int(args.min_free_gib * GIB),
            logprob_chunk=args.logprob_chunk,
            hoist=args.hoist,
        )
        return
    dtype = base_dtype_of(args.lora_rank, args.base_dtype)
    if args.lora_rank:
        _, params, _, _ = abstract_state(args.preset, args.lora_rank, args.base_dtype)
        adapters = sum(math.prod(x.shape) for x in jax.tree.leaves(lora.split_trainable(params)[0]))
        precision = (
            f"{jnp.dtype(dtype).name} base + fp32 LoRA r={args.lora_rank} (α {2 * args.lora_rank}, "
            f"{adapters / 1e6:.1f}M trainable) + AdamW on the adapters, bf16 compute, remat"
        )
    else:
        precision = f"{'fp32' if dtype == jnp.float32 else jnp.dtype(dtype).name} params + AdamW, bf16 compute, remat"
    if not hoist_of(args.lora_rank, args.base_dtype, args.hoist):
        precision += "; XLA loop-invariant hoisting off (CPU-only fp32 copies of bf16 weights)"
    print(f"{args.preset}: {config.num_params() / 1e9:.2f}B params; mesh data,fsdp,tensor = {mesh}; {precision}")
    planner = Planner(mesh, logprob_chunk=args.logprob_chunk, hoist=args.hoist)
    for length in lengths:
        plan = planner.plan(args.preset, args.lora_rank, args.base_dtype, args.micro, length)
        print(_row(args.micro, length, plan, gpus), flush=True)
    for gpu in gpus:
        if gpu in NO_BF16:
            print(f"{NO_BF16[gpu]}.")
    if not args.search:
        return
    search(lambda m, n: planner.plan(args.preset, args.lora_rank, args.base_dtype, m, n).peak, gpus)


if __name__ == "__main__":
    sys.exit(main())
