"""Evaluate a policy on held-out tasks: a fixed number of attempts per task, no insights; macro Pass@1 and Pass@K.

The launcher is rltldr_jax/cli/eval.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-eval`."""

from rltldr_jax.cli.eval import main, run  # noqa: F401

if __name__ == "__main__":
    run()
