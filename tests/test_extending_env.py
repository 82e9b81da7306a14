"""An environment defined outside the package (examples/my_env.py), used as `env.name = "examples.my_env:SPEC"`:
one phase through the real Trainer, and the one-line errors of a bad `package.module:SPEC`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types

import pytest
from helpers import tiny_config, tiny_run_settings, tiny_settings

from examples import my_env
from rltldr_jax.agent.episode import task_text
from rltldr_jax.agent.rollout_files import load_rollouts
from rltldr_jax.agent.rule_insight import rule_insight
from rltldr_jax.agent.writer_prompt import render_writer_prompt
from rltldr_jax.config import base
from rltldr_jax.envs import registry
from rltldr_jax.envs.spec import EnvSpec, env_name_error, get_spec, register
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.setup import workdir_of

PATH = "examples.my_env:SPEC"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_external_spec_resolves_registers_and_serves_its_tasks():
    spec = get_spec(PATH)
    assert spec is my_env.SPEC and get_spec("echo_words") is spec  # registered under its name: tasks find it
    tasks = registry.load_tasks(PATH, "train")
    assert [t.task_id for t in tasks] == [f"echo_words/{w}" for w in my_env.WORDS["train"]]
    assert all(t.env == "echo_words" for t in tasks)
    assert task_text(tasks[0]) == "Print the word apple.\nWrite one Python code block that prints it."
    env = registry.make_env(PATH, step_timeout_s=1.0)
    assert env.reset(tasks[0]) == tasks[0].goal and env.step('print("pear")').done
    report = env.verify().report
    assert rule_insight(report, "echo_words") == "Make sure your code prints exactly 'apple' (this attempt had 'pear')."
    assert env.reset(tasks[0]) and env.step('print("apple")').observation == "apple" and env.verify().success
    assert registry.world_fingerprint(PATH) == registry.world_fingerprint("echo_words")  # its module's source
    with pytest.raises(ValueError, match="no pretraining demonstrations"):
        registry.demonstrations(PATH)
    with pytest.raises(ValueError, match="no uninformative control insights"):
        registry.uninformative_insight(PATH)
    with pytest.raises(ValueError, match="already registered as 'echo_words'"):
        register(EnvSpec("echo_words", my_env.load_tasks, my_env._make_env, "{goal}"))
    assert workdir_of(tiny_settings({"env.name": PATH})).endswith("/runs/echo_words-tiny")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("examples.no_such_env:SPEC", "cannot import module 'examples.no_such_env'"),
        ("examples.my_env:NOPE", "module 'examples.my_env' has no attribute 'NOPE'"),
        ("examples.my_env:EchoEnv", "examples.my_env.EchoEnv is a type, not an EnvSpec"),
        ("examples.my_env:", "is not of the form package.module:SPEC"),
        ("webshop", "unknown environment 'webshop'"),
    ],
)
def test_a_bad_env_name_is_one_line_naming_the_problem_and_the_fix(name, problem):
    error = env_name_error(name)
    assert error is not None and problem in error and "\n" not in error
    assert "package.module:SPEC" in error or "EnvSpec(" in error
    c = tiny_config({"env.name": name}, validate=False)
    with pytest.raises(base.ConfigError) as info:
        base.validate(c)
    assert [line for line in str(info.value).splitlines() if problem in line] == [f"  - {error}"]


def test_a_spec_name_may_not_take_a_builtin_name(monkeypatch):
    fake = types.ModuleType("fake_sapi")
    fake.SPEC = dataclasses.replace(my_env.SPEC, name="sapi")
    monkeypatch.setitem(sys.modules, "fake_sapi", fake)  # importable, as if installed
    error = env_name_error("fake_sapi:SPEC")
    assert error is not None and "the name of a built-in environment; rename it" in error


def test_one_phase_of_training_in_the_external_environment(tmp_path):
    """The real Trainer on the tiny config, one phase of 1 task × 2 attempts, rule insights (tiny preset)."""
    config = tiny_run_settings(str(tmp_path / "run"), 1, {"env.name": PATH})
    trainer = Trainer(config)
    try:
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    records = load_rollouts(config.workdir)
    assert len(records) == 2 and [r.attempt.index for r in records] == [1, 2]
    assert {r.attempt.task.env for r in records} == {"echo_words"}
    assert {r.attempt.task.task_id for r in records} <= {f"echo_words/{w}" for w in my_env.WORDS["train"]}
    assert metrics["rollout/counts/attempts"] == 2.0 and metrics["rollout/counts/tasks"] == 1.0
    assert metrics["rollout/pass@1/all"] == 0.0  # a random tiny policy prints no word
    first = records[0]
    insight = first.writer_output["insight"]
    assert insight == my_env.rule_failure(first.attempt.verdict.report) and insight.startswith("Make sure your code")
    assert [i.text for i in records[1].attempt.insights] == [insight]  # the second attempt acted on it
    assert metrics["rollout/counts/env_steps"] == sum(r.attempt.env_steps for r in records)
    # The spec's task prompt is what the attempt's context starts with; its writer-prompt variant is "device".
    goal = task_text(first.attempt.task)
    assert goal == f"{first.attempt.task.goal}\nWrite one Python code block that prints it."
    assert "Write one Python code block" in trainer.builder.tokenizer.decode(trainer.builder.build(goal, ()).ids)
    writer_prompt = render_writer_prompt(first.attempt.failed_attempt(trainer.builder))
    assert first.attempt.verdict.report.strip() in writer_prompt


@pytest.mark.parametrize(
    ("name", "code", "shown"),
    [
        (PATH, 0, "name: examples.my_env:SPEC"),
        ("examples.my_env:NOPE", 1, "module 'examples.my_env' has no attribute 'NOPE'; give env.name as"),
    ],
)
def test_the_launcher_takes_an_import_path(name, code, shown):
    r = subprocess.run(
        [sys.executable, "launch/train.py", "--config=configs/sapi.py:tiny", f"--config.env.name={name}", "--dry_run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == code and shown in (r.stdout if code == 0 else r.stderr) and "Traceback" not in r.stderr
