"""Train a policy with RLTL;DR (or any baseline/ablation) from a config.

The launcher is rltldr_jax/cli/train.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-train`."""

from rltldr_jax.cli.train import main, run  # noqa: F401

if __name__ == "__main__":
    run()
