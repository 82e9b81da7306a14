"""The small-scale replication: a grid of ordinary training runs (arms × seeds), the base policy's checks, the
report."""

from __future__ import annotations

import importlib
from typing import Any

# The main name, imported on first use (`from rltldr_jax.replication import run_replication`).
_EXPORTS = {
    "run_replication": "rltldr_jax.replication.driver",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
