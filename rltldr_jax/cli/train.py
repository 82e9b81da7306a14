"""Train a policy with RLTL;DR (or any baseline/ablation) from a config.

    python launch/train.py --config=configs/sapi.py:tiny --dry_run
    python launch/train.py --config=configs/sapi.py --ablation=grpo --config.seed=1 --dry_run
    python launch/train.py --list_ablations
    python launch/train.py --config=configs/sapi.py:tiny                 # a few phases on a laptop CPU
    python launch/train.py --config=configs/sapi.py:tiny --resume        # continue from the last checkpoint
    python launch/train.py --config=configs/sapi.py:tiny --resume_step=2 # continue from checkpoint step 2
    python launch/train.py --config=configs/sapi.py:tiny --restart       # start over (the old run is moved aside)

`--config=FILE[:PRESET]` loads `get_config(PRESET)` from FILE; `--ablation=NAME` applies a named row of
rltldr_jax/config/ablations.py; `--config.KEY=VALUE` flags override last. The resolved config is validated: an unknown
key or an invalid value stops here with a message naming it.

SIGTERM (a scheduler's preemption or time limit) or Ctrl-C stops the run at the next safe point (after the phase
in progress, or before an evaluation) with a checkpoint and one line, "stopped by SIGTERM at phase 3; checkpoint
saved (step 3); resume with --resume", exit status 128 + the signal's number (143, 130); a second signal stops at
once. The resumed run redoes an evaluation the stopped run did not record, and equals an uninterrupted one.

A new run in a workdir that already holds one is refused: `--resume` continues it (from the newest intact
checkpoint; what the stopped run wrote after it is moved aside or purged from TensorBoard), `--restart` moves it
to `{workdir}.old-<time>` first. A resumed run logs every config key that changed and refuses changes to what
the run trains (loss, optimizer, rollout, insight, env, model, seed, ...) unless `--allow_config_change`.

Multi-host: start one process per host with `--coordinator_address=HOST:PORT --num_processes=N --process_id=I`
(or the JAX_* environment; SLURM / Open MPI / Cloud TPU are detected without flags): rltldr_jax/cli/multihost.py.
"""

from __future__ import annotations

import os
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

_CONFIG, _ABLATION = define_config_flags("A named baseline/ablation of rltldr_jax/config/ablations.py.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config and exit.")
_LIST = flags.DEFINE_bool("list_ablations", False, "List every ablation with its paper row and exit.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest intact checkpoint in the workdir.")
_RESUME_STEP = flags.DEFINE_integer("resume_step", None, "Continue from this checkpoint step (implies --resume).")
_RESTART = flags.DEFINE_bool(
    "restart", False, "Start over in a workdir that holds a run, moving it to {workdir}.old-<time>."
)
_ALLOW_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "On resume, accept changed keys that define what the run trains (loss, optim, ...)."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --config.loss.lam=0.1")
    if _LIST.value:
        print(ablations.describe())
        return
    config = resolve_config(_CONFIG, _ABLATION)
    if config.mode == "sft":
        sys.exit(
            f"error: {_ABLATION.value or 'this config'} is an offline SFT baseline (mode='sft'): run it with "
            "launch/sft.py and --config.sft.rollouts_dir=<an RLTL;DR run's workdir>"
        )
    check_runnable(config, dry_run=_DRY_RUN.value)  # servers, weights: before anything is built
    quiet_logging()  # before JAX starts: no back-end probe or orbax INFO lines; one line per phase
    use_compile_cache(config.compile.cache_dir)  # before anything compiles
    start_distributed()  # before any other JAX call; a single process without flags runs alone
    config = base_policy(config)
    from rltldr_jax.checkpoint import CheckpointSaveError
    from rltldr_jax.distributed import is_main_process
    from rltldr_jax.train.loop import Trainer
    from rltldr_jax.train.report import run_summary
    from rltldr_jax.train.step import NonFiniteError

    try:
        trainer = Trainer(
            config,
            resume=_RESUME.value,
            restart=_RESTART.value,
            resume_step=_RESUME_STEP.value,
            allow_config_change=_ALLOW_CHANGE.value,
            progress=show_progress(),
        )
    except (ValueError, OSError) as e:  # missing weights, servers, data, a run in the way, a workdir: what to fix
        sys.exit(f"error: {e}")
    try:
        trainer.run()
    except NonFiniteError as e:
        sys.exit(f"error: {e}")
    except (CheckpointSaveError, OSError) as e:  # a full disk, a workdir made read-only meanwhile, ...
        sys.exit(f"error: {e}; fix it, then continue with --resume")
    if not is_main_process():
        return  # process 0 prints where the outputs are
    print(
        run_summary(
            trainer.workdir,
            launch_dir=os.path.dirname(sys.argv[0]) if sys.argv[0].endswith(".py") else None,  # else rltldr-train
            config_args=_config_args(sys.argv),
            rollouts=config.rollout.save_rollouts,
        )
    )


def _config_args(argv: list[str]) -> list[str]:
    """The `--config...` and `--ablation` arguments of the command line (for the printed evaluation command)."""
    out, i = [], 1
    while i < len(argv):
        arg, i = argv[i], i + 1
        if not arg.startswith(("--config", "--noconfig.", "--ablation")):
            continue
        if "=" not in arg and i < len(argv) and not argv[i].startswith("-"):  # the form `--flag value`
            arg, i = f"{arg}={argv[i]}", i + 1
        out.append(arg)
    return out


def run() -> None:
    """`rltldr-train` (console script) and `python launch/train.py`."""
    as_main(__name__)
    run_launcher(main, hint="; resume with --resume")


if __name__ == "__main__":
    run()
