"""The multi-process runtime: joining a multi-process job and the collectives between its processes.

`initialize_distributed` joins a multi-process job from flags, environment or a detected cluster
(`distributed_plan`, `detected_cluster`); `is_main_process`, `barrier`, `broadcast_object`, `gather_objects`,
`from_main_process`, `global_batch` and `host_local` are what the trainers use so that every process runs the same
steps on the same global batch while process 0 alone generates, logs and claims the workdir. The device mesh and
the logical-axis rules are `rltldr_jax.sharding`.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

T = TypeVar("T")

# One process per host (or per accelerator), all running the same program. The rules every trainer follows:
# - start-up: `initialize_distributed` before any other JAX call (the launchers do it first);
# - the mesh spans the devices of every process (`sharding.make_mesh` over `jax.devices()`); host batches become global
#   arrays with `global_batch` (every process holds the same whole batch and contributes its own devices' rows);
# - process 0 holds the generation engines and runs the collector and the evaluation; what it produced reaches
#   the others through `from_main_process` (pickled, broadcast), so every process builds the same examples and
#   feeds the same global batch into the jitted step;
# - process 0 alone writes event files, metrics.jsonl, rollout files and progress lines, and claims the workdir;
#   orbax checkpoints are saved and restored by every process (orbax's own rule; process 0 writes the metadata).
# Every helper below is a collective where it says so: all processes call it at the same point of the program.

#: The environment of an explicit multi-process job, what `--coordinator_address`, `--num_processes` and
#: `--process_id` default to (JAX reads the first itself; the other two are read here).
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
#: `initialize_distributed(mode=...)`: "auto" joins a job that flags, environment or a detected cluster describe and
#: runs alone otherwise; "on" always calls `jax.distributed.initialize` (JAX detects what is not given: Kubernetes,
#: mpi4py, ...); "off" never does.
DISTRIBUTED_MODES = ("auto", "on", "off")
_SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    """The arguments `initialize_distributed` gives `jax.distributed.initialize` (None: JAX detects it) and where
    they came from ("flags/environment" or the detected cluster's name)."""

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    source: str


def detected_cluster(env: Mapping[str, str] | None = None) -> str | None:
    """The cluster that `jax.distributed.initialize()` recognises by itself when this process is one of several:
    "SLURM" (srun with more than one task), "Open MPI" (mpirun with more than one rank) or "Cloud TPU" (GKE, more
    than one worker host). None otherwise: a plain machine, or a single-task SLURM job (`sbatch` without `srun`)."""
    env = os.environ if env is None else env

    def count(key: str) -> int:
        try:
            return int(env.get(key, "1"))
        except ValueError:
            return 1

    if all(k in env for k in _SLURM_KEYS) and count("SLURM_NTASKS") > 1:
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in env and count("OMPI_COMM_WORLD_SIZE") > 1:
        return "Open MPI"
    if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1:
        return "Cloud TPU"
    return None


def _env_int(env: Mapping[str, str], key: str, flag: str) -> int | None:
    value = env.get(key, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={value!r} is not an integer: set it to one (or pass {flag}=N)") from None


def distributed_plan(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    mode: str = "auto",
    env: Mapping[str, str] | None = None,
) -> DistributedPlan | None:
    """How this process joins a multi-process job; None when it runs alone (nothing to initialise).

    Explicit values win over the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID). With
    `mode="auto"`: any of them (with num_processes > 1) joins the job they describe, and on a cluster JAX detects
    itself (`detected_cluster`: SLURM, Open MPI, Cloud TPU) the missing ones are left to JAX; without a cluster all
    three are needed. num_processes=1 (or nothing at all on a plain machine) runs alone, no error.

    Raises:
      ValueError: an unknown mode, a value that is not an integer or out of range, an incomplete description
        outside a cluster, or explicit values with mode="off"; the message names the flag to fix.
    """
    env = os.environ if env is None else env
    if mode not in DISTRIBUTED_MODES:
        raise ValueError(f"--distributed={mode!r}: choose one of {', '.join(DISTRIBUTED_MODES)}")
    given = {
        k: v
        for k, v in (
            ("--coordinator_address", coordinator_address),
            ("--num_processes", num_processes),
            ("--process_id", process_id),
        )
        if v is not None
    }
    if mode == "off":
        if given:
            raise ValueError(
                f"--distributed=off runs one process, but {', '.join(given)} {'was' if len(given) == 1 else 'were'} "
                "given for a multi-process job: drop one or the other"
            )
        return None
    address = coordinator_address or env.get(ENV_COORDINATOR, "").strip() or None
    n = num_processes if num_processes is not None else _env_int(env, ENV_NUM_PROCESSES, "--num_processes")
    pid = process_id if process_id is not None else _env_int(env, ENV_PROCESS_ID, "--process_id")
    if n is not None and n < 1:
        raise ValueError(f"--num_processes={n} (or {ENV_NUM_PROCESSES}): a job has at least one process")
    if pid is not None and (pid < 0 or (n is not None and pid >= n)):
        raise ValueError(
            f"--process_id={pid} (or {ENV_PROCESS_ID}) must be in [0, num_processes"
            f"{f'={n}' if n is not None else ''}): number the processes 0, 1, ..., num_processes - 1"
        )
    cluster = detected_cluster(env)
    if mode == "on":
        return DistributedPlan(address, n, pid, cluster or "flags/environment")
    if n == 1:
        return None
    if address is None and n is None and pid is None:
        return DistributedPlan(None, None, None, cluster) if cluster else None
    if cluster is None:
        missing = [
            f"{flag} (or {var})"
            for flag, var, v in (
                ("--coordinator_address", ENV_COORDINATOR, address),
                ("--num_processes", ENV_NUM_PROCESSES, n),
                ("--process_id", ENV_PROCESS_ID, pid),
            )
            if v is None
        ]
        if missing:
            raise ValueError(
                f"a multi-process job outside SLURM / Open MPI / Cloud TPU needs all of --coordinator_address "
                f"(HOST:PORT of process 0), --num_processes and --process_id; missing {', '.join(missing)}"
            )
    return DistributedPlan(address, n, pid, cluster or "flags/environment")


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    mode: str = "auto",
) -> bool:
    """Joins the multi-process job that `distributed_plan` finds (one process per host or per accelerator), with
    `jax.distributed.initialize`; returns whether this process is part of one (False: it runs alone, no error).

    Must run before any other JAX call (the launchers call it first). On CPU the cross-process collectives go
    through gloo. Calling it again in a process that already joined does nothing.

    Raises:
      ValueError: the flags or environment describe the job wrongly (`distributed_plan`).
    """
    if jax.distributed.is_initialized():
        return True
    plan = distributed_plan(coordinator_address, num_processes, process_id, mode=mode)
    if plan is None:
        return False
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes need a collectives library
    jax.distributed.initialize(
        coordinator_address=plan.coordinator_address, num_processes=plan.num_processes, process_id=plan.process_id
    )
    return True


def is_main_process() -> bool:
    """Whether this is process 0 (always, in a single-process run): the one that writes logs and event files."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (a collective; nothing in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _padded(data: bytes, size: int) -> np.ndarray:
    out = np.zeros(size, np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


def _broadcast_bytes(data: bytes) -> bytes:
    """Process 0's `data` on every process (a collective; the others pass anything, e.g. b"")."""
    from jax.experimental import multihost_utils

    n = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
    size = 1 << max(n - 1, 0).bit_length()  # a power of two: one compiled broadcast per size class
    return np.asarray(multihost_utils.broadcast_one_to_all(_padded(data, size)))[:n].tobytes()


def broadcast_object(obj: T) -> T:
    """Process 0's `obj` on every process (any picklable value; a collective). Single process: `obj` itself."""
    if jax.process_count() == 1:
        return obj
    received = _broadcast_bytes(pickle.dumps(obj) if is_main_process() else b"")
    return obj if is_main_process() else pickle.loads(received)


def gather_objects(obj: Any) -> list[Any]:
    """Every process's `obj`, in process order (a collective). Single process: `[obj]`."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = pickle.dumps(obj)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(len(data)))).reshape(-1)
    size = 1 << max(int(sizes.max()) - 1, 0).bit_length()
    rows = np.asarray(multihost_utils.process_allgather(_padded(data, size))).reshape(len(sizes), size)
    return [pickle.loads(row[: int(n)].tobytes()) for row, n in zip(rows, sizes, strict=True)]


def from_main_process(fn: Callable[[], T]) -> T:
    """`fn()` run on process 0 only, its result broadcast to every process (a collective): how work that needs the
    generation engines (collection, evaluation) or the filesystem (claiming the workdir) is done once. An exception
    `fn` raises on process 0 is raised on every process (the same type and message where it pickles; a result that
    does not pickle is an error on every process too)."""
    if jax.process_count() == 1:
        return fn()
    if not is_main_process():
        ok, value = pickle.loads(_broadcast_bytes(b""))
        if not ok:
            raise value
        return value
    error: Exception | None = None
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 (re-raised below, on every process)
        error = e
    try:
        data = pickle.dumps((True, value) if error is None else (False, error))
    except Exception as e:  # noqa: BLE001
        if error is None:  # the result: the same error everywhere
            error = RuntimeError(f"process 0 cannot send its result to the other processes: it does not pickle ({e})")
            data = pickle.dumps((False, error))
        else:  # the exception: its type and message
            data = pickle.dumps((False, RuntimeError(f"process 0 failed: {type(error).__name__}: {error}")))
    _broadcast_bytes(data)
    if error is not None:
        raise error
    return value


def global_batch(tree: T, sharding: jax.sharding.Sharding) -> T:
    """Host arrays (the same whole batch on every process) as global arrays with `sharding`: each process fills its
    own devices' shards. Single process: `tree` unchanged (jit places it). Leaves that are already jax.Arrays and
    None fields stay as they are."""
    if jax.process_count() == 1:
        return tree

    def one(x):
        if isinstance(x, jax.Array):
            return x
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree)


def _identity(x: jax.Array) -> jax.Array:
    return x


def host_local(tree: T) -> T:
    """A copy of every array of `tree` on this process's first device, whole (a collective in a multi-process run:
    each array is gathered from the processes holding its shards, one array at a time). Single process: `tree`."""
    if jax.process_count() == 1:
        return tree
    device = jax.local_devices()[0]

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return jax.device_put(x, device)
        replicated = NamedSharding(x.sharding.mesh, PartitionSpec()) if isinstance(x.sharding, NamedSharding) else None
        if replicated is None:
            raise TypeError(f"host_local gathers NamedSharding arrays; got {x.sharding!r}")
        whole = jax.jit(_identity, out_shardings=replicated)(x)  # (top-level function: compiled once per shape)
        return jax.device_put(whole.addressable_data(0), device)

    return jax.tree.map(one, tree)
