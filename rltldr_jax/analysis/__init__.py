"""Analyses of a finished training run: saved rollouts (insight evolution, revisits, categories, reliance) and
weights."""

from __future__ import annotations

import importlib
from typing import Any

# The main names, imported on first use (`from rltldr_jax.analysis import insight_evolution`): importing the
# package or one of its modules does not import the others (reliance.py pulls in JAX and the model).
_EXPORTS = {
    "DeltaThetaError": "rltldr_jax.analysis.delta_theta",
    "delta_stats": "rltldr_jax.analysis.delta_theta",
    "insight_categories": "rltldr_jax.analysis.rollouts",
    "insight_curves": "rltldr_jax.analysis.insight_curves",
    "insight_evolution": "rltldr_jax.analysis.rollouts",
    "insight_reliance": "rltldr_jax.analysis.reliance",
    "open_checkpoint": "rltldr_jax.analysis.delta_theta",
    "revisited_tasks": "rltldr_jax.analysis.rollouts",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
