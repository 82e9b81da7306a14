"""A grid of ordinary training runs, (arm, seed) each, under one directory; what `launch/replicate.py` drives.

    runs = plan_runs({("grpo", 0): config_a, ("rltldr", 0): config_b, ...}, out="runs/replicate")
    for run in runs:
        summary = run_one(run)          # skipped when the run's summary.json exists; resumes a stopped run

Each run is a `Trainer` run (or, for an offline SFT arm, `train.sft.run_sft`) in `{out}/runs/{arm}-s{seed}`, so
every tool that reads a run (launch/eval.py, Δθ, rollout analyses, TensorBoard) works on it. Two arms whose
resolved configs are identical (e.g. `rltldr` and the λ arm it equals) share one run (`{out}/shared/{arm}-s{seed}.json`
records it). A run that stopped midway is resumed from its newest checkpoint; a finished one (its `summary.json`
exists) is skipped, so rerunning the grid only does what is missing. A finished run trained with other settings
than asked for (`stale_reason`) is never reused: it is refused (`StaleRunError`), or, with `restart=True`, moved to
`{workdir}.old-YYYYmmdd-HHMMSS` and trained again; so is a stopped one whose checkpoint the `Trainer` refuses to
resume with the new settings.

`summary.json` holds the run's final evaluation: no-insight Pass@1 on held-in training tasks and held-out tasks, the
with-insight Pass@1 of its last training phases, environment steps and walltime, the final, selected and area-under-
the-curve values of every evaluation set (`measures`; an offline run is evaluated once, after training, so its three
are one value, and `final` keeps every number of that evaluation), the config it was trained with, and the machine of
each of its starts (`hosts`: a seed is the same run bit for bit only on the same kind of machine, rltldr_jax/host.py).
`finished_runs(out)` reads every finished run of a grid directory, whichever process ran it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rltldr_jax import strict_json
from rltldr_jax.host import read_hosts
from rltldr_jax.replication.measures import eval_measures
from rltldr_jax.settings import Settings, as_dict, replace
from rltldr_jax.train.resume import MISSING, ConfigChangeError, config_changes, is_free, run_contents

log = logging.getLogger(__name__)

SUMMARY = "summary.json"
#: `{out}/shared/{arm}-s{seed}.json`: an arm whose run is another arm's (identical configs), `{"arm", "seed", "run"
#: (the run's directory name), "digest" (the digest its summary had then: a run redone since is not shared)}`.
SHARED = "shared"
#: The keys a resumed run may change (`resume.RESUME_FREE_KEYS`: where files go, how the policy is served, sharded,
#: checkpointed) may also differ between a finished run and the grid that reuses it, except these, which change its
#: results (a trailing "." means every key below).
RESULT_KEYS = ("train.env_step_budget", "train.max_phases", "train.overlap_phases", "eval.")
#: The with-insight Pass@1 of a run is the mean over its last phases that had insight-conditioned attempts.
LAST_PHASES = 5
#: The keys of a summary that hold numbers (or mappings of numbers): a NaN is written as null and read back as NaN.
NUMBERS = (
    "train_pass1_no_insight",
    "heldout_pass1_no_insight",
    "train_pass1_insight",
    "train_pass1_no_insight_best",
    "walltime_s",
    "final",
)


def config_digest(config: Settings) -> str:
    """A hash of what a run trains (name, workdir and logging excluded): equal digests mean identical runs."""
    d = as_dict(config)
    for key in ("name", "workdir", "logging"):
        d.pop(key, None)
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
    config: Settings
    shared_with: str = ""
    depends_on: str = ""

    @property
    def workdir(self) -> str:
        return self.config.workdir

    @property
    def name(self) -> str:
        """`{arm}-s{seed}`: how messages and the results name it."""
        return f"{self.arm}-s{self.seed}"

    @property
    def offline(self) -> bool:
        """An offline SFT arm (trained on another run's saved rollouts, no environment steps of its own)."""
        return self.config.mode == "sft"


def plan_runs(configs: Mapping[tuple[str, int], Settings], out: str, *, rollouts_of: str = "rltldr") -> list[Run]:
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
            digest = config_digest(configs[(arm, seed)])
            owner = first.setdefault(digest, arm)
            workdir = os.path.abspath(os.path.join(out, "runs", f"{owner}-s{seed}"))
            config = replace(configs[(arm, seed)], {"workdir": workdir})
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
            workdir = os.path.abspath(os.path.join(out, "runs", f"{arm}-s{seed}"))
            config = replace(configs[(arm, seed)], {"workdir": workdir, "sft.rollouts_dir": workdirs[rollouts_of]})
            runs.append(Run(arm, seed, config, depends_on=workdirs[rollouts_of]))
    return runs


class StaleRunError(ValueError):
    """A run of the grid was trained (or started) with other settings than the grid asks for."""


def read_summary(workdir: str) -> dict[str, Any] | None:
    """A finished run's summary, or None. Its numbers come back as written, a `null` (a NaN, in strict JSON) as NaN."""
    path = os.path.join(workdir, SUMMARY)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    for key in NUMBERS:
        if key in summary:
            summary[key] = strict_json.nan_for_null(summary[key])
    measures = summary.get("measures", {})
    for key in ("final", "selected", "auc"):
        if key in measures:
            measures[key] = strict_json.nan_for_null(measures[key])
    return summary


def _checkpoint_config(workdir: str) -> dict[str, Any] | None:
    """The config recorded with a run's newest checkpoint, or None (no checkpoint, or unreadable)."""
    from rltldr_jax.checkpoint import Checkpointer

    try:
        checkpoints = Checkpointer(os.path.join(workdir, "checkpoints"), keep=None, create=False)
        try:
            return checkpoints.read_state()[2].get("config")
        finally:
            checkpoints.close()
    except Exception:  # noqa: BLE001 (only a better message is lost: the caller says the settings differ)
        return None


def _counts(key: str) -> bool:
    """Whether a finished run whose config differs in `key` is another run (`RESULT_KEYS`)."""
    return not is_free(key) or any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESULT_KEYS)


