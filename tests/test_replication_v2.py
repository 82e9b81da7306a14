"""The second replication round's grid (rltldr_jax/config/replicate_v2.py): one name per arm, each arm differing from
`rltldr` exactly in its keys, seeds per arm, the pretraining that writes insights, fixed evaluation sets, and its
pre-registered analysis in the report."""

import filecmp
import json
import math
import os

import pytest

from rltldr_jax.config import base
from rltldr_jax.config import replicate_v2 as v2
from rltldr_jax.config.replicate import grid_analysis, grid_configs
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


def test_the_quick_preset_is_the_grids_seed_0_from_its_shipped_base_policy_without_the_analysis(tmp_path):
    """`:quick` trains GRPO and RLTL;DR on seed 0 with the grid's settings, shorter, from the base policy of the grid's
    seed 0 that ships with the package (nothing to pretrain); its one seed is no grid: no pre-registered analysis."""
    from rltldr_jax.train.pretrain import SHIPPED_DIR, pretrain, pretrain_key, shipped_dir

    configs = grid_configs(v2, "quick", list(v2.GRIDS["quick"][0]), [], {"pretrain.cache_dir": str(tmp_path)})
    assert sorted(configs) == [("grpo", 0), ("rltldr", 0)]
    quick, grid = configs[("rltldr", 0)], v2.arm_config("default", "rltldr", 0)
    assert quick.train.env_step_budget == 64 * v2.QUICK_PHASES < grid.train.env_step_budget
    assert pretrain_key(quick) == pretrain_key(grid) and quick.loss.lam == grid.loss.lam == 0.5
    path = shipped_dir(quick)
    assert path is not None, f"no base policy for the grid's seed 0 in {SHIPPED_DIR}: copy it from the grid's archive"
    assert pretrain(quick) == path and os.listdir(tmp_path) == []  # used as is: nothing pretrained
    with open(os.path.join(path, "pretrain.json"), encoding="utf-8") as f:
        record = json.load(f)
    assert record["key"] == pretrain_key(grid) and record["nll_curve"][-1][0] == grid.pretrain.steps == 4000
    # the very weights of the grid's seed 0 (its archive, docs/replication/v2/grid/pretrained)
    archived = os.path.join(
        os.path.dirname(__file__), "..", "docs", "replication", "v2", "grid", "pretrained", os.path.basename(path)
    )
    weights = "model.safetensors"
    assert filecmp.cmp(os.path.join(path, weights), os.path.join(archived, weights), shallow=False)
    assert grid_analysis(v2, "quick") is None
    assert grid_analysis(v2, "default") is v2.analysis is grid_analysis(v2, "smoke")


def test_the_evaluation_sets_are_every_tier_whole_and_the_same_for_every_seed():
    from rltldr_jax.agent.eval_set import eval_tasks, split_eval_tasks

    a, b = (v2.arm_config("default", "rltldr", seed) for seed in (0, 7))
    sets = split_eval_tasks(a)
    assert list(sets) == ["valid", "tier1", "tier2", "tier3", "tier4"] and sets == split_eval_tasks(b)
    assert {t.task_id for t in sets["tier2"]} == {t.task_id for t in eval_tasks(a)}  # tier 2 is evaluated once
    assert [len(sets[s]) for s in sets] == [140, 168, 144, 180, 144]


def _v2_summary(arm, seed, tier2, workdir):
    """A finished run's summary.json of the second round, no-insight Pass@1 `tier2` on tier 2, 0 elsewhere."""
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
        "workdir": str(workdir),
        "measures": measures,
        "evals": [],
    }


def test_the_report_holds_the_preregistered_analysis(tmp_path):
    """write_results with the grid's `analysis`: the section, its numbers from results.csv's columns."""
    from rltldr_jax.replication.report import write_results

    summaries = [_v2_summary("rltldr", s, 0.3 + 0.1 * s, tmp_path / f"rltldr-{s}") for s in range(3)]
    summaries += [_v2_summary("strict_control", s, 0.1, tmp_path / f"strict_control-{s}") for s in range(3)]
    paths = write_results(summaries, {}, str(tmp_path), analysis=v2.analysis)
    text = open(os.path.join(tmp_path, "results.md"), encoding="utf-8").read()
    assert any(p.endswith("results.md") for p in paths)
    assert "## Pre-registered analysis" in text
    assert "**Incomplete grid: 79 of 85 pre-registered runs missing** (rltldr 3–19; strict_control 3–19; " in text
    assert (
        "| primary | tier2 selected: rltldr − strict_control | +30.0 | [+20.0, +40.0] | 3 | "
        "reproduced; missing seeds: rltldr 3–19; strict_control 3–19 |" in text
    )


