"""The second round of the small-scale replication (forge world, four evaluation tiers, controls that can fail,
20 seeds, pre-registered in docs/replication/v2/preregistration.md).

    python launch/replicate.py --config=configs/replicate_v2.py              # the pre-registered grid
    python launch/replicate.py --config=configs/replicate_v2.py:quick        # grpo vs rltldr, seed 0 (minutes)
    python launch/replicate.py --config=configs/replicate_v2.py:pilot        # pilots (seeds >= 100)

The presets, arms, seeds per arm and checks are `rltldr_jax/config/replicate_v2.py`, documented there with the
reasons for each choice; they are re-exported here.
"""

from rltldr_jax.config.replicate_v2 import (  # noqa: F401
    ANALYSED_PRESETS,
    ARM_DIRS,
    ARMS,
    CHECKS,
    DEFAULT_LAMBDA,
    EVAL_SPLITS,
    GRID_SEEDS,
    GRIDS,
    JOBS,
    PRESETS,
    analysis,
    arm_config,
    get_config,
)