def _changes(saved: Mapping[str, Any], config: Settings) -> list[tuple[str, Any, Any]]:
    """(key, old, new) of every key that counts (`_counts`) in which `config` differs from a run's `saved` config;
    keys only one side has (added to or removed from the code since) do not count, as on resume."""
    return [(k, o, n) for k, o, n in config_changes(saved, as_dict(config)) if _counts(k) and MISSING not in (o, n)]


def _show(changes: Sequence[tuple[str, Any, Any]]) -> str:
    shown = ", ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in changes[:4])
    return shown + (f" and {len(changes) - 4} more keys" if len(changes) > 4 else "")


def stale_reason(run: Run, summary: Mapping[str, Any]) -> str | None:
    """Why the finished run of `summary` is not the run `run` asks for (the differing keys that count: `_counts`),
    or None when it is.

    A summary written before summaries recorded their config is compared by its config digest, then (when the
    digests differ, e.g. because the code has new config keys) by the config of the run's newest checkpoint."""
    if run.depends_on and "rollouts_of" in summary:
        source = read_summary(run.depends_on)
        if source is not None and source.get("digest") != summary["rollouts_of"]:
            return f"the run whose rollouts it trained on, {os.path.basename(run.depends_on)}, was redone since"
    if "config" in summary:
        changes = _changes(summary["config"], run.config)
    elif summary.get("digest") == config_digest(run.config):
        return None
    else:
        saved = _checkpoint_config(run.workdir)
        if saved is None:
            return "the settings differ (its summary records their digest only, and no checkpoint says which)"
        changes = _changes(saved, run.config)
    return _show(changes) if changes else None


def stale_message(run: Run, why: str, *, stopped: bool = False) -> str:
    """The refusal of a run trained with other settings, with its fix (one line)."""
    what = "stopped run" if stopped else "finished run"
    return (
        f"{run.name}: the {what} in {run.workdir} was trained with other settings ({why}): rerun with --restart to "
        f"redo it (the old run moves to {run.workdir}.old-<time>), restore those settings, or give another --out"
    )


