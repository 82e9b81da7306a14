"""A grid's finished pieces as a few small files, so that a grid longer than one machine's life (a day of CPU for
the second round, on machines that last hours; a Colab runtime) is carried to the next machine and resumed there.

    python launch/replicate.py --config=configs/replicate_v2.py --pack=docs/replication/v2/grid    # after a stint
    python launch/replicate.py --config=configs/replicate_v2.py --unpack=docs/replication/v2/grid  # on a new machine
    python launch/replicate.py --config=configs/replicate_v2.py                                    # resumes the grid

What is kept (`pack`), from the grid's directory `out`:

- per finished run: `summary.json` (what the report reads, its config included: the grid knows the run as done),
  `metrics.jsonl` (every phase and evaluation) and `probes.json` (the probes over training, when
  `launch/probe_plans.py` has run: the checkpoints they read are not kept);
- per unfinished run that trains on a finished run's rollouts (the offline arms): that run's `rollouts/`, removed
  from the archive again once every offline arm reading them has finished (tens of MB a seed);
- `shared/` (arms that share another's run) and every seed's base checks (`base/s{seed}/`);
- every base policy of the grid's seeds made so far (its HF directory, ~1 MB; one alone counts: pretraining is a
  seed's longest piece), unless the package ships the same files (`train.pretrain.SHIPPED_DIR`), with the path it
  was used at (`MANIFEST`);
- the saved state of a base policy still pretraining (`train.pretrain.resume_dir`, a few MB), so the next machine
  continues it: the newest replaces the one packed before, and it leaves the archive once the policy is made.

Nothing else: no checkpoints, TensorBoard events or rollouts of finished runs. `unpack` puts the files back where
they were (the grid's directory, base policies at the paths the runs' configs name), so the grid must be resumed
from the same directory (a run's config records its base policy's absolute path; another path is another run). A
file that exists with other content is refused (one line: which, and the fix), never overwritten. Both return the
paths they wrote; packing again adds what finished since.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence

from rltldr_jax.agent.rollout_files import rollouts_dir
from rltldr_jax.analysis.plan_probes import PROBES_FILE
from rltldr_jax.replication.grid import SHARED, SUMMARY, Run, read_summary

#: Per finished run, the files kept (those that exist).
RUN_FILES = (SUMMARY, "metrics.jsonl", PROBES_FILE)
#: The base checks' files of a seed (replication/driver.py CHECKS_FILES).
CHECKS_DIR = "base"
#: The archive's index: {"pretrained": {directory name: {"path": where the runs used it, "shipped": bool}},
#: "pretraining": {directory name: {"path": where its saved state was, "step": the step it continues from}}}.
MANIFEST = "manifest.json"
#: The archive's directory of saved pretraining states (and their key in `MANIFEST`).
PRETRAINING = "pretraining"


class ArchiveError(RuntimeError):
    """An archive cannot be packed or unpacked as asked (one line: what, and the fix)."""


def _copy(src: str, dst: str, written: list[str]) -> None:
    """Copies the file `src` to `dst` unless an identical file is there; refuses a different one."""
    if os.path.exists(dst):
        if filecmp.cmp(src, dst, shallow=False):
            return
        raise ArchiveError(
            f"{dst} exists with other content than {src}: move it away (or pack into / unpack from another "
            "directory); nothing is overwritten"
        )
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.tmp-{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    written.append(dst)


def _copy_tree(src: str, dst: str, written: list[str]) -> None:
    for root, _, files in os.walk(src):
        for name in sorted(files):
            path = os.path.join(root, name)
            _copy(path, os.path.join(dst, os.path.relpath(path, src)), written)


def _same_tree(a: str, b: str) -> bool:
    """Whether the directories hold the same files with the same contents."""
    if not os.path.isdir(b):
        return False
    names_a = sorted(os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs)
    names_b = sorted(os.path.relpath(os.path.join(r, f), b) for r, _, fs in os.walk(b) for f in fs)
    return names_a == names_b and all(
        filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names_a
    )


def _read_manifest(archive: str) -> dict:
    path = os.path.join(archive, MANIFEST)
    if not os.path.isfile(path):
        return {"pretrained": {}}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def pack(runs: Sequence[Run], out: str, archive: str, *, shipped_dir: str | None = None) -> list[str]:
    """Copies the finished pieces of the grid `runs` (planned in `out`: `grid.plan_runs`, base policies resolved)
    into `archive` (module docstring); returns the paths written."""
    from rltldr_jax.train.pretrain import SHIPPED_DIR

    shipped_dir = SHIPPED_DIR if shipped_dir is None else shipped_dir
    written: list[str] = []
    finished = {run.workdir for run in runs if not run.shared_with and read_summary(run.workdir) is not None}
    # Every base policy the grid's runs start from that is made (pretrain.json written): with or without a finished
    # run or base checks, since a base policy alone is the longest piece of a seed.
    used: set[str] = {run.config.model.checkpoint for run in runs}
    for run in runs:
        if run.shared_with:
            continue
        name = os.path.basename(run.workdir)
        if run.workdir in finished:
            for f in RUN_FILES:
                if os.path.isfile(os.path.join(run.workdir, f)):
                    _copy(os.path.join(run.workdir, f), os.path.join(archive, "runs", name, f), written)
        elif run.depends_on in finished:  # (an offline arm still to run: the rollouts it trains on)
            _copy_tree(rollouts_dir(run.depends_on), _archived_rollouts(archive, run.depends_on), written)
    _drop_rollouts_no_longer_needed(runs, finished, archive)
    seeds_checked = set()
    for sub in (SHARED, CHECKS_DIR):
        src = os.path.join(out, sub)
        if os.path.isdir(src):
            _copy_tree(src, os.path.join(archive, sub), written)
            if sub == CHECKS_DIR:
                seeds_checked = {d for d in os.listdir(src) if os.path.isfile(os.path.join(src, d, "checks.json"))}
    for seed_dir in sorted(seeds_checked):
        with open(os.path.join(out, CHECKS_DIR, seed_dir, "checks.json"), encoding="utf-8") as f:
            used.add(json.load(f)["checkpoint"])
    manifest = _read_manifest(archive)
    for path in sorted(p for p in used if p and os.path.isfile(os.path.join(p, "pretrain.json"))):
        name = os.path.basename(path.rstrip(os.sep))
        shipped = _same_tree(path, os.path.join(shipped_dir, name))
        if not shipped:
            _copy_tree(path, os.path.join(archive, "pretrained", name), written)
        manifest["pretrained"][name] = {"path": path, "shipped": shipped}
    _pack_pretraining(used, archive, manifest, written)
    os.makedirs(archive, exist_ok=True)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    path = os.path.join(archive, MANIFEST)
    if not os.path.isfile(path) or open(path, encoding="utf-8").read() != text:
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(f"{path}.tmp", path)
        written.append(path)
    return written


def _drop_rollouts_no_longer_needed(runs: Sequence[Run], finished: set[str], archive: str) -> None:
    """Removes from `archive` the rollouts packed for offline arms that have all finished since (the module
    docstring: no rollouts of finished runs are kept)."""
    offline = [run for run in runs if run.depends_on]
    pending = {run.depends_on for run in offline if run.workdir not in finished}
    for source in {run.depends_on for run in offline} - pending:
        shutil.rmtree(_archived_rollouts(archive, source), ignore_errors=True)


def _archived_rollouts(archive: str, source: str) -> str:
    """Where `archive` keeps the rollouts of the run in `source` (`runs/{name}/rollouts`)."""
    return os.path.join(archive, "runs", os.path.basename(source), os.path.basename(rollouts_dir(source)))


def _pack_pretraining(used: Iterable[str], archive: str, manifest: dict, written: list[str]) -> None:
    """The saved states of the base policies in `used` still pretraining, into `{archive}/pretraining/{name}` and
    `manifest["pretraining"]` (the module docstring)."""
    from rltldr_jax.train.pretrain import RESUME_SUFFIX, saved_step

    states = manifest.pop(PRETRAINING, {})
    for path in sorted(p for p in used if p):
        name = os.path.basename(path.rstrip(os.sep))
        kept = os.path.join(archive, PRETRAINING, name)
        step = None if os.path.isfile(os.path.join(path, "pretrain.json")) else saved_step(path + RESUME_SUFFIX)
        if step is None:  # made (or not started): no state to carry
            if states.pop(name, None) is not None:
                shutil.rmtree(kept, ignore_errors=True)
            continue
        if states.get(name, {}).get("step") == step and os.path.isdir(kept):
            continue
        shutil.rmtree(kept, ignore_errors=True)  # (an older state of the same pretraining)
        _copy_tree(path + RESUME_SUFFIX, kept, written)
        states[name] = {"path": path + RESUME_SUFFIX, "step": step}
    if states:
        manifest[PRETRAINING] = states


def unpack(archive: str, out: str, *, shipped_dir: str | None = None) -> list[str]:
    """Puts what `pack` kept in `archive` back into the grid's directory `out` and the base policies at the paths
    the runs used them at; returns the paths written (none when everything is already there)."""
    from rltldr_jax.train.pretrain import RESUME_SUFFIX, SHIPPED_DIR, saved_step

    shipped_dir = SHIPPED_DIR if shipped_dir is None else shipped_dir
    if not os.path.isfile(os.path.join(archive, MANIFEST)):
        raise ArchiveError(f"{archive} is not a grid archive (no {MANIFEST}): give the directory --pack wrote")
    written: list[str] = []
    for sub in ("runs", SHARED, CHECKS_DIR):
        if os.path.isdir(os.path.join(archive, sub)):
            _copy_tree(os.path.join(archive, sub), os.path.join(out, sub), written)
    for name, entry in sorted(_read_manifest(archive)["pretrained"].items()):
        src = os.path.join(shipped_dir if entry["shipped"] else os.path.join(archive, "pretrained"), name)
        if not os.path.isdir(src):
            raise ArchiveError(f"base policy {name} is neither in {archive}/pretrained nor shipped ({shipped_dir})")
        _copy_tree(src, entry["path"], written)
    for name, entry in sorted(_read_manifest(archive).get(PRETRAINING, {}).items()):
        state = entry["path"]
        if os.path.isfile(os.path.join(state.removesuffix(RESUME_SUFFIX), "pretrain.json")):
            continue  # made here since
        here = saved_step(state)
        if here is not None and here >= entry["step"]:
            continue  # as far here, or further
        shutil.rmtree(state, ignore_errors=True)
        _copy_tree(os.path.join(archive, PRETRAINING, name), state, written)
    return written


def unprobed_runs(runs: Sequence[Run]) -> list[str]:
    """The finished RL runs of `runs` (names) that kept checkpoints but have no saved probes (`probes.json`) although
    their world has reference plans: packing loses what `launch/probe_plans.py` would read from them."""
    from rltldr_jax.envs.spec import get_spec

    names = []
    for run in runs:
        if run.shared_with or run.offline or read_summary(run.workdir) is None:
            continue
        if get_spec(run.config.env.name).reference_plans is None:
            continue
        has_ckpt = os.path.isdir(os.path.join(run.workdir, "checkpoints"))
        if has_ckpt and not os.path.isfile(os.path.join(run.workdir, PROBES_FILE)):
            names.append(run.name)
    return names


def archived_runs(archive: str) -> list[str]:
    """The run directories an archive holds a summary of (e.g. `rltldr-s0`)."""
    runs = os.path.join(archive, "runs")
    names: Iterable[str] = sorted(os.listdir(runs)) if os.path.isdir(runs) else ()
    return [n for n in names if os.path.isfile(os.path.join(runs, n, SUMMARY))]


def summary_of(archive: str) -> Mapping[str, int]:
    """Counts of what an archive holds: finished runs, seeds with base checks, base policies, and (when there are
    any) saved states of base policies still pretraining."""
    checks = os.path.join(archive, CHECKS_DIR)
    manifest = _read_manifest(archive)
    counts = {
        "runs": len(archived_runs(archive)),
        "base checks": len(os.listdir(checks)) if os.path.isdir(checks) else 0,
        "base policies": len(manifest["pretrained"]),
    }
    if manifest.get(PRETRAINING):
        counts["pretraining states"] = len(manifest[PRETRAINING])
    return counts
