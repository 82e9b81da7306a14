"""The named baselines and ablations, now `rltldr_jax/config/ablations.py`; this file keeps
`from configs import ablations` working."""

from rltldr_jax.config.ablations import *  # noqa: F403
