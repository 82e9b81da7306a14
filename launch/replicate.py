"""The small-scale replication: every (arm, seed) of a grid as its own training run, then the table and the curves.

The launcher is rltldr_jax/cli/replicate.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-replicate`."""

from rltldr_jax.cli.replicate import main, run  # noqa: F401

if __name__ == "__main__":
    run()
