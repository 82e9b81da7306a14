"""Run with 8 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8): one RLTL;DR train step and
one forward on a (data=2, fsdp=2, tensor=2) mesh vs the same on one device. Prints a JSON of max differences.

Used by tests/test_sharding.py (a subprocess, because the device count is fixed when JAX starts).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rltldr_jax import sharding
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.train.step import LossConfig, TrainBatch, train_step

assert len(jax.devices()) == 8, jax.devices()
config = dataclasses.replace(get_preset("tiny"), vocab_size=512)
model = ModelSpec(config, remat=True).build(seed=0)
graphdef, params = nnx.split(model)
# Plain SGD, so the update is the (clipped) gradient itself: Adam's 1/sqrt(v) would amplify float noise of tiny
# gradients.
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
opt_state = tx.init(params)

rng = np.random.default_rng(0)
A, M, T = 2, 4, 32
action = rng.random((A, M, T)) < 0.4
insight = (rng.random((A, M, T)) < 0.2) & ~action
action[..., 0] = insight[..., 0] = False
batch = TrainBatch(
    ids=jnp.asarray(rng.integers(0, 512, (A, M, T)), jnp.int32),
    old_logprobs=jnp.asarray(-rng.random((A, M, T)) * 6, jnp.float32),
    advantages=jnp.asarray(rng.normal(size=(A, M)), jnp.float32),
    action_mask=jnp.asarray(action),
    insight_mask=jnp.asarray(insight),
)
loss_cfg = LossConfig(lam=0.5)
step = lambda p, o, b: train_step(graphdef, p, o, b, tx=tx, loss_cfg=loss_cfg)  # noqa: E731

ref_params, _, ref_metrics = jax.jit(step)(params, opt_state, batch)
ref_logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, batch.ids[0])

mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
p_sh = sharding.param_shardings(params, mesh)
o_sh = sharding.optimizer_shardings(tx, opt_state, p_sh, mesh)
b_sh = jax.tree.map(
    lambda x: NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"), *([None] * (x.ndim - 2)))), batch
)
replicated = NamedSharding(mesh, PartitionSpec())
params_d = jax.device_put(params, p_sh)
opt_d = jax.device_put(opt_state, o_sh)
batch_d = jax.device_put(batch, b_sh)
sharded_step = jax.jit(step, in_shardings=(p_sh, o_sh, b_sh), out_shardings=(p_sh, o_sh, replicated))
with sharding.activate(mesh):
    new_params, _, metrics = sharded_step(params_d, opt_d, batch_d)
    logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x), in_shardings=(p_sh, sharding.batch_sharding(mesh, 2)))(
        params_d, batch_d.ids[0]
    )

n_sharded = sum(any(s is not None for s in leaf.sharding.spec) for leaf in jax.tree.leaves(new_params))
param_diff = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(new_params), strict=False)
)
print(
    json.dumps(
        {
            "devices": len(jax.devices()),
            "sharded_param_arrays": n_sharded,
            "param_arrays": len(jax.tree.leaves(new_params)),
            "logits_max_abs_diff": float(jnp.max(jnp.abs(logits - ref_logits))),
            "param_update_max_abs_diff": param_diff,
            "max_param_update": max(
                float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(params), strict=False)
            ),
            "metrics_max_rel_diff": max(
                abs(float(metrics[k]) - float(ref_metrics[k])) / max(abs(float(ref_metrics[k])), 1e-6)
                for k in ref_metrics
            ),
            "loss": float(ref_metrics["loss"]),
        }
    )
)