_RUN_DIR = re.compile(r"(?P<arm>.+)-s(?P<seed>\d+)")


def _finished_in(out: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(directory name, summary with its `workdir`) of each finished run in `{out}/runs`, by name."""
    runs = os.path.join(out, "runs")
    for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        m = _RUN_DIR.fullmatch(name)
        summary = read_summary(os.path.join(runs, name)) if m else None
        if summary is not None and (summary.get("arm"), summary.get("seed")) == (m["arm"], int(m["seed"])):
            yield name, {**summary, "workdir": os.path.join(runs, name)}


class ArmElsewhereError(ValueError):
    """A run of an arm whose runs are kept in another grid directory (`finished_runs`' `elsewhere`) is also in
    `out`: one line names both places and the fix."""


def finished_runs(
    out: str, order: Sequence[str] = (), elsewhere: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The summaries of every finished run under `out` (whichever process ran it), one per (arm, seed), sorted by
    seed, then by the arms' place in `order` (arms not in it after, by name).

    A run's directory is `{out}/runs/{arm}-s{seed}` (old runs moved aside, `....old-<time>`, are not read); an arm
    that shared another arm's run (`{out}/shared/`) gets that run's summary under its own name, as long as the run
    is still the one it shared (not redone since). `workdir` is where the run is now.

    `elsewhere` (arm -> another grid directory) reads those arms' runs from there instead, and only theirs (e.g. an
    arm run from a later install beside a frozen grid: the other directory's runs of other arms are not read).

    Raises:
      ArmElsewhereError: `out` also holds a finished run of an arm in `elsewhere`."""
    elsewhere = dict(elsewhere or {})
    found: dict[tuple[str, int], dict[str, Any]] = {}
    by_dir: dict[str, dict[str, Any]] = {}
    for name, summary in _finished_in(out):
        arm = summary["arm"]
        if arm in elsewhere:
            raise ArmElsewhereError(
                f"{summary['workdir']}: {arm}'s runs are kept in {elsewhere[arm]}, not in {out}; move this run "
                f"into {os.path.join(elsewhere[arm], 'runs')} (or aside) so the report has one place for them"
            )
        found[(arm, summary["seed"])] = by_dir[name] = summary
    for directory in sorted(set(elsewhere.values())):
        for _, summary in _finished_in(directory):
            if elsewhere.get(summary["arm"]) == directory:
                found[(summary["arm"], summary["seed"])] = summary
    shared = os.path.join(out, SHARED)
    for name in sorted(os.listdir(shared)) if os.path.isdir(shared) else []:
        if name.endswith(".json"):
            with open(os.path.join(shared, name), encoding="utf-8") as f:
                alias = json.load(f)
            owner, key = by_dir.get(alias["run"]), (alias["arm"], alias["seed"])
            if key not in found and owner is not None and owner.get("digest") == alias["digest"]:
                found[key] = {**owner, "arm": alias["arm"], "seed": alias["seed"]}
    rank = {arm: i for i, arm in enumerate(order)}
    return [found[k] for k in sorted(found, key=lambda k: (k[1], rank.get(k[0], len(rank)), k[0]))]


def record_shared(run: Run, out: str) -> None:
    """Records that `run`'s arm shares its owner's run (`finished_runs` reads it)."""
    os.makedirs(os.path.join(out, SHARED), exist_ok=True)
    path = os.path.join(out, SHARED, f"{run.name}.json")
    record = {
        "arm": run.arm,
        "seed": run.seed,
        "run": os.path.basename(run.workdir),
        "digest": (read_summary(run.workdir) or {}).get("digest"),  # (of the run as it is now)
    }
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


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
    if sft_metrics is not None:  # an offline run: one evaluation, after training, in no metrics.jsonl
        evals = [{k: v for k, v in sft_metrics.items() if k.startswith("eval")} | {"env_steps": 0}]
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
        # an RL run's evaluations are in its metrics.jsonl; an offline run's one evaluation only here (every set,
        # its probes included)
        "final": {k: v for k, v in final.items() if k.startswith("eval" if run.offline else ("eval/", "eval_train/"))},
        # final / selected on held-in validation (eval.select_on) / area under the curve, of every evaluation set
        "measures": eval_measures(
            evals, select_on=f"eval_{run.config.eval.select_on}/pass@1/all" if run.config.eval.select_on else None
        ),
        "config": json.loads(json.dumps(as_dict(run.config), default=str)),
        "hosts": read_hosts(run.workdir),  # the machine of each start of the run (rltldr_jax/host.py)
        **({"rollouts_of": (read_summary(run.depends_on) or {}).get("digest")} if run.depends_on else {}),
    }


def run_one(run: Run, *, restart: bool = False, progress: bool = False) -> dict[str, Any]:
    """Runs (or resumes, or skips) one run of the grid and returns its summary (also written to summary.json).

    A finished run is skipped when it was trained with the settings asked for (`stale_reason`); otherwise it is
    refused (`StaleRunError`), or with `restart` moved to `{workdir}.old-<time>` and trained again. So is a stopped
    run whose checkpoint the `Trainer` will not resume with the new settings. A shared run (`shared_with`) is not run
    again: its owner's summary is returned with this arm's name.

    Raises:
      StaleRunError: the run was trained (or started) with other settings, and not `restart`.
      WorkdirInUseError: another process is running it (e.g. another launcher on the same grid directory).
    """
    done = read_summary(run.workdir)
    if done is not None:
        why = stale_reason(run, done)
        if why is None:
            return {**done, "arm": run.arm, "seed": run.seed}
        if not restart or run.shared_with:
            raise StaleRunError(stale_message(run, why))
    if run.shared_with:
        raise RuntimeError(f"run {run.name} shares {run.shared_with}'s run, which has not finished: run it first")
    t0 = time.time()
    if run.offline:
        from rltldr_jax.train.sft import run_sft

        if read_summary(run.depends_on) is None:
            raise RuntimeError(f"{run.name} needs the finished run {run.depends_on}")
        # An offline run is short: a stopped one starts over, the old one moved aside.
        metrics = run_sft(run.config, progress=progress, restart=True)
        walltime = time.time() - t0
    else:
        trainer = _trainer(run, redo=done is not None, restart=restart, progress=progress)
        trainer.run()
        walltime = time.time() - trainer.start_time  # a resumed trainer's clock includes the time before the stop
        metrics = None
    summary = summarize_run(run, walltime_s=walltime, sft_metrics=metrics)
    write_summary(run.workdir, summary)
    return summary


def write_summary(workdir: str, summary: Mapping[str, Any]) -> None:
    """Writes a run's summary to `{workdir}/summary.json` in one step, as strict JSON (a NaN as `null`, which
    `read_summary` gives back as NaN)."""
    tmp = os.path.join(workdir, f"{SUMMARY}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        strict_json.dump(summary, f, indent=1, default=float)
    os.replace(tmp, os.path.join(workdir, SUMMARY))


def _trainer(run: Run, *, redo: bool, restart: bool, progress: bool) -> Any:
    """The `Trainer` of an RL run: afresh when `redo` (the old run moved aside) or when its workdir holds no run yet
    (the launcher's lock may have made it), else resuming a stopped run from its newest checkpoint (from phase 0
    when it stopped before the first one); a stopped run whose checkpoint has other settings (`ConfigChangeError`)
    is refused, or with `restart` started afresh."""
    from rltldr_jax.train.loop import Trainer

    if redo:
        return Trainer(run.config, restart=True, progress=progress)
    try:
        return Trainer(run.config, resume=bool(run_contents(run.workdir)), progress=progress)
    except ConfigChangeError as e:
        if restart:
            return Trainer(run.config, restart=True, progress=progress)
        saved = _checkpoint_config(run.workdir)
        changes = [c for c in _changes(saved, run.config) if not is_free(c[0])] if saved is not None else []
        raise StaleRunError(stale_message(run, _show(changes) if changes else str(e), stopped=True)) from None
