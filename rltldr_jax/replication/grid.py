"""A grid of ordinary training runs, (arm, seed) each, under one directory; what `launch/replicate.py` drives.

    runs = plan_runs({("grpo", 0): config_a, ("rltldr", 0): config_b, ...}, out="runs/replicate")
    for run in runs:
        summary = run_one(run)          # skipped when the run's summary.json exists; resumes a stopped run

Each run is a `Trainer` run (or, for an offline SFT arm, `train.sft.run_sft`) in `{out}/runs/{arm}-s{seed}`, so
every tool that reads a run (launch/eval.py, Δθ, rollout analyses, TensorBoard) works on it. Two arms whose
resolved configs are identical (e.g. `rltldr` and the λ arm it equals) share one run. A run that stopped midway
is resumed from its newest checkpoint; a finished one (its `summary.json` exists) is skipped, so rerunning the
grid only does what is missing.

`summary.json` holds the run's final evaluation: no-insight Pass@1 on held-in training tasks and held-out tasks,
the with-insight Pass@1 of its last training phases, environment steps and walltime.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import ml_collections

log = logging.getLogger(__name__)

SUMMARY = "summary.json"
#: The with-insight Pass@1 of a run is the mean over its last phases that had insight-conditioned attempts.
LAST_PHASES = 5


def config_digest(config: ml_collections.ConfigDict) -> str:
    """A hash of what a run trains (name and workdir excluded): equal digests mean identical runs."""
    d = config.to_dict()
    d.pop("name", None)
    d.pop("workdir", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class Run:
    """One (arm, seed) of the grid.

    Attributes:
      arm, seed: what the row of the results is called.
      config: the resolved config (workdir set; `model.checkpoint` set once pretrained).
      shared_with: the arm whose run this one reuses (identical config), or "".
      depends_on: the workdir of a run whose rollouts this one needs (offline SFT arms), or "".
    """

    arm: str
    seed: int
    config: ml_collections.ConfigDict
    shared_with: str = ""
    depends_on: str = ""

    @property
    def workdir(self) -> str:
        return self.config.workdir

    @property
    def offline(self) -> bool:
        """An offline SFT arm (trained on another run's saved rollouts, no environment steps of its own)."""
        return self.config.mode == "sft"


def plan_runs(
    configs: Mapping[tuple[str, int], ml_collections.ConfigDict], out: str, *, rollouts_of: str = "rltldr"
) -> list[Run]:
    """The grid's runs in execution order: per seed, the RL arms (an arm identical to an earlier one shares its
    run), then the offline SFT arms, which train on the rollouts of the same seed's `rollouts_of` arm.

    Args:
      configs: (arm, seed) -> resolved config (workdir is set here: `{out}/runs/{arm}-s{seed}`).
      out: the grid's directory.
      rollouts_of: the arm whose saved rollouts the offline arms read (must be among the RL arms of that seed).
    """
    runs: list[Run] = []
    for seed in sorted({s for _, s in configs}):
        arms = [a for a, s in configs if s == seed]
        first: dict[str, str] = {}  # digest -> arm that runs it
        workdirs: dict[str, str] = {}
        online = [a for a in arms if configs[(a, seed)].mode != "sft"]
        for arm in online:
            config = copy.deepcopy(configs[(arm, seed)])
            digest = config_digest(config)
            owner = first.setdefault(digest, arm)
            config.workdir = os.path.abspath(os.path.join(out, "runs", f"{owner}-s{seed}"))
            workdirs[arm] = config.workdir
            runs.append(Run(arm, seed, config, shared_with=owner if owner != arm else ""))
        for arm in arms:
            if arm in online:
                continue
            if rollouts_of not in workdirs:
                raise ValueError(
                    f"arm {arm!r} trains on the rollouts of arm {rollouts_of!r}, "
                    f"which is not in the grid for seed {seed}: "
                    f"add {rollouts_of!r} to --arms"
                )
            config = copy.deepcopy(configs[(arm, seed)])
            config.workdir = os.path.abspath(os.path.join(out, "runs", f"{arm}-s{seed}"))
            config.sft.rollouts_dir = workdirs[rollouts_of]
            runs.append(Run(arm, seed, config, depends_on=workdirs[rollouts_of]))
    return runs


def read_summary(workdir: str) -> dict[str, Any] | None:
    """A finished run's summary, or None."""
    path = os.path.join(workdir, SUMMARY)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (null → NaN)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append({k: (math.nan if v is None else v) for k, v in json.loads(line).items()})
    return out


def _mean(values: list[float]) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summarize_run(run: Run, *, walltime_s: float, sft_metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The summary of a finished run (module docstring) from its metrics.jsonl (or the offline SFT metrics)."""
    records = read_metrics(run.workdir)
    evals = [r for r in records if r["kind"] == "eval"]
    final = dict(sft_metrics) if sft_metrics is not None else (evals[-1] if evals else {})
    phases = [r for r in records if r["kind"] == "phase"]
    insight = [r.get("rollout/pass@1/insight", math.nan) for r in phases]
    insight = [v for v in insight if math.isfinite(v)][-LAST_PHASES:]
    return {
        "arm": run.arm,
        "seed": run.seed,
        "workdir": run.workdir,
        "digest": config_digest(run.config),
        "lam": run.config.loss.lam,
        "train_pass1_no_insight": final.get("eval_train/pass@1/all", math.nan),
        "heldout_pass1_no_insight": final.get("eval/pass@1/all", math.nan),
        "train_pass1_insight": _mean(insight),
        "env_steps": 0 if run.offline else int(phases[-1]["env_steps"]) if phases else 0,
        "walltime_s": walltime_s,
        "final": {k: v for k, v in final.items() if k.startswith(("eval/", "eval_train/"))},
    }


def run_one(run: Run, *, progress: bool = False) -> dict[str, Any]:
    """Runs (or resumes, or skips) one run of the grid and returns its summary (also written to summary.json).

    A shared run (`shared_with`) is not run again: its owner's summary is returned with this arm's name.
    """
    done = read_summary(run.workdir)
    if done is not None:
        return {**done, "arm": run.arm, "seed": run.seed}
    if run.shared_with:
        raise RuntimeError(
            f"run {run.arm}-s{run.seed} shares {run.shared_with}'s run, which has not finished: run it first"
        )
    t0 = time.time()
    if run.offline:
        from rltldr_jax.train.sft import run_sft

        if read_summary(run.depends_on) is None:
            raise RuntimeError(f"{run.arm}-s{run.seed} needs the finished run {run.depends_on}")
        # An offline run is short: a stopped one starts over, the old one moved aside.
        metrics = run_sft(run.config, progress=progress, restart=True)
        walltime = time.time() - t0
    else:
        from rltldr_jax.train.loop import Trainer

        # A stopped run continues from its newest checkpoint (from phase 0 when it stopped before the first one).
        trainer = Trainer(run.config, resume=os.path.isdir(run.workdir), progress=progress)
        trainer.run()
        walltime = time.time() - trainer.start_time  # a resumed trainer's clock includes the time before the stop
        metrics = None
    summary = summarize_run(run, walltime_s=walltime, sft_metrics=metrics)
    tmp = os.path.join(run.workdir, SUMMARY + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=float)
    os.replace(tmp, os.path.join(run.workdir, SUMMARY))
    return summary
