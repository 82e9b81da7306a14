"""Offline SFT baselines of Table 2 from the saved rollouts of an RLTL;DR run.

    python launch/sft.py --config=configs/sapi.py --ablation=sft_rollouts_all --config.sft.rollouts_dir=runs/sapi-rltldr
    python launch/sft.py --config=configs/sapi.py:tiny --ablation=sftldr_dedup --config.sft.rollouts_dir=runs/sapi-tiny
    python launch/sft.py --list_ablations                                        # the mode="sft" rows

The ablation sets `mode="sft"` and `sft.data` / `sft.num_rollouts` / `sft.deduplicate`; `sft.rollouts_dir` points at
the RLTL;DR run whose `rollouts/phase_*.jsonl` are the data (train it first with launch/train.py; rollouts are saved
by default). Checkpoints, event files and the evaluation go to the config's workdir (rltldr_jax/train/sft.py).

Multi-host: one process per host with `--coordinator_address=HOST:PORT --num_processes=N --process_id=I` (or the
JAX_* environment; SLURM / Open MPI / Cloud TPU are detected without flags): rltldr_jax/cli/multihost.py.
"""

from __future__ import annotations

import sys

from absl import app, flags

from rltldr_jax.cli.common import (
    as_main,
    check_runnable,
    define_config_flags,
    quiet_logging,
    resolve_config,
    run_launcher,
    use_compile_cache,
)
from rltldr_jax.cli.multihost import base_policy, show_progress, start_distributed
from rltldr_jax.config import ablations

_CONFIG, _ABLATION = define_config_flags("An offline SFT row of rltldr_jax/config/ablations.py (sft_* or sftldr*).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config and exit.")
_LIST = flags.DEFINE_bool("list_ablations", False, "List the offline SFT ablations and exit.")
_RESTART = flags.DEFINE_bool(
    "restart", False, "Start over in a workdir that holds a run, moving it to {workdir}.old-<time>."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --ablation=sftldr")
    if _LIST.value:
        print(
            "\n".join(
                line
                for line in ablations.describe().splitlines()
                if ablations.ABLATIONS[line.split()[0]].overrides.get("mode") == "sft"
            )
        )
        return
    config = resolve_config(_CONFIG, _ABLATION)
    if config.mode != "sft":
        sys.exit(
            "error: launch/sft.py runs the offline SFT rows (mode='sft'): pass --ablation=sft_rollouts_all, "
            "sft_rollouts_1k, sft_rollouts_100, sftldr or sftldr_dedup; RL runs use launch/train.py"
        )
    check_runnable(config, dry_run=_DRY_RUN.value)  # servers, weights: before anything is built
    quiet_logging()
    use_compile_cache(config.compile.cache_dir)  # before anything compiles
    start_distributed()  # before any other JAX call; a single process without flags runs alone
    config = base_policy(config)
    from rltldr_jax.checkpoint import CheckpointSaveError
    from rltldr_jax.distributed import is_main_process
    from rltldr_jax.train.sft import run_sft
    from rltldr_jax.train.step import NonFiniteError

    try:
        metrics = run_sft(config, progress=show_progress(), restart=_RESTART.value)
    except (ValueError, OSError, NonFiniteError, CheckpointSaveError) as e:
        sys.exit(f"error: {e}")
    if not is_main_process():
        return
    k = config.eval.attempts_per_task
    print(
        f"sft ({config.sft.data}): final nll {metrics['sft/nll']:.4f}; "
        f"eval macro Pass@1 {metrics['eval/pass@1/all']:.4f}, "
        f"Pass@{k} {metrics[f'eval/pass@{k}/all']:.4f}"
    )


def run() -> None:
    """`rltldr-sft` (console script) and `python launch/sft.py`."""
    as_main(__name__)
    run_launcher(main, hint="; an offline SFT run is not resumable: run it again with --restart")


if __name__ == "__main__":
    run()
