"""Two CPU processes × 4 fake devices joined by `distributed.initialize_distributed` (a local coordinator) against one
process × 8 fake devices: the same train step, a checkpoint the pair saves and one process restores, and the
multi-process rules of the workdir, the event files, metrics.jsonl and `from_main_process`.

The processes are subprocesses of the test (the device count and the distributed runtime are fixed when JAX
starts): `python tests/test_multihost.py pair OUT [PORT]` and `python tests/test_multihost.py single OUT`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300
# The model (tiny, 512 ids, 2 layers), batch (A micro-batches of M rows of T tokens) and mesh of the step.
A, M, T = 2, 4, 32
MESH = {"data": 1, "fsdp": 4, "tensor": 2}  # fsdp spans both processes (4 devices each), tensor stays inside one
# ~70 s on 2 cores (three JAX processes start and compile the step): opt-in, `pytest -m slow`.
pytestmark = pytest.mark.slow


def _model_config():
    from rltldr_jax.models import get_preset
    from rltldr_jax.models.config import FULL, LINEAR

    # One DeltaNet and one attention layer: both mixers, half the compile time of the 3:1 pattern.
    return dataclasses.replace(get_preset("tiny"), vocab_size=512, num_hidden_layers=2, layer_types=(LINEAR, FULL))


def _flat(tree: Any) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ----------------------------------------------------------------------------------------------------
# The worker (a subprocess)
# ----------------------------------------------------------------------------------------------------


def _worker(role: str, out: str, port: str | None) -> None:
    import jax

    from rltldr_jax import distributed, sharding

    if port is None:  # the pair's process 0 and the single process: whatever the environment says
        joined = distributed.initialize_distributed()
    else:  # the pair's process 1: explicit arguments, as the launchers' flags pass them
        joined = distributed.initialize_distributed(f"localhost:{port}", 2, 1)
    import optax
    from flax import nnx

    from rltldr_jax.checkpoint import Checkpointer
    from rltldr_jax.models import ModelSpec
    from rltldr_jax.train.setup import ShardedUpdate
    from rltldr_jax.train.step import LossConfig, TrainBatch

    pid = jax.process_index()
    result: dict[str, Any] = {
        "joined": joined,
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }
    model = ModelSpec(_model_config()).build(seed=0)
    # SGD with momentum: the update is the clipped gradient (Adam's 1/sqrt(v) would amplify float noise of tiny
    # gradients), and the optimizer state is parameter-shaped (the checkpoint holds a sharded one).
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    update = ShardedUpdate(sharding.MeshConfig(**MESH), model, tx, LossConfig(lam=0.5), micro_batch_size=M)
    before = _flat(nnx.state(update.model()))
    rng = np.random.default_rng(0)
    action = rng.random((A, M, T)) < 0.4
    insight = (rng.random((A, M, T)) < 0.2) & ~action
    action[..., 0] = insight[..., 0] = False
    batch = TrainBatch(  # host arrays, as batching.pack makes them: every process holds the same whole batch
        ids=rng.integers(0, 512, (A, M, T)).astype(np.int32),
        old_logprobs=(-rng.random((A, M, T)) * 6).astype(np.float32),
        advantages=rng.normal(size=(A, M)).astype(np.float32),
        action_mask=action,
        insight_mask=insight,
    )
    result["metrics"] = {k: float(v) for k, v in update.step(batch).items()}
    after = _flat(nnx.state(update.model()))  # whole, on every process (a gather across the pair)
    result["sharded_leaves"] = sum(any(s is not None for s in x.sharding.spec) for x in jax.tree.leaves(update.params))
    result["max_update"] = max(float(np.max(np.abs(after[k] - before[k]))) for k in after)
    if pid == 0:
        np.savez(os.path.join(out, f"params_{role}.npz"), **after)

    if role == "pair":
        abstract_params, abstract_opt = update.abstract()
        with Checkpointer(os.path.join(out, "checkpoints"), keep=None) as ckpt:
            ckpt.save(
                1,
                params=update.params,
                opt_state=update.opt_state,
                rng=jax.random.key(7),
                meta={"phase": 1},
                model_config=_model_config(),
            )
            ckpt.wait_until_finished()
            restored = ckpt.restore(1, abstract_params=abstract_params, abstract_opt_state=abstract_opt)
        got, want = _flat(distributed.host_local(restored.params)), _flat(distributed.host_local(update.params))
        result["pair_restore_max_diff"] = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
        got_o, want_o = (
            _flat(distributed.host_local(restored.opt_state)),
            _flat(distributed.host_local(update.opt_state)),
        )
        result["pair_restore_opt_max_diff"] = max(float(np.max(np.abs(got_o[k] - want_o[k]))) for k in want_o)
        result["pair_restore_rng"] = np.asarray(jax.random.key_data(restored.rng)).tolist()
        result |= _workdir_rules(os.path.join(out, "run"))
    with open(os.path.join(out, f"result_{role}_{pid}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def _workdir_rules(workdir: str) -> dict[str, Any]:
    """The claim, the outputs and the collectives of a multi-process run, as each process sees them."""
    import jax

    from rltldr_jax import distributed
    from rltldr_jax.train.report import MetricsLog
    from rltldr_jax.train.resume import LOCK, claim_workdir, move_aside
    from rltldr_jax.train.summary import SummaryWriter

    r: dict[str, Any] = {}
    lock = claim_workdir(workdir, resume=False, restart=False)
    r["lock"] = type(lock).__name__
    summary = SummaryWriter(os.path.join(workdir, "tb"), resumed_at=(2, 4, 0.5))  # (the resume marker too)
    summary.scalars({"x": 1.0}, 3, tokens=5, walltime=1.0)
    summary.close()
    MetricsLog(os.path.join(workdir, "metrics.jsonl"), keep_through_phase=0).write("phase", 1, 3, {"x": 1.0})
    distributed.barrier("outputs written")
    with open(os.path.join(workdir, LOCK), encoding="utf-8") as f:
        r["lock_file"] = f.read().strip()
    distributed.barrier("lock file read")  # (process 0's second claim below rewrites the file: read it first on both)
    r["event_files"] = sorted(
        os.path.relpath(os.path.join(d, n), workdir)
        for d, _, files in os.walk(os.path.join(workdir, "tb"))
        for n in files
    )
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        r["metrics_lines"] = len(f.readlines())
    lock.close()
    try:  # the workdir now holds a run: process 0 refuses it, and so does every process
        claim_workdir(workdir, resume=False, restart=False)
        r["second_claim"] = "accepted"
    except ValueError as e:
        r["second_claim"] = type(e).__name__
    r["moved_to"] = move_aside(workdir, [os.path.join(workdir, "metrics.jsonl")], "test")
    r["from_main"] = distributed.from_main_process(lambda: {"process": jax.process_index(), "pid": os.getpid()})
    try:
        distributed.from_main_process(lambda: int("not a number on process 0"))
        r["main_error"] = None
    except ValueError as e:
        r["main_error"] = str(e)
    try:
        distributed.from_main_process(threading.Lock)  # a result that cannot be sent
        r["unpicklable"] = None
    except RuntimeError as e:
        r["unpicklable"] = str(e).split(" (")[0]
    r["gathered"] = distributed.gather_objects(("process", jax.process_index()))
    r["pid"] = os.getpid()
    return r


# ----------------------------------------------------------------------------------------------------
# The test
# ----------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """Runs the pair and the single process at once; returns their results and the output directory."""
    import jax
    from helpers import fake_devices_xla_flags

    out = str(tmp_path_factory.mktemp("multihost"))
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "OMPI_", "TPU_WORKER"))}
    base |= {"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    cache = jax.config.jax_compilation_cache_dir  # conftest's on-disk cache of compiled programs: later runs reuse them
    if cache:
        base |= {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}
    pair_env = base | {"XLA_FLAGS": fake_devices_xla_flags(4)}
    commands = [
        (
            [sys.executable, __file__, "pair", out],
            pair_env
            | {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
        ),
        ([sys.executable, __file__, "pair", out, str(port)], pair_env),
        ([sys.executable, __file__, "single", out], base | {"XLA_FLAGS": fake_devices_xla_flags(8)}),
    ]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd, env in commands
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the processes did not finish in {TIMEOUT_S} s")
    for (cmd, _), p, log in zip(commands, procs, logs, strict=True):
        assert p.returncode == 0, f"{' '.join(cmd[2:])} failed:\n{log[-4000:]}"

    def load(name: str) -> dict[str, Any]:
        with open(os.path.join(out, name), encoding="utf-8") as f:
            return json.load(f)

    return {
        "out": out,
        "p0": load("result_pair_0.json"),
        "p1": load("result_pair_1.json"),
        "one": load("result_single_0.json"),
    }


def test_two_processes_join_and_run_the_step_of_one(runs):
    p0, p1, one = runs["p0"], runs["p1"], runs["one"]
    assert (p0["joined"], p0["process_count"], p0["devices"], p0["local_devices"]) == (True, 2, 8, 4)
    assert (p1["joined"], p1["process_count"], p1["devices"], p1["local_devices"]) == (True, 2, 8, 4)
    assert (one["joined"], one["process_count"], one["devices"]) == (False, 1, 8)  # alone: no flags, no error
    assert p0["sharded_leaves"] == one["sharded_leaves"] >= 10  # the same layout, really sharded
    assert p0["metrics"] == p1["metrics"]  # replicated outputs: the same numbers on both processes
    for k, v in one["metrics"].items():
        assert p0["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert p0["metrics"]["loss"] != 0 and p0["metrics"]["grad_norm"] > 0
    pair, single = (
        np.load(os.path.join(runs["out"], "params_pair.npz")),
        np.load(os.path.join(runs["out"], "params_single.npz")),
    )
    assert sorted(pair.files) == sorted(single.files)
    assert one["max_update"] > 1e-3  # the step moved the parameters...
    assert max(float(np.max(np.abs(pair[k] - single[k]))) for k in pair.files) < 1e-6  # ...the same on 2 processes


def test_a_checkpoint_of_the_pair_restores_in_one_process(runs):
    import jax
    from flax import nnx

    from rltldr_jax.checkpoint import Checkpointer
    from rltldr_jax.models import ModelSpec

    p0 = runs["p0"]
    assert p0["pair_restore_max_diff"] == 0.0 and p0["pair_restore_opt_max_diff"] == 0.0  # the pair restores it too
    assert p0["pair_restore_rng"] == runs["p1"]["pair_restore_rng"]
    abstract = nnx.split(ModelSpec(_model_config()).abstract())[1]
    with Checkpointer(os.path.join(runs["out"], "checkpoints"), keep=None, create=False) as ckpt:
        assert ckpt.all_steps() == [1]
        restored = ckpt.restore(1, abstract_params=abstract)  # one process, one device
    assert restored.meta == {"phase": 1}
    assert np.array_equal(np.asarray(jax.random.key_data(restored.rng)), np.asarray(p0["pair_restore_rng"]))
    got, saved = _flat(restored.params), np.load(os.path.join(runs["out"], "params_pair.npz"))
    assert sorted(got) == sorted(saved.files)
    for k in saved.files:
        np.testing.assert_array_equal(got[k], saved[k], err_msg=k)


def test_process_0_claims_writes_and_decides_for_both(runs):
    p0, p1 = runs["p0"], runs["p1"]
    assert (p0["lock"], p1["lock"]) == ("TextIOWrapper", "FollowerLock")  # process 1 does not refuse its own run
    assert p0["lock_file"] == p1["lock_file"] == str(p0["pid"])  # process 0 holds the lock
    assert p0["second_claim"] == p1["second_claim"] == "RunExistsError"  # process 0's refusal, raised on both
    # One set of event files (one per x-axis) and one metrics line: process 1 wrote nothing.
    assert len(p0["event_files"]) == 3 and p0["event_files"] == p1["event_files"]
    assert p0["metrics_lines"] == p1["metrics_lines"] == 1
    assert p0["moved_to"] == p1["moved_to"] and p0["moved_to"].startswith(
        os.path.join(runs["out"], "run", "discarded-")
    )
    assert os.path.isfile(os.path.join(p0["moved_to"], "metrics.jsonl"))
    assert p0["from_main"] == p1["from_main"] == {"process": 0, "pid": p0["pid"]}
    assert p0["main_error"] == p1["main_error"] == "invalid literal for int() with base 10: 'not a number on process 0'"
    assert (
        p0["unpicklable"]
        == p1["unpicklable"]
        == "process 0 cannot send its result to the other processes: it does not pickle"
    )
    assert p0["gathered"] == p1["gathered"] == [["process", 0], ["process", 1]]


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
