"""Insight exploration curves (App. E.8, Figures 11/12): Pass@k of a frozen policy against the number of attempts

The launcher is rltldr_jax/cli/insight_curves.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-insight-curves`."""

from rltldr_jax.cli.insight_curves import main, run  # noqa: F401

if __name__ == "__main__":
    run()
