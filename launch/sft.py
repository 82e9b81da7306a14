"""Offline SFT baselines of Table 2 from the saved rollouts of an RLTL;DR run.

The launcher is rltldr_jax/cli/sft.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-sft`."""

from rltldr_jax.cli.sft import main, run  # noqa: F401

if __name__ == "__main__":
    run()