def _offline_config(seed, workdir):
    from rltldr_jax.settings import replace

    return replace(v2.arm_config("default", "sftldr", seed), {"workdir": str(workdir)})


def test_an_offline_run_keeps_every_set_of_its_one_evaluation(tmp_path):
    """An offline arm is evaluated once, after training (no metrics.jsonl): its summary keeps that evaluation of every
    set, probes included, as final = selected = AUC; results.csv gets its tier columns."""
    from rltldr_jax.replication.grid import Run, summarize_run
    from rltldr_jax.replication.report import split_names_of, split_values

    workdir = tmp_path / "sftldr-s1"
    workdir.mkdir()
    sets = v2.EVAL_SPLITS.split(",")
    metrics = {f"eval_{t}/pass@1/all": 0.1 * i for i, t in enumerate(sets)} | {
        "eval/pass@1/all": 0.2,
        "eval_train/pass@1/all": 0.7,
        "eval_tier3/probe/fix/right_tool": 0.25,
        "sft/nll": 1.5,
    }
    summary = summarize_run(Run("sftldr", 1, _offline_config(1, workdir)), walltime_s=3.0, sft_metrics=metrics)
    assert summary["env_steps"] == 0 and summary["heldout_pass1_no_insight"] == 0.2
    assert summary["final"]["eval_tier3/probe/fix/right_tool"] == 0.25 and "sft/nll" not in summary["final"]
    m = summary["measures"]
    assert m["selected_index"] == 0
    for measure in ("final", "selected", "auc"):
        assert m[measure]["eval_tier3/pass@1/all"] == pytest.approx(0.3)
    assert sorted(split_names_of([summary])) == sorted(sets)
    assert split_values(summary, ["tier3"]) == pytest.approx([0.3, 0.3, 0.3])


def test_an_offline_summary_from_the_grids_install_gives_its_tier2_value_and_the_report_says_what_is_missing(tmp_path):
    """The grid's install summarised an offline run with `eval/` (tier 2) alone: results.csv takes that value for
    tier 2's three measures, leaves the other sets empty, and the report says so; the evaluation probes of RL runs
    (metrics.jsonl) and of that offline run (`eval/probe/...` as tier 2's) are tabled at the selected evaluation."""
    import csv
    import json

    from rltldr_jax.replication.report import write_results

    summaries = []
    for seed in range(2):
        workdir = tmp_path / f"rltldr-s{seed}"
        workdir.mkdir()
        records = [
            {"kind": "eval", "phase": 5 * (i + 1), "env_steps": 320 * (i + 1), "eval_tier3/probe/fix/right_tool": v}
            for i, v in enumerate((0.1, 0.5 + seed * 0.1, 0.0))
        ]
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        summary = _v2_summary("rltldr", seed, 0.3, workdir)
        summaries.append(summary | {"measures": {**summary["measures"], "selected_index": 1}})
    old = {
        "arm": "sftldr",
        "seed": 0,
        "train_pass1_no_insight": 0.5,
        "heldout_pass1_no_insight": 0.25,
        "train_pass1_insight": float("nan"),
        "env_steps": 0,
        "walltime_s": 9.0,
        "lam": 0.5,
        "workdir": str(tmp_path / "sftldr-s0"),
        "final": {"eval/pass@1/all": 0.25, "eval_train/pass@1/all": 0.5, "eval/probe/rule_ore/pass@1": 0.125},
        "measures": {"final": {}, "selected": {}, "auc": {}, "selected_index": None},
        "config": {"mode": "sft", "env": {"eval_split": "tier2"}},
    }
    write_results([*summaries, old], {}, str(tmp_path), analysis=v2.analysis)
    with open(tmp_path / "results.csv", encoding="utf-8") as f:
        row = [r for r in csv.DictReader(f) if r["arm"] == "sftldr"][0]
    assert [float(row[f"tier2_pass1_no_insight{m}"]) for m in ("", "_selected", "_auc")] == [0.25, 0.25, 0.25]
    assert row["tier3_pass1_no_insight"] in ("", "nan")
    text = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "The grid's install kept only the tier-2 value of that evaluation for sftldr" in text
    assert "| sftldr | 1 | – | – | 25.0 | – | – |" in text  # (its one seed: no interval)
    tier3 = text.split("### tier3")[1].split("###")[0]
    assert "| probe | rltldr (2) |" in tier3 and "| fix/right_tool | 55.0 |" in tier3  # (seeds' 2nd evaluation)
    tier2 = text.split("### tier2")[1].split("###")[0]
    assert "| probe | sftldr (1) |" in tier2 and "| rule_ore/pass@1 | 12.5 |" in tier2
    with open(tmp_path / "eval_probes.csv", encoding="utf-8") as f:
        probes = list(csv.DictReader(f))
    assert {(r["arm"], r["seed"], r["measure"], r["set"]) for r in probes} == {
        ("rltldr", "0", "final", "tier3"),
        ("rltldr", "0", "selected", "tier3"),
        ("rltldr", "1", "final", "tier3"),
        ("rltldr", "1", "selected", "tier3"),
        ("sftldr", "0", "final", "tier2"),
        ("sftldr", "0", "selected", "tier2"),
    }


