"""Configs: the paper's defaults, presets, every ablation, validation and the launcher's errors."""

import importlib
import os
import subprocess
import sys

import pytest

from rltldr_jax.config import ablations, base
from rltldr_jax.settings import value_at

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS = ("sapi", "appworld", "leetcode")


def _config(env: str, preset: str | None = None):
    return importlib.import_module(f"configs.{env}").get_config(preset)


def test_defaults_are_the_papers_table_4():
    c = base.validate(_config("sapi"))
    assert (c.rollout.tasks_per_phase, c.rollout.group_size, c.rollout.max_steps) == (8, 8, 50)
    assert (c.rollout.max_think_tokens, c.rollout.max_action_tokens, c.rollout.temperature) == (768, 512, 1.0)
    assert (c.optim.learning_rate, c.optim.warmup_steps, c.optim.grad_clip_norm) == (3e-6, 0, 1.0)
    assert (c.loss.lam, c.loss.clip_eps, c.loss.positive_ratio, c.loss.std_normalize) == (0.5, 0.2, 0.75, False)
    assert (c.insight.threshold, c.insight.max_insights, c.insight.schedule) == (0.5, 16, "threshold")
    assert (c.insight.max_think_tokens, c.insight.max_action_tokens) == (4096, 4096)
    assert (c.batch.ppo_epochs, c.batch.micro_batch_size, c.batch.grad_accum_steps) == (2, 4, 8)
    # Global batch 256 = 4 per device × 8 accumulation × 8 GPUs (Table 4).
    assert c.batch.micro_batch_size * c.batch.grad_accum_steps * 8 == 256
    lc = base.validate(_config("leetcode"))
    assert (lc.rollout.tasks_per_phase, lc.rollout.max_steps, lc.rollout.max_think_tokens) == (128, 1, 0)
    assert (lc.rollout.max_action_tokens, lc.optim.learning_rate, lc.rollout.thinking) == (16384, 6e-6, False)
    assert lc.batch.micro_batch_size * lc.batch.grad_accum_steps * 8 == 32


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("preset", [None, "paper", "tiny"])
def test_every_preset_validates(env, preset):
    c = base.validate(_config(env, preset))
    assert c.env.name == env
    if preset == "tiny":
        assert c.model.preset == "tiny" and c.engine.kind == "jax" and c.insight.source == "rule"
    else:
        assert c.model.preset == "qwen3_5_9b"


def test_unknown_preset():
    with pytest.raises(base.ConfigError, match="unknown preset 'huge'; choose one of paper, tiny"):
        _config("sapi", "huge")


@pytest.mark.parametrize("name", list(ablations.ABLATIONS))
def test_every_ablation_resolves(name):
    ablation = ablations.ABLATIONS[name]
    assert ablation.paper
    # A teacher-written-insight entry needs its teacher (validation says so; see test_teacher_needs_a_model).
    extra = (
        {"insight.teacher.servers": "localhost:50051"} if ablation.overrides.get("insight.source") == "teacher" else {}
    )
    for env in ENVS:
        for preset in ("paper", "tiny"):
            c = ablations.resolve(_config(env, preset), name, extra)
            for key, value in ablation.overrides.items():
                assert value_at(c, key) == value, (env, preset, key)


def test_teacher_needs_a_model():
    with pytest.raises(base.ConfigError, match="insight.source='teacher' needs insight.teacher.checkpoint"):
        ablations.resolve(_config("sapi"), "teacher_thinking")
    both = {"insight.teacher.servers": "h:1", "insight.teacher.checkpoint": "/ckpt/glm"}
    with pytest.raises(base.ConfigError, match="not both"):
        ablations.resolve(_config("sapi"), "teacher_thinking", both)


