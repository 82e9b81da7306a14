"""Mesh and logical-axis rules; a sharded train step on 8 fake CPU devices equals the unsharded one."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from rltldr_jax import sharding
from rltldr_jax.models import ModelSpec, get_preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_logical_axes_of_the_9b_parameters():
    state = nnx.split(ModelSpec(get_preset("qwen3_5_9b")).abstract())[1]
    flat = {".".join(map(str, k)): v for k, v in nnx.to_flat_state(state)}
    axes = {name: sharding.param_logical_axes(name, len(v.shape)) for name, v in flat.items()}
    assert axes["embed_tokens.embedding"] == ("vocab", "embed")
    assert axes["lm_head.kernel"] == ("embed", "vocab")
    assert axes["blocks.runs.0.mlp.down_proj.kernel"] == ("layers", "layers", "ffn", "embed")
    assert axes["blocks.runs.1.self_attn.q_proj.kernel"] == ("layers", "layers", "embed", "ffn")
    assert axes["blocks.runs.0.linear_attn.A_log"] == ("layers", "layers", None)
    assert flat["blocks.runs.0.mlp.down_proj.kernel"].shape == (8, 3, 12288, 4096)
    assert all(len(axes[n]) == len(v.shape) for n, v in flat.items())


def test_mesh_sizes_and_errors():
    import jax

    mesh = sharding.make_mesh(data=1, fsdp=-1, tensor=1)
    assert dict(mesh.shape) == {"data": 1, "fsdp": len(jax.devices()), "tensor": 1}
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.make_mesh(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="needs 6 devices"):
        sharding.make_mesh(data=2, fsdp=3, tensor=1)


def test_indivisible_dimensions_stay_whole():
    import jax

    devices = np.array(jax.devices() * 8)[:8]  # a fake 8-slot mesh is enough to compute specs
    mesh = jax.sharding.Mesh(devices.reshape(2, 2, 2), sharding.AXES)
    assert sharding.logical_to_spec(("embed", "ffn"), (64, 128), mesh) == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert sharding.logical_to_spec(("embed", "ffn"), (63, 128), mesh) == jax.sharding.PartitionSpec(None, "tensor")
    assert sharding.logical_to_spec(("batch", "length"), (8, 5), mesh) == jax.sharding.PartitionSpec(("data", "fsdp"), None)


def test_sharded_train_step_matches_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "scripts", "sharded_step.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["devices"] == 8
    assert r["sharded_param_arrays"] >= r["param_arrays"] // 2  # the rules really shard most arrays
    assert r["logits_max_abs_diff"] < 1e-4
    assert r["max_param_update"] > 1e-4  # the step changed the parameters...
    assert r["param_update_max_abs_diff"] < 1e-5  # ...identically on 8 devices
    assert r["metrics_max_rel_diff"] < 1e-4
