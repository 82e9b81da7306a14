"""Mesh and logical-axis rules; a sharded train step on 8 fake CPU devices equals the unsharded one."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx
from helpers import fake_devices_xla_flags

from rltldr_jax import distributed, sharding
from rltldr_jax.engines.engine import OnMainProcess
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
    assert sharding.logical_to_spec(("batch", "length"), (8, 5), mesh) == jax.sharding.PartitionSpec(
        ("data", "fsdp"), None
    )


def test_sharded_train_step_matches_single_device():
    env = dict(os.environ, XLA_FLAGS=fake_devices_xla_flags(8), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "scripts", "sharded_step.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["devices"] == 8
    assert r["sharded_param_arrays"] >= r["param_arrays"] // 2  # the rules really shard most arrays
    assert r["logits_max_abs_diff"] < 1e-4
    assert r["max_param_update"] > 1e-4  # the step changed the parameters...
    assert r["param_update_max_abs_diff"] < 1e-5  # ...identically on 8 devices
    assert r["metrics_max_rel_diff"] < 1e-4


# ----------------------------------------------------------------------------------------------------
# Multi-host start-up, `rltldr_jax.distributed` (the two-process runs are tests/test_multihost.py)
# ----------------------------------------------------------------------------------------------------

SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}


def test_distributed_plan_from_flags_environment_and_clusters():
    plan, Plan = distributed.distributed_plan, distributed.DistributedPlan
    assert plan(env={}) is None  # a plain machine: runs alone, no error
    assert plan(env=SLURM | {"SLURM_NTASKS": "1"}) is None  # a single-task SLURM job (sbatch without srun)
    assert plan(env={"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}) is None  # no step: JAX could not detect it
    assert plan(env=SLURM | {"SLURM_NTASKS": "4"}) == Plan(None, None, None, "SLURM")  # JAX detects the rest
    assert plan(env={"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:5", "OMPI_COMM_WORLD_SIZE": "2"}).source == "Open MPI"
    assert plan(env={"TPU_WORKER_HOSTNAMES": "a,b"}).source == "Cloud TPU"
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert plan(env=env) == Plan("10.0.0.1:1234", 4, 3, "flags/environment")
    assert plan("h:1", 2, 0, env=env) == Plan("h:1", 2, 0, "flags/environment")  # flags win over the environment
    assert plan(num_processes=1, env=env | {"JAX_PROCESS_ID": "0"}) is None  # explicitly one process
    assert plan(num_processes=8, env=SLURM | {"SLURM_NTASKS": "8"}) == Plan(None, 8, None, "SLURM")
    assert plan(mode="on", env={}) == Plan(None, None, None, "flags/environment")  # e.g. Kubernetes: JAX detects
    assert plan(mode="off", env=env) is None


@pytest.mark.parametrize(
    "kwargs, env, message",
    [
        ({"num_processes": 2}, {}, r"missing --coordinator_address \(or JAX_COORDINATOR_ADDRESS\), --process_id"),
        ({"coordinator_address": "h:1"}, {}, r"missing --num_processes \(or JAX_NUM_PROCESSES\), --process_id"),
        (
            {"coordinator_address": "h:1", "num_processes": 2, "process_id": 2},
            {},
            r"--process_id=2 .* must be in \[0, num_processes=2\)",
        ),
        ({}, {"JAX_NUM_PROCESSES": "two"}, r"JAX_NUM_PROCESSES='two' is not an integer"),
        ({"num_processes": 0}, {}, r"--num_processes=0 .*at least one process"),
        ({"mode": "sometimes"}, {}, r"--distributed='sometimes': choose one of auto, on, off"),
        ({"mode": "off", "process_id": 1}, {}, r"--distributed=off runs one process, but --process_id was given"),
    ],
)
def test_distributed_plan_errors_name_the_fix(kwargs, env, message):
    with pytest.raises(ValueError, match=message):
        distributed.distributed_plan(**kwargs, env=env)


def test_single_process_helpers_are_identities(monkeypatch):
    import jax

    for key in (
        "JAX_COORDINATOR_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
        "SLURM_JOB_ID",
        "OMPI_MCA_orte_hnp_uri",
        "TPU_WORKER_HOSTNAMES",
    ):
        monkeypatch.delenv(key, raising=False)
    assert distributed.initialize_distributed() is False and jax.process_count() == 1
    assert distributed.is_main_process()
    obj = {"a": [1, 2]}
    assert distributed.broadcast_object(obj) is obj and distributed.gather_objects(obj) == [obj]
    assert distributed.from_main_process(lambda: 41 + 1) == 42
    with pytest.raises(KeyError, match="only here"):
        distributed.from_main_process(lambda: {}["only here"])
    batch = {"ids": np.zeros((2, 4), np.int32)}
    assert distributed.global_batch(batch, None) is batch and distributed.host_local(batch) is batch
    distributed.barrier("nothing to wait for")


def test_the_engine_stand_in_of_other_processes():
    engine = OnMainProcess("the policy engine")
    engine.update_weights({"w": 1}, 3)  # process 0 pushes; here nothing happens
    engine.close()
    assert engine.ensure_weights(None, 3) == "embedded"  # nothing to check here: process 0 checks its engine
    with pytest.raises(AttributeError, match="the policy engine lives on process 0 of this multi-process job"):
        engine.generate_many([])


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (
            ["launch/train.py", "--config=configs/sapi.py:tiny", "--num_processes=2", "--process_id=0"],
            {},
            "error: a multi-process job outside SLURM / Open MPI / Cloud TPU needs all of --coordinator_address",
        ),
        (
            ["launch/pretrain.py", "--config=configs/replicate.py"],
            {"JAX_COORDINATOR_ADDRESS": "localhost:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
            "error: launch/pretrain.py runs in one process, but this process is one of a multi-process job",
        ),
    ],
)
def test_launchers_say_what_is_wrong_with_a_job(argv, env, message):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "OMPI_", "TPU_WORKER"))}
    out = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=clean | env | {"JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(message), out.stderr[-2000:]
