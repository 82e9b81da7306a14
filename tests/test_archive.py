"""A grid carried across machines (rltldr_jax/replication/archive.py): `pack` keeps the finished pieces (and the
rollouts an offline arm still needs), `unpack` restores them file for file where the grid reads them, nothing
existing is overwritten, shipped base policies are not copied twice; the probes saved with a run are read again
(analysis/plan_probes.py), so a restored run without checkpoints keeps its probes."""

from __future__ import annotations

import filecmp
import json
import os
import shutil

import pytest

from rltldr_jax.config import replicate_v2 as v2
from rltldr_jax.config.replicate import grid_configs
from rltldr_jax.replication import archive
from rltldr_jax.replication.driver import resolve_base_policies
from rltldr_jax.replication.grid import plan_runs
from rltldr_jax.settings import as_dict


def _write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _files(root) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes)."""
    found = {}
    for r, _, names in os.walk(root):
        for n in names:
            path = os.path.join(r, n)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


@pytest.fixture
def grid(tmp_path):
    """The smoke preset's grid (grpo s0, rltldr s0 and s1, sftldr s1 on rltldr-s1's rollouts) part-way: rltldr s0
    and s1 finished, grpo s0 stopped (a checkpoint, no summary), sftldr s1 not started; seed 0's base checks done;
    one base policy per seed (files standing in for the HF directory)."""
    out = str(tmp_path / "grid")
    configs = grid_configs(
        v2, "smoke", list(v2.GRIDS["smoke"][0]), [], {"pretrain.cache_dir": str(tmp_path / "pretrained")}
    )
    runs = plan_runs(resolve_base_policies(configs), out)
    by_name = {r.name: r for r in runs}
    for run in runs:
        os.makedirs(run.config.model.checkpoint, exist_ok=True)
        _write(os.path.join(run.config.model.checkpoint, "pretrain.json"), json.dumps({"seed": run.seed}))
        _write(os.path.join(run.config.model.checkpoint, "model.safetensors"), f"weights of seed {run.seed}")
    for name in ("rltldr-s0", "rltldr-s1"):
        run = by_name[name]
        summary = {"arm": run.arm, "seed": run.seed, "digest": name, "config": as_dict(run.config)}
        _write(os.path.join(run.workdir, "summary.json"), json.dumps(summary))
        _write(os.path.join(run.workdir, "metrics.jsonl"), '{"phase": 1}\n')
        _write(os.path.join(run.workdir, "checkpoints", "1", "state"), "a checkpoint")
        _write(os.path.join(run.workdir, "events.out.tfevents"), "tensorboard")
        _write(os.path.join(run.workdir, "rollouts", "phase_000001.jsonl"), f"rollouts of {name}\n")
    _write(os.path.join(by_name["rltldr-s0"].workdir, "probes.json"), '{"rows": []}')
    _write(os.path.join(by_name["grpo-s0"].workdir, "checkpoints", "3", "state"), "a stopped run")
    checks = {"checks": {}, "curves": {}, "checkpoint": by_name["rltldr-s0"].config.model.checkpoint}
    _write(os.path.join(out, "base", "s0", "checks.json"), json.dumps(checks))
    _write(os.path.join(out, "base", "s0", "insight_curves.csv"), "k,pass\n")
    return out, runs, by_name


def test_pack_keeps_the_finished_pieces_and_the_rollouts_an_offline_arm_still_needs(grid, tmp_path):
    out, runs, by_name = grid
    dest = str(tmp_path / "archive")
    written = archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    kept = set(_files(dest))
    assert {
        "runs/rltldr-s0/summary.json",
        "runs/rltldr-s0/metrics.jsonl",
        "runs/rltldr-s0/probes.json",
        "runs/rltldr-s1/summary.json",
        "runs/rltldr-s1/metrics.jsonl",
        "runs/rltldr-s1/rollouts/phase_000001.jsonl",  # (sftldr-s1 has still to train on them)
        "base/s0/checks.json",
        "base/s0/insight_curves.csv",
        "manifest.json",
    } <= kept
    assert not any("checkpoints" in p or "tfevents" in p or "grpo-s0" in p for p in kept)
    assert "runs/rltldr-s0/rollouts/phase_000001.jsonl" not in kept  # (no offline arm of seed 0)
    # the base policies of the finished runs and of seed 0's checks, both at the paths the runs used
    manifest = json.loads(_files(dest)["manifest.json"])
    names = {os.path.basename(r.config.model.checkpoint) for r in runs}
    assert set(manifest["pretrained"]) == names and len(names) == 2
    assert all(not e["shipped"] for e in manifest["pretrained"].values())
    assert {f"pretrained/{n}/model.safetensors" for n in names} <= kept
    assert sorted(written) == sorted(os.path.join(dest, p) for p in kept)
    # packing again writes nothing new; a run finishing since adds its files
    assert archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none")) == []
    grpo = by_name["grpo-s0"]
    _write(os.path.join(grpo.workdir, "summary.json"), json.dumps({"arm": "grpo", "seed": 0}))
    assert archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none")) == [
        os.path.join(dest, "runs", "grpo-s0", "summary.json")
    ]
    assert archive.summary_of(dest) == {"runs": 3, "base checks": 1, "base policies": 2}
    assert archive.unprobed_runs(runs) == ["grpo-s0", "rltldr-s1"]  # (finished, checkpoints kept, no probes.json)
    # once the offline arm has trained on rltldr-s1's rollouts, the archive drops them (its own files come in)
    sftldr = by_name["sftldr-s1"]
    _write(os.path.join(sftldr.workdir, "summary.json"), json.dumps({"arm": "sftldr", "seed": 1}))
    assert archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none")) == [
        os.path.join(dest, "runs", "sftldr-s1", "summary.json")
    ]
    assert not os.path.exists(os.path.join(dest, "runs", "rltldr-s1", "rollouts"))
    assert {"runs/rltldr-s1/summary.json", "runs/rltldr-s1/metrics.jsonl"} <= set(_files(dest))


def test_unpack_restores_every_file_where_the_grid_reads_it_and_refuses_to_overwrite(grid, tmp_path):
    out, runs, _ = grid
    dest = str(tmp_path / "archive")
    archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    before = {**_files(out)}
    policies = {r.config.model.checkpoint: _files(r.config.model.checkpoint) for r in runs}
    shutil.rmtree(out)  # (a new machine)
    shutil.rmtree(tmp_path / "pretrained")
    written = archive.unpack(dest, out, shipped_dir=str(tmp_path / "none"))
    after = _files(out)
    assert after == {p: b for p, b in before.items() if p in after}  # every restored file as it was
    assert set(after) == {
        p
        for p in before
        if p.startswith("base/")
        or p.split("/")[-1] in ("summary.json", "metrics.jsonl", "probes.json")
        and "grpo-s0" not in p
    } | {"runs/rltldr-s1/rollouts/phase_000001.jsonl"}
    assert all(_files(path) == files for path, files in policies.items())
    assert len(written) == len(after) + sum(len(f) for f in policies.values())
    assert archive.unpack(dest, out, shipped_dir=str(tmp_path / "none")) == []  # (already there: nothing written)
    # a file the grid holds with other content is refused, never overwritten
    summary = os.path.join(out, "runs", "rltldr-s0", "summary.json")
    _write(summary, "{}")
    with pytest.raises(archive.ArchiveError, match="exists with other content"):
        archive.unpack(dest, out, shipped_dir=str(tmp_path / "none"))
    assert open(summary, encoding="utf-8").read() == "{}"
    with pytest.raises(archive.ArchiveError, match="not a grid archive"):
        archive.unpack(str(tmp_path), out)


def test_a_shipped_base_policy_is_named_not_copied(grid, tmp_path):
    out, runs, _ = grid
    shipped = tmp_path / "shipped"
    seed0 = next(r for r in runs if r.seed == 0).config.model.checkpoint
    shutil.copytree(seed0, shipped / os.path.basename(seed0))
    dest = str(tmp_path / "archive")
    archive.pack(runs, out, dest, shipped_dir=str(shipped))
    manifest = json.loads(_files(dest)["manifest.json"])
    assert manifest["pretrained"][os.path.basename(seed0)] == {"path": seed0, "shipped": True}
    assert not os.path.exists(os.path.join(dest, "pretrained", os.path.basename(seed0)))
    shutil.rmtree(seed0)
    archive.unpack(dest, str(tmp_path / "restored"), shipped_dir=str(shipped))
    assert filecmp.cmp(
        os.path.join(seed0, "model.safetensors"), shipped / os.path.basename(seed0) / "model.safetensors"
    )
    shutil.rmtree(seed0)
    with pytest.raises(archive.ArchiveError, match="neither in"):
        archive.unpack(dest, str(tmp_path / "again"), shipped_dir=str(tmp_path / "none"))


def test_probes_saved_with_a_run_are_read_again_when_its_checkpoints_are_gone(grid):
    """probe_grid on a restored run (no checkpoints) returns the rows saved for the same sets and size, and skips
    the run when they were saved for others (nothing to compute them from)."""
    from rltldr_jax.analysis.plan_probes import PROBES_FILE, probe_grid

    out, _, by_name = grid
    workdir = by_name["rltldr-s0"].workdir
    shutil.rmtree(os.path.join(workdir, "checkpoints"))
    rows = [{"set": "tier2", "step": 0, "drift": 0.0}, {"set": "tier2", "step": 5, "drift": 0.25}]
    _write(os.path.join(workdir, PROBES_FILE), json.dumps({"sets": ["tier2"], "num_tasks": 3, "rows": rows}))
    shutil.rmtree(by_name["rltldr-s1"].workdir)
    got = probe_grid(out, sets=("tier2",), num_tasks=3, echo=lambda line: None)
    assert got == [{"arm": "rltldr", "seed": 0, **r} for r in rows]
    assert probe_grid(out, sets=("tier2", "tier3"), num_tasks=3, echo=lambda line: None) == []
    assert probe_grid(out, sets=("tier2",), num_tasks=4, echo=lambda line: None) == []


def test_the_launcher_packs_and_unpacks_and_runs_nothing(grid, tmp_path):
    """launch/replicate.py --pack / --unpack: one line each (with a note on finished runs whose probes would be
    lost), files as `pack`/`unpack` write them, no training."""
    from helpers import launch as launcher

    out, _, _ = grid
    dest = str(tmp_path / "archive")

    def launch(*flags: str):
        grid = (
            "--config=configs/replicate_v2.py:smoke",
            f"--out={out}",
            f"--config.pretrain.cache_dir={tmp_path}/pretrained",
        )
        return launcher("replicate", *grid, *flags)

    packed = launch(f"--pack={dest}")
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert "note: 1 finished runs have checkpoints but no probes (rltldr-s1)" in packed.stdout
    assert f"files packed into {dest} (it holds 2 runs, 1 base checks, 2 base policies)" in packed.stdout
    before = _files(os.path.join(out, "runs", "rltldr-s0"))
    shutil.rmtree(out)
    unpacked = launch(f"--unpack={dest}")
    assert unpacked.returncode == 0, unpacked.stderr[-2000:]
    assert f"unpacked into {out} from {dest}" in unpacked.stdout
    assert _files(os.path.join(out, "runs", "rltldr-s0")) == {
        k: v for k, v in before.items() if k in ("summary.json", "metrics.jsonl", "probes.json")
    }
    both = launch(f"--pack={dest}", f"--unpack={dest}")
    assert both.returncode == 1 and both.stderr.strip().splitlines() == [
        "error: --pack and --unpack both given: pack on the machine the grid ran on, unpack on the next"
    ]


def test_a_base_policy_is_packed_before_anything_of_its_seed_finished(grid, tmp_path):
    """Pretraining a seed's base policy is its longest piece: a stint that ends after it (before
    the base checks or a run) keeps it."""
    out, runs, by_name = grid
    for name in ("rltldr-s0", "rltldr-s1"):
        os.remove(os.path.join(by_name[name].workdir, "summary.json"))
    shutil.rmtree(os.path.join(out, "base"))
    dest = str(tmp_path / "archive")
    archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    names = {os.path.basename(r.config.model.checkpoint) for r in runs}
    assert set(json.loads(_files(dest)["manifest.json"])["pretrained"]) == names
    assert {f"pretrained/{n}/model.safetensors" for n in names} <= set(_files(dest))


def test_a_base_policy_still_pretraining_is_carried_as_its_newest_state(grid, tmp_path):
    """A stint that ends during pretraining packs its saved state (`train.pretrain.resume_dir`); a later pack replaces
    it with the newer one; unpacking puts it back where pretraining looks for it; once the policy is made it leaves
    the archive."""
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import Checkpointer
    from rltldr_jax.train.pretrain import RESUME_SUFFIX, saved_step

    out, runs, by_name = grid
    base = by_name["rltldr-s1"].config.model.checkpoint
    shutil.rmtree(base)  # seed 1's base policy: still pretraining
    state = base + RESUME_SUFFIX
    name = os.path.basename(base)
    dest = str(tmp_path / "archive")

    def save(step: int) -> None:
        with Checkpointer(state, keep=1, async_save=False) as saved:
            saved.save(step, params={"w": jnp.full(3, float(step))}, opt_state=None, rng=None, meta={"step": step})

    save(8)
    archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    manifest = json.loads(_files(dest)["manifest.json"])
    assert manifest["pretraining"] == {name: {"path": state, "step": 8}} and name not in manifest["pretrained"]
    assert saved_step(os.path.join(dest, "pretraining", name)) == 8
    assert archive.summary_of(dest)["pretraining states"] == 1

    save(12)
    archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    assert json.loads(_files(dest)["manifest.json"])["pretraining"][name]["step"] == 12
    assert not any(f.startswith(f"pretraining/{name}/8/") for f in _files(dest))  # (the older state is replaced)

    shutil.rmtree(state)  # a new machine
    assert any(p.startswith(state) for p in archive.unpack(dest, out, shipped_dir=str(tmp_path / "none")))
    with Checkpointer(state, keep=1, create=False) as saved:
        restored = saved.restore(abstract_params={"w": jnp.zeros(3)})
    assert restored.step == 12 and restored.meta == {"step": 12} and restored.params["w"].tolist() == [12.0] * 3
    assert not any(p.startswith(state) for p in archive.unpack(dest, out, shipped_dir=str(tmp_path / "none")))

    _write(os.path.join(base, "pretrain.json"), json.dumps({"seed": 1}))  # made: the state has no more use
    _write(os.path.join(base, "model.safetensors"), "weights of seed 1")
    archive.pack(runs, out, dest, shipped_dir=str(tmp_path / "none"))
    manifest = json.loads(_files(dest)["manifest.json"])
    assert "pretraining" not in manifest and name in manifest["pretrained"]
    assert not os.path.exists(os.path.join(dest, "pretraining", name))