def test_an_arm_kept_beside_the_grid_is_reported_from_there(tmp_path):
    """`ARM_DIRS`: `rltldr_lora` runs in runs/replicate_v2_lora (a later install than the grid's, with an `rltldr`
    twin of seed 0); `--report` on the grid's directory reads rltldr_lora's runs from there and nothing else of that
    directory, refuses a copy of them in the grid's directory, and the launcher refuses to run the arm there."""
    import csv
    import json

    from helpers import launch

    grid, beside = tmp_path / "replicate_v2", tmp_path / v2.ARM_DIRS["rltldr_lora"]

    def finished(out, arm, seed, tier2):
        workdir = out / "runs" / f"{arm}-s{seed}"
        workdir.mkdir(parents=True)
        (workdir / "summary.json").write_text(json.dumps(_v2_summary(arm, seed, tier2, workdir)), encoding="utf-8")

    for seed in range(3):
        finished(grid, "rltldr", seed, 0.3 + 0.1 * seed)
        finished(grid, "strict_control", seed, 0.1)
        finished(beside, "rltldr_lora", seed, 0.2 + 0.1 * seed + (0.1 if seed == 2 else 0.0))
    finished(beside, "rltldr", 0, 0.9)  # the twin: not the grid's rltldr seed 0, never in the grid's report
    report = ("--config=configs/replicate_v2.py", f"--out={grid}", "--report")
    done = launch("replicate", *report)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(grid / "results.csv", encoding="utf-8") as f:
        rows = {(r["arm"], int(r["seed"])): r["workdir"] for r in csv.DictReader(f)}
    assert rows[("rltldr", 0)] == os.path.join("runs", "rltldr-s0")
    assert rows[("rltldr_lora", 2)] == os.path.join("..", "replicate_v2_lora", "runs", "rltldr_lora-s2")
    assert sorted(rows) == sorted((arm, s) for arm in ("rltldr", "strict_control", "rltldr_lora") for s in range(3))
    text = (grid / "results.md").read_text(encoding="utf-8")
    added = text.split("## Not pre-registered: rltldr_lora beside rltldr")[1]
    # paired by seed with the grid's rltldr (not the twin): -10, -10, 0 points
    assert "| not pre-registered | tier2 selected: rltldr_lora − rltldr | -6.7 |" in added
    assert "| primary | tier2 selected: rltldr − strict_control | +30.0 |" in text  # (the grid's rltldr)
    # a run of the arm in the grid's directory too: refused in one line, naming both places
    finished(grid, "rltldr_lora", 0, 0.5)
    done = launch("replicate", *report)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {grid}/runs/rltldr_lora-s0: rltldr_lora's runs are kept in {beside}"), line
    # running the arm in the grid's directory: refused before anything runs
    done = launch("replicate", "--config=configs/replicate_v2.py", f"--out={grid}", "--arms=rltldr_lora", "--seeds=5")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line == f"error: rltldr_lora's runs are kept in {beside}, not in {grid}: --out={beside}", line
    assert not (grid / "runs" / "rltldr_lora-s5").exists() and not (tmp_path / "pretrained").exists()


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
    # every run has every set's three measures, the offline sftldr too (its one evaluation, after training)
    assert all(
        math.isfinite(float(r[f"{t}_pass1_no_insight{m}"] or "nan"))
        for r in rows
        for t in ("valid", "tier3")
        for m in ("", "_selected", "_auc")
    )
    assert (out / "eval_probes.csv").is_file()
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
