"""Multi-host start-up of the launchers that train on a mesh (launch/train.py, launch/sft.py): flags, joining the
job, quiet followers, and the base policy every process must find.

    # two hosts, explicit (or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID in the environment):
    python launch/train.py --config=configs/sapi.py --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0
    python launch/train.py --config=configs/sapi.py --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=1
    # SLURM (srun with more than one task), Open MPI, Cloud TPU: detected, no flags
    srun --nodes=2 --ntasks-per-node=1 python launch/train.py --config=configs/sapi.py
    # other clusters JAX knows (Kubernetes, mpi4py): --distributed=on

A single process with none of these runs alone, as before. The rules of a multi-process run (who collects,
writes, checkpoints) are in rltldr_jax/distributed.py.
"""

from __future__ import annotations

import logging
import sys

from absl import flags

from rltldr_jax.settings import Settings, replace

_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "Multi-host: HOST:PORT of process 0 (default: $JAX_COORDINATOR_ADDRESS; detected on clusters).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes",
    None,
    "Multi-host: processes in the job, one per host (default: $JAX_NUM_PROCESSES; detected on clusters).",
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id",
    None,
    "Multi-host: this process's index, 0 .. num_processes-1 (default: $JAX_PROCESS_ID; detected on clusters).",
)
_MODE = flags.DEFINE_enum(
    "distributed",
    "auto",
    ["auto", "on", "off"],  # distributed.DISTRIBUTED_MODES (JAX is imported later, not here)
    "auto: join the job the flags, environment or a detected cluster (SLURM, Open MPI, Cloud TPU) describe, else run "
    "alone; on: always call jax.distributed.initialize (JAX detects the rest); off: run alone.",
)

log = logging.getLogger("rltldr_jax.launch")


def start_distributed() -> bool:
    """Joins the multi-process job the flags describe (before any other JAX call; after `quiet_logging`); returns
    whether there is one. Processes other than 0 then log errors only (they run the same steps as process 0, whose
    lines and warnings speak for all). A wrong description exits with its message."""
    from rltldr_jax import distributed

    try:
        joined = distributed.initialize_distributed(
            _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, mode=_MODE.value
        )
    except ValueError as e:
        sys.exit(f"error: {e}")
    if joined:
        import jax

        if not distributed.is_main_process():
            logging.getLogger("rltldr_jax").setLevel(logging.ERROR)
        log.info(
            "multi-host job: %d processes, %d devices (%d here)",
            jax.process_count(),
            jax.device_count(),
            jax.local_device_count(),
        )
    return joined


def show_progress() -> bool:
    """Progress bars: on a terminal, from process 0 only."""
    from rltldr_jax import distributed

    return sys.stderr.isatty() and distributed.is_main_process()


def base_policy(config: Settings) -> Settings:
    """`rltldr_jax.cli.common.with_pretrained` for a single process. In a multi-process job the base policy must exist
    already (cached or shipped, on every process): pretraining is a one-process job (`launch/pretrain.py`), and a
    missing one exits on every process saying so."""
    import jax

    from rltldr_jax import distributed
    from rltldr_jax.cli.common import with_pretrained

    if jax.process_count() == 1 or config.pretrain.steps <= 0 or config.model.checkpoint:
        return with_pretrained(config)
    from rltldr_jax.train.pretrain import find_pretrained, pretrained_dir

    found = find_pretrained(config)
    missing = [i for i, path in enumerate(distributed.gather_objects(found)) if path is None]
    if missing:
        sys.exit(
            f"error: the base policy of this config is not pretrained yet ({pretrained_dir(config)} is missing on "
            f"process(es) {', '.join(map(str, missing))}): pretraining runs in one process, so run launch/pretrain.py "
            "with the same --config flags once, on a filesystem every host sees, then start this job again"
        )
    return replace(config, {"model.checkpoint": found})
