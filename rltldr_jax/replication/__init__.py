"""The small-scale replication: a grid of ordinary training runs (arms × seeds), the base policy's checks, the
report."""

from __future__ import annotations

from rltldr_jax.lazy_exports import lazy_exports

# The main name, imported on first use (`from rltldr_jax.replication import run_replication`).
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "run_replication": "rltldr_jax.replication.driver",
    },
)
