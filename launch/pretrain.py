"""Pretrain a small policy from scratch on an environment's demonstrations (the small-scale replication's base).

The launcher is rltldr_jax/cli/pretrain.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-pretrain`."""

from rltldr_jax.cli.pretrain import main, run  # noqa: F401

if __name__ == "__main__":
    run()
