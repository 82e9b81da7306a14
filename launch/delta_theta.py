"""Δθ between two checkpoints (the paper's Table 7): ‖Δθ‖₁, ‖Δθ‖₂, share beyond bf16 precision, Gini of

The launcher is rltldr_jax/cli/delta_theta.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-delta-theta`."""

from rltldr_jax.cli.delta_theta import main, run  # noqa: F401

if __name__ == "__main__":
    run()
