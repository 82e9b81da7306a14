"""Where a grid stands, without a single result: per seed its base policy, base checks and runs (done, running,
started, to do), what each finished piece took, and the time left estimated from them.

    pieces = grid_status(configs, out)          # configs: (arm, seed) -> resolved config, as the launcher makes them
    print("\n".join(status_lines(pieces, out)))

`python launch/replicate.py --config=... --status` prints it. Nothing here reads a success rate: a grid run in stints
under a pre-registration can be followed without looking at what it measures. A piece is *running* when a process
holds its lock (Linux's `/proc/locks`; where that file does not name it, not Linux or some overlay file systems, such
a piece shows as started), *started* when it has left files but
no result (a stopped run restarts or resumes from them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

from rltldr_jax.replication.driver import LOCKS
from rltldr_jax.replication.grid import plan_runs, read_summary
from rltldr_jax.settings import Settings
from rltldr_jax.train.pretrain import find_pretrained, pretrained_dir, resume_dir
from rltldr_jax.train.resume import LOCK

#: The states of a piece, in the order the lines list them.
STATES = ("done", "running", "started", "to do")


@dataclasses.dataclass(frozen=True)
class Piece:
    """One piece of the grid.

    Attributes:
      kind: "base policy", "base checks" or "run".
      seed: the seed it belongs to.
      state: one of `STATES`.
      arm: the run's arm ("" for a seed's pieces).
      seconds: how long it took, when done and recorded (a base policy's pretraining, a run's walltime).
      done_fraction: how much of it is saved, when started (a base policy's saved step over its steps), else 0.
      shared_with: the arm whose run this one is (identical configs), or "".
    """

    kind: str
    seed: int
    state: str
    arm: str = ""
    seconds: float | None = None
    done_fraction: float = 0.0
    shared_with: str = ""


def held_inodes() -> set[tuple[int, int]] | None:
    """(device, inode) of every file a process holds an flock or POSIX lock on, from `/proc/locks`; None where that
    file cannot be read (not Linux)."""
    try:
        with open("/proc/locks", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    held = set()
    for line in lines:
        for field in line.split():
            parts = field.split(":")
            if len(parts) == 3 and all(p and all(c in "0123456789abcdef" for c in p.lower()) for p in parts):
                major, minor, inode = int(parts[0], 16), int(parts[1], 16), int(parts[2])
                held.add((os.makedev(major, minor), inode))
                break
    return held


def _locked(directory: str, held: set[tuple[int, int]] | None) -> bool:
    """Whether a process holds `directory`'s lock file (`train.resume.LOCK`)."""
    try:
        st = os.stat(os.path.join(directory, LOCK))
    except OSError:
        return False
    return held is not None and (st.st_dev, st.st_ino) in held


def _saved_fraction(state_dir: str, steps: int) -> float:
    """The newest saved step of an unfinished pretraining (`pretrain.resume_dir`: orbax step directories) over its
    steps; 0 when none is saved."""
    try:
        saved = [int(name) for name in os.listdir(state_dir) if name.isdigit()]
    except OSError:
        return 0.0
    return min(max(saved, default=0) / steps, 1.0) if steps > 0 else 0.0


def _base_policy(config: Settings, seed: int, seed_busy: bool) -> Piece:
    """`seed_busy`: a launcher holds the seed's lock (`{out}/locks/s{seed}`: it pretrains or checks the seed)."""
    if config.pretrain.steps <= 0:
        return Piece("base policy", seed, "done")  # (a given checkpoint: nothing to pretrain)
    found = find_pretrained(config)
    if found is not None:
        with open(os.path.join(found, "pretrain.json"), encoding="utf-8") as f:
            seconds = json.load(f).get("seconds")
        return Piece("base policy", seed, "done", seconds=seconds)
    state = resume_dir(config)
    fraction = _saved_fraction(state, config.pretrain.steps)
    if seed_busy:
        return Piece("base policy", seed, "running", done_fraction=fraction)
    if os.path.isdir(state) or os.path.isdir(pretrained_dir(config)):
        return Piece("base policy", seed, "started", done_fraction=fraction)
    return Piece("base policy", seed, "to do")


def grid_status(configs: Mapping[tuple[str, int], Settings], out: str) -> list[Piece]:
    """The pieces of the grid `configs` under `out`, per seed: its base policy, its base checks, then its runs in
    the order the grid runs them. Reads files only (and `/proc/locks`); runs and changes nothing."""
    held = held_inodes()
    runs = plan_runs(configs, out)
    pieces: list[Piece] = []
    for seed in sorted({s for _, s in configs}):
        config = configs[next(k for k in configs if k[1] == seed)]
        seed_busy = _locked(os.path.join(out, LOCKS, f"s{seed}"), held)
        pieces.append(_base_policy(config, seed, seed_busy))
        checks = os.path.join(out, "base", f"s{seed}", "checks.json")
        if os.path.isfile(checks):
            state = "done"
        elif pieces[-1].state == "done" and seed_busy:
            state = "running"
        else:
            state = "to do"
        pieces.append(Piece("base checks", seed, state))
        for run in (r for r in runs if r.seed == seed):
            if run.shared_with:
                pieces.append(Piece("run", seed, "done", arm=run.arm, shared_with=run.shared_with))
                continue
            summary = read_summary(run.workdir)
            if summary is not None and (summary.get("arm"), summary.get("seed")) == (run.arm, seed):
                piece = Piece("run", seed, "done", arm=run.arm, seconds=summary.get("walltime_s"))
            elif _locked(run.workdir, held):
                piece = Piece("run", seed, "running", arm=run.arm)
            elif os.path.isdir(run.workdir):
                piece = Piece("run", seed, "started", arm=run.arm)
            else:
                piece = Piece("run", seed, "to do", arm=run.arm)
            pieces.append(piece)
    return pieces


def _mean(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min"


def time_left(pieces: Sequence[Piece]) -> tuple[float, int]:
    """(seconds, pieces not estimated): the time the unfinished base policies and runs should take in one process,
    each at the mean of its kind's finished pieces (a run at its arm's mean, else every finished RL run's; a started
    base policy less the share it saved). Base checks and pieces with nothing to go by are not estimated."""
    policies = _mean([p.seconds for p in pieces if p.kind == "base policy" and p.state == "done"])
    runs = [p for p in pieces if p.kind == "run" and not p.shared_with]
    by_arm = {
        arm: _mean([p.seconds for p in runs if p.arm == arm and p.state == "done"]) for arm in {p.arm for p in runs}
    }
    any_run = _mean([p.seconds for p in runs if p.state == "done"])
    seconds, unknown = 0.0, 0
    for p in pieces:
        if p.state == "done" or p.kind == "base checks" or p.shared_with:
            continue
        each = policies if p.kind == "base policy" else by_arm.get(p.arm) or any_run
        if each is None:
            unknown += 1
        else:
            seconds += each * (1 - p.done_fraction)
    return seconds, unknown


def status_lines(pieces: Sequence[Piece], out: str) -> list[str]:
    """The status as lines: totals, one line per seed, one per arm, and the time left."""
    runs = [p for p in pieces if p.kind == "run"]
    policies = [p for p in pieces if p.kind == "base policy"]
    checks = [p for p in pieces if p.kind == "base checks"]

    def done(ps: Sequence[Piece]) -> int:
        return sum(p.state == "done" for p in ps)

    lines = [
        f"{out}: {done(runs)} of {len(runs)} runs done, {done(policies)} of {len(policies)} base policies, "
        f"{done(checks)} of {len(checks)} base checks (no result is read here)"
    ]
    for seed in sorted({p.seed for p in pieces}):
        policy, check = (next(p for p in ps if p.seed == seed) for ps in (policies, checks))
        ps = [p for p in runs if p.seed == seed]
        words = [f"base policy {policy.state}"]
        if policy.state == "done" and policy.seconds is not None:
            words[-1] += f" ({_duration(policy.seconds)})"
        elif policy.done_fraction:
            words[-1] += f" ({100 * policy.done_fraction:.0f} % saved)"
        words.append(f"checks {check.state}")
        words.append(f"runs {done(ps)}/{len(ps)} done")
        for state in STATES[1:]:
            names = [p.arm for p in ps if p.state == state]
            if names:
                words.append(f"{state}: {', '.join(names)}")
        lines.append(f"  seed {seed}: " + "; ".join(words))
    for arm in dict.fromkeys(p.arm for p in runs):
        ps = [p for p in runs if p.arm == arm]
        mean = _mean([p.seconds for p in ps if p.state == "done" and not p.shared_with])
        took = f" (mean {_duration(mean)})" if mean is not None else ""
        lines.append(f"  {arm}: {done(ps)}/{len(ps)} done{took}")
    seconds, unknown = time_left(pieces)
    left = f"left: about {_duration(seconds)} of one process (base checks not counted"
    left += f"; {unknown} pieces with no finished piece of their kind to go by)" if unknown else ")"
    lines.append(left)
    return lines
