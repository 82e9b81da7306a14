"""The base config and its validation, now `rltldr_jax/config/base.py` (every key is documented in
`rltldr_jax/settings.py`); this file keeps `from configs import base` working."""

from rltldr_jax.config.base import *  # noqa: F403
