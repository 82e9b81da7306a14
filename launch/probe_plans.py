"""Probes over training for a replication grid: oracle vs public plan log-probabilities on the held-out tiers and
parameter drift, per kept checkpoint of every run.

The launcher is rltldr_jax/cli/probe_plans.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-probe-plans`."""

from rltldr_jax.cli.probe_plans import main, run  # noqa: F401

if __name__ == "__main__":
    run()
