"""`launch/replicate.py --status` (replication/status.py): where a grid stands, from its files alone, with the time
left estimated from the pieces that finished, and no result in it."""

from __future__ import annotations

import json
import os

import pytest

from rltldr_jax.config import replicate_v2 as v2
from rltldr_jax.config.replicate import grid_configs
from rltldr_jax.replication.status import grid_status, held_inodes, status_lines, time_left
from rltldr_jax.train.pretrain import pretrained_dir, resume_dir
from rltldr_jax.train.resume import lock_workdir


@pytest.fixture
def grid(tmp_path):
    """The second round's smoke grid (grpo s0, rltldr s0 and s1, sftldr s1; 4 pretraining steps) under tmp_path:
    seed 0 pretrained in 7,200 s and checked, grpo-s0 done in 600 s (its success rates 0.123: never shown), rltldr-s0
    running (this process holds its lock); seed 1's pretraining saved at step 1 of 4, nothing else."""
    out = str(tmp_path / "grid")
    overrides = {"pretrain.cache_dir": str(tmp_path / "pre"), "pretrain.steps": 4}  # (the preset's is 1)
    configs = grid_configs(v2, "smoke", list(v2.GRIDS["smoke"][0]), [], overrides)
    policy = pretrained_dir(configs[("grpo", 0)])
    os.makedirs(policy)
    with open(os.path.join(policy, "pretrain.json"), "w", encoding="utf-8") as f:
        json.dump({"seconds": 7200.0}, f)
    os.makedirs(os.path.join(out, "base", "s0"))
    open(os.path.join(out, "base", "s0", "checks.json"), "w").close()
    grpo = os.path.join(out, "runs", "grpo-s0")
    os.makedirs(grpo)
    summary = {"arm": "grpo", "seed": 0, "walltime_s": 600.0, "train_pass1_no_insight": 0.123}
    with open(os.path.join(grpo, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f)
    os.makedirs(os.path.join(resume_dir(configs[("rltldr", 1)]), "1"))
    lock = lock_workdir(os.path.join(out, "runs", "rltldr-s0"))
    yield out, configs
    lock.close()


def test_each_piece_has_its_state(grid):
    out, configs = grid
    pieces = {(p.kind, p.arm, p.seed): p for p in grid_status(configs, out)}
    assert {k: p.state for k, p in pieces.items()} == {
        ("base policy", "", 0): "done",
        ("base checks", "", 0): "done",
        ("run", "grpo", 0): "done",
        ("run", "rltldr", 0): "running" if held_inodes() is not None else "started",
        ("base policy", "", 1): "started",
        ("base checks", "", 1): "to do",
        ("run", "rltldr", 1): "to do",
        ("run", "sftldr", 1): "to do",
    }
    assert pieces[("base policy", "", 0)].seconds == 7200 and pieces[("run", "grpo", 0)].seconds == 600
    assert pieces[("base policy", "", 1)].done_fraction == 0.25


def test_time_left_from_the_finished_pieces(grid):
    out, configs = grid
    # seed 1's base policy: 7,200 s less the quarter saved; three runs with no finished run of their arm: grpo's 600 s
    seconds, unknown = time_left(grid_status(configs, out))
    assert (seconds, unknown) == (5400 + 3 * 600, 0)


def test_the_lines_and_the_launcher_show_no_result(grid):
    from helpers import launch

    out, configs = grid
    lines = status_lines(grid_status(configs, out), out)
    assert lines[0] == f"{out}: 1 of 4 runs done, 1 of 2 base policies, 1 of 2 base checks (no result is read here)"
    assert lines[1].startswith("  seed 0: base policy done (2.0 h); checks done; runs 1/2 done; ")
    assert lines[2] == "  seed 1: base policy started (25 % saved); checks to do; runs 0/2 done; to do: rltldr, sftldr"
    assert (
        "  grpo: 1/1 done (mean 10.0 min)" in lines
        and lines[-1] == "left: about 2.0 h of one process (base checks not counted)"
    )
    done = launch(
        "replicate",
        "--config=configs/replicate_v2.py:smoke",
        f"--out={out}",
        f"--config.pretrain.cache_dir={os.path.dirname(out)}/pre",
        "--config.pretrain.steps=4",
        "--status",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == lines[0] and "0.123" not in done.stdout and "12.3" not in done.stdout
    assert sorted(os.listdir(out)) == ["base", "runs"]  # (it wrote nothing)
