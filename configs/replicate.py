"""The small-scale replication: a policy pretrained from scratch in the crafting world with hidden rules.

    python launch/replicate.py --config=configs/replicate.py:quick        # grpo vs rltldr, 3 seeds, minutes on a CPU
    python launch/replicate.py --config=configs/replicate.py              # the full grid, 3 seeds, hours on 2 cores
    python launch/train.py --config=configs/replicate.py --ablation=grpo  # one arm as an ordinary run

Presets: `default` (the full grid), `quick`, `gpu` and `smoke`. The presets, the arms (`ARMS`), the grids (`GRIDS`)
and the checks (`CHECKS`) are `rltldr_jax/config/replicate.py`, where each is documented with the reasons for its
choices; they are re-exported here, so that `from configs import replicate` keeps working.
"""

from rltldr_jax.config.replicate import (  # noqa: F401
    ARMS,
    CHECKS,
    CORE_ARMS,
    DEFAULT_LAMBDA,
    GRIDS,
    JOBS,
    PRESETS,
    arm_config,
    get_config,
)