def test_ablation_semantics():
    grpo = ablations.resolve(_config("sapi"), "grpo")
    assert grpo.insight.schedule == "never" and grpo.loss.lam == 0
    for r, lam in ((2, 0.5), (10, 0.1), (100, 0.01)):  # the paper's λ points on Fig. 4's axis
        c = ablations.resolve(_config("sapi"), f"fig4_ratio_{r}")
        assert c.loss.grpo_coef == 1 and c.loss.lam == pytest.approx(lam)
    pure_sft = ablations.resolve(_config("sapi"), "fig4_ratio_0")
    assert pure_sft.loss.grpo_coef == 0 and pure_sft.loss.lam > 0
    assert ablations.resolve(_config("sapi"), "sftldr_dedup").mode == "sft"
    # Command-line overrides win over the ablation.
    c = _config("sapi")
    base.override(c, {"loss.lam": 0.3})
    assert ablations.resolve(c, "grpo", {"loss.lam": 0.3}).loss.lam == 0.3
    with pytest.raises(base.ConfigError, match="unknown ablation 'nope'; known: rltldr, grpo"):
        ablations.resolve(_config("sapi"), "nope")


def test_paper_tables_are_covered():
    papers = " ".join(a.paper for a in ablations.ABLATIONS.values())
    for row in (
        "Table 1 GRPO",
        "Table 1 SGE",
        "Table 1 RLTF-SD",
        "Table 2 SFT on 100",
        "Table 2 SFTL;DR on insights, dedup",
        "Table 3 content: diagnostic",
        "GLM 5.2 thinking, n_fb = 1",
        "Table 3 amount: 8",
        "Table 8 RLTF-FM",
        "Table 8 RLTL;DR + self-play",
        "Table 9 insert if <= 3 of the first 10",
        "Table 9 split advantages",
        "Table 9 off-policy",
        "Table 9 GRPO-style std",
        "Fig. 4",
    ):
        assert row in papers, row


def test_validation_errors_name_the_key_and_fix():
    c = _config("sapi")
    with pytest.raises(base.ConfigError, match=r"unknown config key 'loss.foo'"):
        base.override(c, {"loss.foo": 1})
    with pytest.raises(base.ConfigError, match=r"unknown config key 'los'"):
        base.override(c, {"los.lam": 1})
    with pytest.raises(base.ConfigError, match="loss.lam='high'"):
        base.override(c, {"loss.lam": "high"})  # ConfigDict is type-safe
    bad = base.override(_config("sapi"), {"loss.lam": -1.0, "insight.schedule": "sometimes", "rollout.top_p": 0.0})
    with pytest.raises(base.ConfigError) as e:
        base.validate(bad)
    msg = str(e.value)  # every problem at once
    assert "loss.lam=-1.0 is outside [0.0, inf)" in msg
    assert "insight.schedule='sometimes' is not one of 'threshold', 'first_k', 'never', 'always'" in msg
    assert "rollout.top_p=0.0 is outside (0.0, 1.0]" in msg
    assert "--config.KEY=VALUE" in msg


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"loss.lam": 0.0, "loss.grpo_coef": 0.0}, "nothing would be trained"),
        ({"rollout.max_think_tokens": 0}, "rollout.thinking=True needs rollout.max_think_tokens > 0"),
        ({"insight.first_k_max_successes": 11}, "exceeds insight.first_k=10"),
        ({"rollout.top_k": 0}, "rollout.top_k=0"),
        ({"loss.insight_rollouts": "off_policy", "insight.schedule": "never"}, "inserts none"),
        ({"insight.content": "strategy"}, "SGE has no insight SFT"),
        ({"mesh.data": -1, "mesh.fsdp": -1}, "with at most one -1"),
        ({"batch.length_buckets": "256,1024"}, "longest bucket 1024 is shorter than rollout.max_context_tokens=32768"),
        ({"batch.length_buckets": "pow2"}, r"batch.length_buckets='pow2' is not one of 'geometric', 'multiples'"),
        ({"rollout.group_size": 1}, r"rollout.group_size=1: nothing can be learned .* use rollout.group_size >= 2"),
        (
            {"rollout.group_size": 1, "loss.grpo_coef": 0.0},
            "rollout.group_size=1: nothing can be learned",
        ),  # insights need a 2nd attempt
    ],
)
def test_inconsistent_combinations(overrides, message):
    with pytest.raises(base.ConfigError, match=message):
        base.validate(base.override(_config("sapi"), overrides))


