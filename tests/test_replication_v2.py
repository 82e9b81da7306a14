"""The second replication round's grid (rltldr_jax/config/replicate_v2.py): one name per arm, each arm differing from
`rltldr` exactly in its keys, seeds per arm, the pretraining that writes insights, fixed evaluation sets, and its
pre-registered analysis in the report."""

import os

import pytest

from rltldr_jax.config import base
from rltldr_jax.config import replicate_v2 as v2
from rltldr_jax.config.replicate import grid_configs
from rltldr_jax.settings import as_dict
from rltldr_jax.train.pretrain import pretrained_dir


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def test_every_arm_differs_from_rltldr_exactly_in_its_keys_and_no_two_arms_are_one():
    ref = _flat(as_dict(v2.arm_config("default", "rltldr", 0)))
    expected = {
        "strict_control": {"insight.source"},
        "shuffled_control": {"insight.source"},
        "lambda_0": {"loss.lam"},
        "lambda_0.03": {"loss.lam"},
        "grpo": {"insight.schedule", "loss.lam"},
        "grpo_k64": {"insight.schedule", "loss.lam", "rollout.tasks_per_phase", "rollout.group_size"},
        "grpo_hot": {"insight.schedule", "loss.lam", "rollout.temperature", "train.max_logprob_gap"},
        "sft_rollouts": {"mode"},  # (sft.data is "rollouts" by default)
        "sftldr": {"mode", "sft.data"},
        "rltldr_lora": {"model.lora.rank"},
    }
    assert set(expected) | {"rltldr"} == set(v2.ARMS) == set(v2.GRID_SEEDS)
    flats = {arm: _flat(as_dict(v2.arm_config("default", arm, 0))) for arm in v2.ARMS}
    for arm, keys in expected.items():
        assert {k for k in ref if ref[k] != flats[arm][k]} - {"name"} == keys, arm
    unique = {tuple(sorted((k, str(v)) for k, v in f.items() if k != "name")) for f in flats.values()}
    assert len(unique) == len(v2.ARMS)  # one name per arm: no arm is another under a second name
    rltldr = v2.arm_config("default", "rltldr", 0)
    assert rltldr.env.name == "forge" and rltldr.loss.lam == v2.DEFAULT_LAMBDA == 0.5
    # the pilots' choice: round one's constant 1e-3 without KL, 150 phases
    assert rltldr.optim.learning_rate == 1e-3 and rltldr.optim.decay_steps == 0 and rltldr.loss.kl_coef == 0
    assert rltldr.train.env_step_budget == 150 * rltldr.rollout.tasks_per_phase * rltldr.rollout.group_size
    assert rltldr.pretrain.write_prob > 0 and rltldr.pretrain.reword_prob > 0 and rltldr.eval.select_on == "valid"
    assert v2.arm_config("default", "strict_control", 0).insight.source == "uninformative"
    assert v2.arm_config("default", "grpo_k64", 0).rollout.group_size == 64
    # the LoRA arm: added after the pre-registration, not in the default grid, on rltldr's seeds
    assert "rltldr_lora" not in v2.GRIDS["default"][0] and len(v2.PREREGISTERED_ARMS) == len(v2.ARMS) - 1
    assert v2.GRID_SEEDS["rltldr_lora"] == v2.GRID_SEEDS["rltldr"]
    # every arm of a seed shares its base policy, which differs by seed and from round one's
    from rltldr_jax.config import replicate as round_one

    dirs = {pretrained_dir(v2.arm_config("default", arm, 3)) for arm in v2.ARMS}
    assert len(dirs) == 1 and pretrained_dir(v2.arm_config("default", "rltldr", 4)) not in dirs
    assert pretrained_dir(v2.arm_config("pilot", "rltldr", 3)) in dirs  # pilots share the recipe (on seeds >= 100)
    assert pretrained_dir(round_one.arm_config("default", "rltldr", 3)) not in dirs
    with pytest.raises(base.ConfigError, match="unknown arm"):
        v2.arm_config("default", "rltldr_v1", 0)


def test_the_grid_runs_each_arm_on_its_own_seeds():
    configs = grid_configs(v2, "default", list(v2.ARMS), [], {})
    seeds = {arm: sorted(s for a, s in configs if a == arm) for arm in v2.ARMS}
    assert seeds == {arm: list(s) for arm, s in v2.GRID_SEEDS.items()}
    assert seeds["rltldr"] == list(range(20)) and seeds["lambda_0"] == list(range(10)) and seeds["grpo"] == [0, 1, 2]
    assert min(v2.GRIDS["pilot"][1]) >= 100  # pilots never on a grid seed
    # --seeds applies to every arm; an offline arm brings the rltldr run whose rollouts it reads
    configs = grid_configs(v2, "smoke", ["sftldr"], [5], {})
    assert sorted(configs) == [("rltldr", 5), ("sftldr", 5)]
    configs = grid_configs(v2, "smoke", ["grpo", "sftldr"], [], {})
    assert sorted(configs) == [("grpo", 0), ("rltldr", 1), ("sftldr", 1)]


