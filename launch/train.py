"""Train a policy with RLTL;DR (or any baseline/ablation) from a config.

    python launch/train.py --config=configs/sapi.py:tiny --dry_run
    python launch/train.py --config=configs/sapi.py --ablation=grpo --config.seed=1 --dry_run
    python launch/train.py --list_ablations
    python launch/train.py --config=configs/sapi.py:tiny                 # a few phases on a laptop CPU
    python launch/train.py --config=configs/sapi.py:tiny --resume        # continue from the last checkpoint

`--config=FILE[:PRESET]` loads `get_config(PRESET)` from FILE; `--ablation=NAME` applies a named row of
configs/ablations.py; `--config.KEY=VALUE` flags override last. The resolved config is validated: an unknown
key or an invalid value stops here with a message naming it.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # configs/ is a directory of the repository, not an installed package

from configs import ablations  # noqa: E402
from launch.common import define_config_flags, parse_flags, resolve_config  # noqa: E402

_CONFIG, _ABLATION = define_config_flags("A named baseline/ablation of configs/ablations.py.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config and exit.")
_LIST = flags.DEFINE_bool("list_ablations", False, "List every ablation with its paper row and exit.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in the workdir.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --config.loss.lam=0.1")
    if _LIST.value:
        print(ablations.describe())
        return
    config = resolve_config(_CONFIG, _ABLATION)
    if _DRY_RUN.value:
        print(config)
        return
    if config.mode == "sft":
        sys.exit(f"error: {_ABLATION.value or 'this config'} is an offline SFT baseline (mode='sft'): run it with "
                 "launch/sft.py and --config.sft.rollouts_dir=<an RLTL;DR run's workdir>")  # fmt: skip
    import logging

    from rltldr_jax.train.loop import Trainer

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every checkpoint step at INFO through absl
    logging.getLogger("rltldr_jax").setLevel(logging.INFO)  # one line per phase
    try:
        trainer = Trainer(config, resume=_RESUME.value, progress=sys.stderr.isatty())
    except (ValueError, FileNotFoundError) as e:  # missing weights, servers, data: say what and how to fix
        sys.exit(f"error: {e}")
    trainer.run()


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