def test_nonfinite_numbers_are_rejected_by_name():
    bad = base.override(
        _config("sapi"),
        {"optim.learning_rate": float("nan"), "loss.lam": float("inf"), "env.step_timeout_s": float("-inf")},
    )
    with pytest.raises(base.ConfigError) as e:
        base.validate(bad)
    msg = str(e.value)
    for line in (
        "optim.learning_rate=nan is not a finite number",
        "loss.lam=inf is not a finite number",
        "env.step_timeout_s=-inf is not a finite number",
    ):
        assert line in msg
    assert msg.count("\n  - ") == 3  # one line per key, no range message on top


# --- the launcher --------------------------------------------------------------------------------------


def _train(*args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launcher_dry_run_prints_the_resolved_config():
    r = _train("--config=configs/sapi.py:tiny", "--ablation=grpo", "--config.loss.lam=0.3", "--dry_run")
    assert r.returncode == 0, r.stderr
    assert "preset: tiny" in r.stdout and "schedule: never" in r.stdout and "lam: 0.3" in r.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config.loss.foo=1"], "unknown config key 'loss.foo'"),
        (["--config.loss.lam=abc"], "could not convert string to float: 'abc'"),
        (["--config.loss.clip_eps=2"], "loss.clip_eps=2.0 is outside (0.0, 1.0)"),
        (["--ablation=nope"], "unknown ablation 'nope'"),
        (["--config=configs/sapi.py:huge"], "unknown preset 'huge'"),
        (["--config=configs/nope.py"], "no config file 'configs/nope.py'"),
        (
            ["--config", "configs/nope.py"],
            "no config file 'configs/nope.py' (from '--config configs/nope.py'); use --config=FILE[:PRESET]",
        ),
        (["--config"], "--config needs a file: use --config=FILE[:PRESET]"),
        (["--config.optim.learning_rate=nan"], "optim.learning_rate=nan is not a finite number"),
    ],
)
def test_launcher_errors_are_clear(args, message):
    r = _train("--config=configs/sapi.py:tiny", *args, "--dry_run")
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_launcher_lists_ablations():
    r = _train("--list_ablations")
    assert r.returncode == 0
    assert len(r.stdout.strip().splitlines()) == len(ablations.ABLATIONS)


def test_a_preset_that_contradicts_the_checkpoint_is_flagged_before_any_weights_load(tmp_path, caplog):
    """model.preset against model.checkpoint's config.json, in validation (so `--dry_run` too): another preset's
    architecture is refused naming it; one that is no preset's is accepted with a warning; a broken config.json is
    one line. Only config.json is read (the directories below hold no weights)."""
    import dataclasses
    import json
    import logging

    from rltldr_jax.models import get_preset

    def checkpoint(name, arch):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps(arch.to_hf_dict()))
        return str(tmp_path / name)

    tiny = checkpoint("tiny", get_preset("tiny"))
    c = _config("sapi")  # model.preset = qwen3_5_9b
    c.model.checkpoint = tiny
    with pytest.raises(base.ConfigError, match=r"model.preset=qwen3_5_9b but model.checkpoint=.*/tiny is the tiny "):
        base.validate(c)
    c.model.preset = "tiny"
    base.validate(c)
    c.model.checkpoint = checkpoint(
        "mine", dataclasses.replace(get_preset("tiny"), num_hidden_layers=2, layer_types=())
    )
    with caplog.at_level(logging.WARNING):
        base.validate(c)
    assert "is not the architecture of model.preset=tiny (num_hidden_layers 2 vs 8" in caplog.text
    (tmp_path / "mine" / "config.json").write_text("{not json")
    with pytest.raises(base.ConfigError, match=r"model.checkpoint: .*/mine/config.json is not a usable Qwen 3.5"):
        base.validate(c)


def test_loading_a_missing_config_file_names_the_ones_there(monkeypatch):
    """`rltldr_jax.config.load` (what the notebooks and scripts call) says which config files exist, the replication's
    included, as the launchers' --config error does."""
    from rltldr_jax.config import load

    monkeypatch.chdir(ROOT)
    with pytest.raises(FileNotFoundError, match=r"configs/ holds appworld.py, leetcode.py, replicate.py, "):
        load("configs/nope.py")