def test_the_evaluation_sets_are_every_tier_whole_and_the_same_for_every_seed():
    from rltldr_jax.agent.eval_set import eval_tasks, split_eval_tasks

    a, b = (v2.arm_config("default", "rltldr", seed) for seed in (0, 7))
    sets = split_eval_tasks(a)
    assert list(sets) == ["valid", "tier1", "tier2", "tier3", "tier4"] and sets == split_eval_tasks(b)
    assert {t.task_id for t in sets["tier2"]} == {t.task_id for t in eval_tasks(a)}  # tier 2 is evaluated once
    assert [len(sets[s]) for s in sets] == [140, 168, 144, 180, 144]


def test_the_report_holds_the_preregistered_analysis(tmp_path):
    """write_results with the grid's `analysis`: the section, its numbers from results.csv's columns."""
    from rltldr_jax.replication.report import write_results

    def summary(arm, seed, tier2):
        measures = {
            m: {f"eval_{t}/pass@1/all": tier2 if t == "tier2" else 0.0 for t in v2.EVAL_SPLITS.split(",")}
            for m in ("final", "selected", "auc")
        }
        return {
            "arm": arm,
            "seed": seed,
            "train_pass1_no_insight": 0.0,
            "heldout_pass1_no_insight": tier2,
            "train_pass1_insight": 0.0,
            "env_steps": 64,
            "walltime_s": 1.0,
            "lam": 0.5,
            "workdir": str(tmp_path / f"{arm}-{seed}"),
            "measures": measures,
            "evals": [],
        }

    summaries = [summary("rltldr", s, 0.3 + 0.1 * s) for s in range(3)]
    summaries += [summary("strict_control", s, 0.1) for s in range(3)]
    paths = write_results(summaries, {}, str(tmp_path), analysis=v2.analysis)
    text = open(os.path.join(tmp_path, "results.md"), encoding="utf-8").read()
    assert any(p.endswith("results.md") for p in paths)
    assert "## Pre-registered analysis" in text
    assert "| primary | tier2 selected: rltldr − strict_control | +30.0 | [+20.0, +40.0] | 3 | reproduced |" in text


@pytest.mark.slow
def test_the_smoke_grid_through_the_launcher_then_the_probes(tmp_path):
    """launch/replicate.py on the second round's smoke preset (arms with their own seeds, an offline arm reading
    rltldr's rollouts of its seed), its report with the pre-registered section, then the probes over training."""
    import csv
    import shutil

    from helpers import launch as launcher

    from rltldr_jax.analysis.plan_probes import probe_grid

    out = tmp_path / "grid"

    def launch(*flags: str) -> None:
        grid = (
            "--config=configs/replicate_v2.py:smoke",
            f"--out={out}",
            f"--config.pretrain.cache_dir={tmp_path}/pretrained",
        )
        done = launcher("replicate", *grid, *flags)
        assert done.returncode == 0, done.stderr[-3000:]

    launch()
    with open(out / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["arm"], int(r["seed"])) for r in rows) == [
        ("grpo", 0),
        ("rltldr", 0),
        ("rltldr", 1),
        ("sftldr", 1),
    ]
    assert all(r["tier3_pass1_no_insight_selected"] != "" for r in rows)
    text = (out / "results.md").read_text(encoding="utf-8")
    assert "## Pre-registered analysis" in text and "| sanity | grpo: max over seeds" in text
    probes = probe_grid(str(out), num_tasks=1, echo=lambda line: None)
    assert {(r["arm"], r["seed"]) for r in probes} == {("grpo", 0), ("rltldr", 0), ("rltldr", 1)}  # not sftldr
    assert {r["step"] for r in probes} == {0, 1} and {r["set"] for r in probes} == {"tier2", "tier3", "tier4"}
    # carried to a new machine: packed, restored (base policies too), resumed: nothing is run again, same report
    launch(f"--pack={tmp_path / 'archive'}")
    old_csv = (out / "results.csv").read_text(encoding="utf-8")
    shutil.move(out, tmp_path / "old-machine")
    shutil.move(tmp_path / "pretrained", tmp_path / "old-pretrained")
    launch(f"--unpack={tmp_path / 'archive'}")
    launch()
    assert not any((out / "runs" / name / "checkpoints").exists() for name in os.listdir(out / "runs"))  # not rerun
    assert (out / "results.csv").read_text(encoding="utf-8") == old_csv
    assert probe_grid(str(out), num_tasks=1, echo=lambda line: None) == probes  # (from the packed probes.json)
