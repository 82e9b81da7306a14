"""Probes over training for a replication grid (the second round): per kept checkpoint of every run, on the held-out
tiers, the no-insight log-probability of the oracle plan against the public plan, and the parameter drift from the
base policy (rltldr_jax/analysis/plan_probes.py).

    python launch/probe_plans.py --grid=runs/replicate_v2                      # every finished run
    python launch/probe_plans.py --grid=runs/replicate_v2 --arms=rltldr,strict_control --tasks=24

Writes {grid}/probes.csv (arm, seed, step, env_steps, set, tasks, oracle_logprob, public_logprob,
oracle_minus_public, oracle_preferred, drift) and {grid}/probes.png (means over seeds per arm).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from rltldr_jax.cli.common import as_main, define_path, quiet_logging, run_launcher

_GRID = define_path("grid", None, "A replication grid's directory (launch/replicate.py --out).")
_ARMS = flags.DEFINE_string("arms", "", "Comma-separated arms to probe (default: every finished run).")
_SETS = flags.DEFINE_string("sets", "tier2,tier3,tier4", "Comma-separated evaluation sets of the world to probe on.")
_TASKS = flags.DEFINE_integer("tasks", 48, "Tasks per set (the first of the grid's fixed order).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --grid=runs/replicate_v2")
    if not _GRID.value or not os.path.isdir(os.path.join(_GRID.value, "runs")):
        sys.exit(f"error: --grid={_GRID.value!r} is not a replication grid's directory (no runs/ in it)")
    if _TASKS.value < 1:
        sys.exit(f"error: --tasks={_TASKS.value}: give at least 1")
    quiet_logging()
    from rltldr_jax.analysis.plan_probes import plot_probes, probe_grid
    from rltldr_jax.analysis.rollouts import write_csv

    arms = [a.strip() for a in _ARMS.value.split(",") if a.strip()]
    sets = [s.strip() for s in _SETS.value.split(",") if s.strip()]
    rows = probe_grid(_GRID.value, arms=arms, sets=sets, num_tasks=_TASKS.value)
    if not rows:
        sys.exit(f"error: no finished run with kept checkpoints in {_GRID.value}" + (f" among {arms}" if arms else ""))
    csv_path = os.path.join(_GRID.value, "probes.csv")
    write_csv(csv_path, list(rows[0]), [list(r.values()) for r in rows])
    png = plot_probes(rows, os.path.join(_GRID.value, "probes.png"))
    print(f"{len(rows)} rows: {csv_path}\n{png}")


def run() -> None:
    """`python launch/probe_plans.py`."""
    as_main(__name__)
    run_launcher(main)


if __name__ == "__main__":
    run()
