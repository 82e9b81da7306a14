"""Training: building a run from its config (setup.py), attempts to examples (batching.py), the jitted update step
(step.py), the phase loop (loop.py, `Trainer`), evaluation, the offline SFT baselines (sft.py), pretraining of the
replication's base policies (pretrain.py), resuming, stopping and the run summary."""

from __future__ import annotations

from rltldr_jax.lazy_exports import lazy_exports

# The main names, imported on first use (`from rltldr_jax.train import Trainer`): importing the package or one
# of its modules does not import the others (the trainer pulls in the models, engines and environments).
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "NonFiniteError": "rltldr_jax.train.step",
        "Trainer": "rltldr_jax.train.loop",
        "build_policy": "rltldr_jax.train.setup",
        "ensure_pretrained": "rltldr_jax.train.pretrain",
        "evaluate_checkpoint": "rltldr_jax.train.evaluation",
        "find_pretrained": "rltldr_jax.train.pretrain",
        "phase_examples": "rltldr_jax.train.batching",
        "pretrain": "rltldr_jax.train.pretrain",
        "run_sft": "rltldr_jax.train.sft",
        "run_summary": "rltldr_jax.train.report",
    },
)
