"""Analyse a training run's saved rollouts: tables (CSV) and plots (PNG) of the paper's appendix analyses.

The launcher is rltldr_jax/cli/analyze_rollouts.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-analyze-rollouts`."""

from rltldr_jax.cli.analyze_rollouts import main, run  # noqa: F401

if __name__ == "__main__":
    run()
