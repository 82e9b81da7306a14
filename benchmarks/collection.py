"""Walltime of a collection phase: RLTL;DR's sequential attempts with insights vs GRPO's K independent attempts.

    python benchmarks/collection.py            # K = 8, 8 tasks per phase: the replication's quick preset
    python benchmarks/collection.py --smoke    # K = 2, 2 tasks, short actions: checks that every row runs

The paper (§5.3) reports sequential sampling at K = 8 as 4.5× slower than parallel sampling, and a whole RLTL;DR
run as 1.5× longer than GRPO's. This script measures both on the small-scale replication: the base policy that
ships for seed 0 (`train/pretrain.py` `find_pretrained`), its crafting-world tasks (`envs/craft.py`), the embedded
JaxEngine, and every part built by `Trainer` from `configs/replicate.py`'s quick preset (the `rltldr` and `grpo`
arms), so the collector is the trainer's own.

Table 1, one collection phase (the same tasks for every row, the rows taking turns within each round; median over
the rounds, after warm-up phases that compile the engine's buckets):
- `rltldr`: K sequential attempts per task with insights after failures (the preset: `rollout.exact_group_size`,
  one chain per task);
- `rltldr w=2`, `rltldr w=4`: `rollout.workers_per_task` concurrent chains per task (≥ K attempts per task: the
  paper's asynchronous collection; exact_group_size needs one chain);
- `rltldr max_batch=T`: `rltldr` on an engine with as many decode slots as it has concurrent attempts (one per
  task) instead of the preset's 64: the embedded engine's decode step costs the same however many slots are busy,
  so this row shows what sequential sampling costs when the step fits its occupancy (not the same engine: a
  what-if, outside the ratio's claim);
- `grpo parallel`: K independent attempts per task, all at once (`workers_per_task` = K, exactly K: the config
  refuses exact_group_size with concurrent chains for every arm, so the script sets it on the trainer's built
  collector: without insights nothing in a phase depends on timing);
- `grpo parallel ≥K`: the same chains as the config allows them (exact_group_size off: ≥ K attempts per task);
- `grpo sequential`: the `grpo` arm as the replication runs it (one chain per task, no insights).

Table 2, whole phases through `Trainer.run` (collect + update + weight push: `time/phase_s`, median over the
phases after the first two, which compile): `rltldr` sync and with `train.overlap_phases`, vs `grpo parallel`. The
base policy fails every attempt at these hard tasks (the replication's premise), so GRPO's zero-advantage filter
leaves it nothing to update on (`grpo parallel sync`: a phase is its collection); the baseline of the ratio,
`grpo parallel, all`, updates on every attempt (`loss.filter_zero_advantage` and `loss.positive_ratio` off), as a
GRPO phase with successes would. On a CPU the engine and the trainer share the same cores, so overlapping them can
gain little there.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rltldr_jax.config import replicate
from rltldr_jax.envs import TaskSource, load_tasks
from rltldr_jax.settings import replace
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.pretrain import find_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Overrides of the smoke mode (seconds on a CPU; not a measurement).
SMOKE = {
    "rollout.tasks_per_phase": 2,
    "rollout.group_size": 2,
    "rollout.max_action_tokens": 24,
    "engine.max_batch": 4,
    "batch.ppo_epochs": 1,
    "batch.micro_batch_size": 8,
}

#: Table 1: row name -> (arm of configs/replicate.py, overrides, exactly K attempts per task set on the built
#: collector).
COLLECTION_ROWS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "rltldr": ("rltldr", {}, False),
    "rltldr w=2": ("rltldr", {"rollout.workers_per_task": 2, "rollout.exact_group_size": False}, False),
    "rltldr w=4": ("rltldr", {"rollout.workers_per_task": 4, "rollout.exact_group_size": False}, False),
    "rltldr max_batch=T": ("rltldr", {"engine.max_batch": "T"}, False),
    "grpo parallel": ("grpo", {"rollout.workers_per_task": "K", "rollout.exact_group_size": False}, True),
    "grpo parallel ≥K": ("grpo", {"rollout.workers_per_task": "K", "rollout.exact_group_size": False}, False),
    "grpo sequential": ("grpo", {}, False),
}
#: Table 2: row name -> (Table 1 row whose arm and collector it runs, overrides). A row without overrides goes on
#: with Table 1's trainer; the others get a trainer of their own.
PHASE_ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "rltldr sync": ("rltldr", {}),
    "rltldr overlapped": ("rltldr", {"train.overlap_phases": True}),
    "grpo parallel sync": ("grpo parallel", {}),
    "grpo parallel, all": ("grpo parallel", {"loss.filter_zero_advantage": False, "loss.positive_ratio": 0.0}),
}
BASELINE, PHASE_BASELINE = "grpo parallel", "grpo parallel, all"


def build_trainer(arm: str, overrides: dict[str, Any], *, smoke: bool, phases: int, workdir: str) -> Trainer:
    """The `Trainer` of one arm of the replication's quick preset (seed 0) on its shipped base policy, with
    `overrides` ("K" stands for the group size, "T" for the tasks per phase), evaluation shrunk to one attempt and
    no rollout files."""
    settings = {
        "workdir": workdir,
        "eval.every": 0,
        "eval.num_tasks": 1,
        "eval.train_num_tasks": 0,
        "eval.attempts_per_task": 1,
        "rollout.save_rollouts": False,
        "train.checkpoint_every": 1000,
        "train.env_step_budget": 0,
        "train.max_phases": phases,
        **(SMOKE if smoke else {}),
    }
    preset = replicate.get_config("quick").rollout
    sizes = {
        "K": settings.get("rollout.group_size", preset.group_size),
        "T": settings.get("rollout.tasks_per_phase", preset.tasks_per_phase),
    }
    settings |= {key: sizes.get(value, value) if isinstance(value, str) else value for key, value in overrides.items()}
    config = replicate.arm_config("quick", arm, 0, settings)
    checkpoint = _base_policy(config)
    if checkpoint is None:
        raise SystemExit(
            "no base policy for configs/replicate.py seed 0 (none cached, and the shipped one's key does not match): "
            "pretrain it with `python launch/pretrain.py --config=configs/replicate.py:quick`"
        )
    return Trainer(replace(config, {"model.checkpoint": checkpoint}))


_BASE_POLICIES: dict[str, str | None] = {}


def _base_policy(config: Any) -> str | None:
    """`find_pretrained` once per pretraining key (computing the key hashes the world's source)."""
    key = (
        f"{config.env.name}-{config.model.preset}-s{config.seed}-{config.insight.max_insights}-"
        f"{config.rollout.thinking}"
    )
    if key not in _BASE_POLICIES:
        _BASE_POLICIES[key] = find_pretrained(config)
    return _BASE_POLICIES[key]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def collection_table(trainers: dict[str, Trainer], *, rounds: int, warmup: int) -> dict[str, dict[str, float]]:
    """Per Table 1 row, medians over `rounds` phases of the seconds per phase, the attempts per phase and the seconds
    per attempt (the same tasks for every row within a round; the rows take turns), after `warmup` unmeasured ones."""
    config = next(iter(trainers.values())).config
    source = TaskSource(load_tasks(config.env.name, config.env.train_split, seed=config.env.seed), seed=config.seed)
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    attempts: dict[str, list[int]] = {name: [] for name in trainers}
    for r in range(warmup + rounds):
        tasks = source.take(config.rollout.tasks_per_phase)
        for name, trainer in trainers.items():
            start = time.perf_counter()
            result = trainer.collector.collect(tasks, phase=r)
            elapsed = time.perf_counter() - start
            if r >= warmup:
                seconds[name].append(elapsed)
                attempts[name].append(len(result.attempts))
    return {
        name: {
            "seconds": median(seconds[name]),
            "attempts": median(attempts[name]),
            "per_attempt": median([s / a for s, a in zip(seconds[name], attempts[name], strict=True)]),
        }
        for name in trainers
    }


def phase_row(trainer: Trainer, *, skip: int) -> dict[str, float]:
    """Runs the trainer to its `train.max_phases` (`Trainer.run`, which closes it); medians over the phases after the
    first `skip` of `time/phase_s`, the examples trained on and the optimizer steps."""
    trainer.run()
    with open(os.path.join(trainer.workdir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [r for r in map(json.loads, f) if r["kind"] == "phase"][skip:]
    return {
        "seconds": median([r["time/phase_s"] for r in records]),
        "examples": median([r["filter/examples"] for r in records]),
        "steps": median([r["update/optimizer_steps"] for r in records]),
    }


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets, no warm-up: checks that every row runs")
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured collection phases per row (default 5; smoke 1)"
    )
    parser.add_argument("--phases", type=int, default=None, help="phases of each Table 2 run (default 7; smoke 2)")
    parser.add_argument(
        "--xla_cache",
        default=os.path.join(ROOT, "runs", "xla-cache"),
        help="persistent XLA compilation cache (the trainers' engines compile the same programs)",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 5)
    phases = args.phases or (2 if args.smoke else 7)
    warmup, skip = (0, 1) if args.smoke else (2, 2)
    if rounds < 1 or phases <= skip:
        parser.error(
            f"--rounds must be >= 1 and --phases > {skip} (the first {skip} phases compile and are not measured)"
        )
    if not jax.config.jax_compilation_cache_dir and args.xla_cache:
        jax.config.update("jax_compilation_cache_dir", args.xla_cache)
    logging.getLogger("rltldr_jax").setLevel(logging.WARNING)
    t_start = time.perf_counter()
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="collection-bench-") as tmp:
        trainers: dict[str, Trainer] = {}
        try:
            for name, (arm, overrides, exact) in COLLECTION_ROWS.items():
                trainers[name] = build_trainer(
                    arm, overrides, smoke=args.smoke, phases=phases, workdir=os.path.join(tmp, f"t{len(trainers)}")
                )
                if exact:
                    trainers[name].collector.exact_group_size = True
            config = trainers["rltldr"].config
            k, n_tasks = config.rollout.group_size, config.rollout.tasks_per_phase
            rows = collection_table(trainers, rounds=rounds, warmup=warmup)
            for name in [
                n for n in trainers if n not in {source for source, extra in PHASE_ROWS.values() if not extra}
            ]:
                trainers.pop(name).close()  # done; Table 2's rows without overrides go on with Table 1's trainers
            for name, (source, extra) in PHASE_ROWS.items():
                if extra:
                    arm, overrides, exact = COLLECTION_ROWS[source]
                    trainer = build_trainer(
                        arm,
                        overrides | extra,
                        smoke=args.smoke,
                        phases=phases,
                        workdir=os.path.join(tmp, f"p{len(rows)}"),
                    )
                    if exact:
                        trainer.collector.exact_group_size = True
                else:
                    trainer = trainers.pop(source)
                rows[name] = phase_row(trainer, skip=skip)  # (run() closes the trainer)
        finally:
            for trainer in trainers.values():
                trainer.close()
    base = rows[BASELINE]["seconds"]
    out(
        f"collection walltime, K = {k}, {n_tasks} tasks per phase, {rounds} measured phases per row "
        f"({jax.devices()[0].platform}, {os.cpu_count()} cores); ratio = row / '{BASELINE}' (paper: sequential 4.5x)"
    )
    out(f"{'row':<22} {'s/phase':>9} {'attempts':>9} {'ms/attempt':>11} {'ratio':>7}")
    for name in COLLECTION_ROWS:
        r = rows[name]
        out(
            f"{name:<22} {r['seconds']:>9.3f} {r['attempts']:>9.0f} {1000 * r['per_attempt']:>11.1f} "
            f"{r['seconds'] / base:>7.2f}"
        )
    phase_base = rows[PHASE_BASELINE]["seconds"]
    out(
        f"whole phases (collect + update + push: time/phase_s, median of phases {skip + 1}-{phases}); ratio = row / "
        f"'{PHASE_BASELINE}' (paper: a RLTL;DR run takes 1.5x GRPO's; goal <= 1.5x)"
    )
    out(f"{'row':<22} {'s/phase':>9} {'examples':>9} {'opt steps':>10} {'ratio':>7}")
    for name in PHASE_ROWS:
        r = rows[name]
        out(
            f"{name:<22} {r['seconds']:>9.3f} {r['examples']:>9.0f} {r['steps']:>10.0f} "
            f"{r['seconds'] / phase_base:>7.2f}"
        )
    out(f"total {time.perf_counter() - t_start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
