"""What the replication's shapes can reach on this CPU: one seed's device calls against several seeds in one call.

    python benchmarks/seeds.py                 # replicate_xs, the quick preset's shapes, S = 1, 2, 4, 8
    python benchmarks/seeds.py --seeds=1,4,16 --preset=replicate_s

`benchmarks/replication.py` splits a run's time into device calls, compilation and host work; this script asks
how fast the device calls themselves can be at the run's shapes, with no host work at all. It times, for S
independent policies (seeds) at once (`jax.vmap` over stacked parameters, optimizer states, batches and decode
states), the two calls a run spends its device time in:

- **update**: one optimizer step (`train_step`: forward, backward, AdamW) on one micro-batch of the replication's
  packed shape (2 rows of 512 tokens, 16 examples per row pair), S seeds at once;
- **decode**: one decode step (one token for each of G rows: the model on a decode state of 512 positions, the
  logits, sampling) of the engine's unrolled model, S seeds at once.

and prints milliseconds per call, milliseconds per seed and the model FLOP/s those reach (the analytic count of
`benchmarks/replication.py`), against this CPU's [1024, 1024] matmul FLOP/s. A run at width 64 spends its device
time in programs whose every matmul is a few MFLOP: XLA:CPU's fixed cost per operation, not arithmetic, sets
their speed; stacking seeds multiplies the work per operation. The numbers say how far batching seeds (one
process driving S runs in lock step) would take a grid, before anyone builds it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of
from flax import nnx
from replication import forward_flops, matmul_flops_per_s

from rltldr_jax.engines.jax_engine import sample_tokens
from rltldr_jax.models.presets import get_preset
from rltldr_jax.models.qwen3_5 import Qwen35, init_decode_state, unroll
from rltldr_jax.train.step import LossConfig, TrainBatch, make_optimizer, train_step


def stack(tree, s: int, seed: int = 0, perturb: float = 1e-3):
    """`tree` repeated along a new leading axis of size s, each float copy perturbed by `perturb` times a standard
    normal (parameters: so that no two seeds are equal; 0 for an optimizer state, whose second moments must stay
    non-negative)."""
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(tree))))

    def one(x):
        x = jnp.asarray(x)
        copies = jnp.broadcast_to(x, (s, *x.shape))
        if perturb and jnp.issubdtype(x.dtype, jnp.floating):
            copies = copies + perturb * jax.random.normal(next(keys), copies.shape, x.dtype)
        return copies

    return jax.tree.map(one, tree)


def packed_batch(vocab: int, rows: int, length: int, per_row: int, seed: int = 0) -> TrainBatch:
    """One micro-batch [1, rows, length] of `per_row` examples per row, as `batching.pack` lays them out: each
    example a prompt (first half) and an action (second half, the GRPO targets); a few insight targets."""
    rng = np.random.default_rng(seed)
    shape = (1, rows, length)
    seg_len = length // per_row
    segments = np.repeat(np.arange(1, per_row + 1), seg_len)[None, None].repeat(rows, 1).astype(np.int32)
    where = np.arange(length) % seg_len
    action = np.broadcast_to(where >= seg_len // 2, shape)
    insight = np.broadcast_to((where >= seg_len // 4) & (where < seg_len // 4 + 8), shape) & ~action
    return TrainBatch(
        ids=rng.integers(0, vocab, shape).astype(np.int32),
        old_logprobs=np.full(shape, -2.0, np.float32),
        advantages=rng.normal(size=shape).astype(np.float32),
        action_mask=np.ascontiguousarray(action),
        insight_mask=np.ascontiguousarray(insight),
        writer_mask=np.zeros(shape, bool),
        detach_ratio=np.zeros(shape, bool),
        segments=segments,
    )


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, int], dict[str, float]]:
    """Prints the table; returns its rows by (call, S): seconds per call, seconds per seed, FLOP/s."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="replicate_xs")
    parser.add_argument("--seeds", default="1,2,4,8", help="comma-separated numbers of seeds per call")
    parser.add_argument("--rows", type=int, default=2, help="update: packed rows per micro-batch")
    parser.add_argument("--length", type=int, default=512, help="update: tokens per row; decode: cache positions")
    parser.add_argument("--per_row", type=int, default=8, help="update: examples per packed row")
    parser.add_argument("--group", type=int, default=8, help="decode: rows per decode group (G)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]

    config = get_preset(args.preset)
    model = Qwen35(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1e-3)
    loss_cfg = LossConfig().traced()
    batch = packed_batch(config.vocab_size, args.rows, args.length, args.per_row)
    decoder = unroll(model)
    dec_graphdef, dec_params = nnx.split(decoder)
    peak = matmul_flops_per_s()

    # FLOPs as benchmarks/replication.py counts them (the example's own context: a packed row's segments).
    seg = args.length // args.per_row
    update_flops = 3 * forward_flops(config, params, args.rows * args.length, seg / 2)
    decode_flops = forward_flops(config, params, args.group, args.length / 2)

    def update(p, o, b):
        return train_step(graphdef, p, o, b, tx=tx, loss_cfg=loss_cfg)

    def decode(p, state, last, keys):
        m = nnx.merge(dec_graphdef, p)
        h, state = m.hidden_states(last[:, None], state=state, valid=jnp.ones((last.shape[0], 1), bool))
        g = last.shape[0]
        token, logprob = sample_tokens(m.logits(h)[:, 0], jnp.ones(g), jnp.ones(g), jnp.full(g, -1, jnp.int32), keys)
        return token, logprob, state

    print(
        f"{args.preset}: hidden {config.hidden_size}, {config.num_hidden_layers} layers, vocab {config.vocab_size}; "
        f"update micro-batch [{args.rows}, {args.length}] ({args.per_row} examples per row), decode G = "
        f"{args.group} rows over {args.length} positions; this CPU's matmul: {peak / 1e9:.1f} GFLOP/s"
    )
    print(f"{'':8s} {'S':>3s} {'ms/call':>9s} {'ms/seed':>9s} {'GFLOP/s':>9s} {'of peak':>8s} {'per seed vs S=1':>16s}")
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for name in ("update", "decode"):
        base = None
        for s in seeds:
            if name == "update":
                p, o, b = stack(params, s), stack(tx.init(params), s, perturb=0), stack(batch, s, perturb=0)
                step = jax.jit(jax.vmap(update), donate_argnums=(0, 1))
                state = [p, o]

                def call(step=step, state=state, b=b):
                    state[0], state[1], metrics = step(state[0], state[1], b)
                    jax.block_until_ready(metrics)

                flops = update_flops
            else:
                p = stack(dec_params, s)
                st = stack(init_decode_state(config, args.group, args.length), s, perturb=0)
                last = jnp.zeros((s, args.group), jnp.int32)
                keys = jax.vmap(lambda k: jax.random.split(k, args.group))(jax.random.split(jax.random.key(1), s))
                step = jax.jit(jax.vmap(decode), donate_argnums=(1,))
                state = [st]

                def call(step=step, state=state, p=p, last=last, keys=keys):
                    token, _, state[0] = step(p, state[0], last, keys)
                    token.block_until_ready()

                flops = decode_flops
            (seconds,) = best_of([call], repeat=args.repeat)
            per_seed = seconds / s
            base = base or per_seed
            rate = s * flops / seconds
            rows[name, s] = {"seconds": seconds, "per_seed": per_seed, "flops_per_s": rate}
            print(
                f"{name:8s} {s:3d} {seconds * 1e3:9.2f} {per_seed * 1e3:9.2f} {rate / 1e9:9.1f} {rate / peak:8.1%} "
                f"{base / per_seed:15.2f}x"
            )
    return rows


if __name__ == "__main__":
    main()
