"""Analyses of a finished training run: saved rollouts (insight evolution, revisits, categories, reliance) and
weights."""

from __future__ import annotations

from rltldr_jax.lazy_exports import lazy_exports

# The main names, imported on first use (`from rltldr_jax.analysis import insight_evolution`): importing the
# package or one of its modules does not import the others (reliance.py pulls in JAX and the model).
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DeltaThetaError": "rltldr_jax.analysis.delta_theta",
        "delta_stats": "rltldr_jax.analysis.delta_theta",
        "insight_categories": "rltldr_jax.analysis.rollouts",
        "insight_curves": "rltldr_jax.analysis.insight_curves",
        "insight_evolution": "rltldr_jax.analysis.rollouts",
        "insight_reliance": "rltldr_jax.analysis.reliance",
        "open_checkpoint": "rltldr_jax.analysis.delta_theta",
        "revisited_tasks": "rltldr_jax.analysis.rollouts",
    },
)
