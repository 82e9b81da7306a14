"""Pretrain a small policy from scratch on an environment's demonstrations (the small-scale replication's base).

    python launch/pretrain.py --config=configs/replicate.py                 # the default preset's policy, seed 0
    python launch/pretrain.py --config=configs/replicate.py:quick --config.seed=1 --checks

Prints the checkpoint directory (an HF directory with tokenizer.json that `--config.model.checkpoint` takes); it
is cached under `pretrain.cache_dir` by a hash of its settings, so a second call returns at once. Every launcher
does this by itself when `pretrain.steps > 0` and no `model.checkpoint` is given. `--checks` also runs the base
policy's checks before RL (paper App. B: i.i.d. Pass@64 on the hard training tasks, what insights in context do).

It runs in one process (the base policies are small): a multi-host job (launch/train.py, launch/sft.py with
--coordinator_address etc.) takes the cached result and refuses to pretrain; under srun / mpirun start this once
(`srun --ntasks=1`), where every host sees `pretrain.cache_dir`.
"""

from __future__ import annotations

import sys

from absl import app, flags

from rltldr_jax.cli.common import (
    as_main,
    define_config_flags,
    parse_flags,
    quiet_logging,
    resolve_config,
    use_compile_cache,
    with_pretrained,
)

_CONFIG, _ABLATION = define_config_flags("A named baseline/ablation of rltldr_jax/config/ablations.py.")
_CHECKS = flags.DEFINE_bool("checks", False, "Also run the base policy's checks (i.i.d. Pass@64, insight curves).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --config.pretrain.steps=500")
    config = resolve_config(_CONFIG, _ABLATION)
    from rltldr_jax.distributed import distributed_plan

    try:
        plan = distributed_plan()
    except ValueError:
        plan = None  # the environment describes a job wrongly: irrelevant here, this launcher runs alone
    if plan is not None:
        sys.exit(
            "error: launch/pretrain.py runs in one process, but this process is one of a multi-process job "
            f"({plan.source}): "
            "start it once (e.g. `srun --ntasks=1`, or without JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES)"
        )
    if config.pretrain.steps <= 0:
        sys.exit("error: pretrain.steps is 0 in this config: nothing to pretrain (e.g. --config=configs/replicate.py)")
    quiet_logging()
    use_compile_cache(config.compile.cache_dir)
    config = with_pretrained(config)
    print(config.model.checkpoint)
    if _CHECKS.value:
        from rltldr_jax.replication.checks import base_checks
        from rltldr_jax.replication.driver import checks_line

        checks, _ = base_checks(config, max_k=config.rollout.group_size, progress=sys.stderr.isatty())
        print(checks_line(checks))


def run() -> None:
    """`rltldr-pretrain` (console script) and `python launch/pretrain.py`."""
    as_main(__name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
