"""The small-scale replication's pipeline: arms, the small tokenizer, pretraining from scratch (cached), and a smoke
grid through the real code path (pretraining, base checks, Trainer runs, offline SFTL;DR, the report)."""

import csv
import dataclasses
import json
import os

import numpy as np
import pytest

from rltldr_jax.config import base, replicate
from rltldr_jax.settings import as_dict, replace
from rltldr_jax.tokenization import CHATML_SPECIAL_TOKENS, ContextBuilder, load_tokenizer, train_chatml_tokenizer


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_arms_differ_exactly_in_their_keys():
    ref = _flat(as_dict(replicate.arm_config("default", "rltldr", 0)))

    def lam(value):  # the λ arm equal to rltldr's default differs in nothing (the grid runs it once)
        return set() if value == replicate.DEFAULT_LAMBDA else {"loss.lam"}

    expected = {
        "grpo": {"insight.schedule", "loss.lam"},
        "lambda_0": lam(0.0),
        "lambda_0.03": lam(0.03),
        "lambda_0.1": lam(0.1),
        "lambda_0.5": lam(0.5),
        "sft_only": {"loss.grpo_coef"},
        "uninformative_insights": {"insight.source"},
        "sftldr": {"mode", "sft.data"},
        "declarative_lambda_0": {"pretrain.statement_prob"} | lam(0.0),
        "declarative_lambda_0.5": {"pretrain.statement_prob"} | lam(0.5),
    }
    assert set(expected) | {"rltldr"} == set(replicate.ARMS)
    for arm, keys in expected.items():
        config = _flat(as_dict(replicate.arm_config("default", arm, 0)))
        changed = {k for k in ref if ref[k] != config[k]} - {"name"}
        assert changed == keys, arm
    lams = {
        arm: replicate.arm_config("default", arm, 0).loss.lam
        for arm in ("lambda_0", "lambda_0.03", "lambda_0.1", "lambda_0.5", "grpo")
    }
    assert lams == {"lambda_0": 0.0, "lambda_0.03": 0.03, "lambda_0.1": 0.1, "lambda_0.5": 0.5, "grpo": 0.0}
    assert replicate.arm_config("default", "grpo", 0).insight.schedule == "never"
    # every seed and arm of one preset shares the pretrained policy; another seed or preset does not
    from rltldr_jax.train.pretrain import pretrained_dir

    dirs = {pretrained_dir(replicate.arm_config("default", arm, 0)) for arm in replicate.CORE_ARMS}
    assert len(dirs) == 1
    assert pretrained_dir(replicate.arm_config("default", "declarative_lambda_0", 0)) not in dirs  # its own pretraining
    assert pretrained_dir(replicate.arm_config("default", "grpo", 1)) not in dirs
    assert pretrained_dir(replicate.arm_config("quick", "grpo", 0)) in dirs  # quick shares the full grid's seed 0
    assert pretrained_dir(replicate.arm_config("smoke", "grpo", 0)) not in dirs
    with pytest.raises(base.ConfigError, match="unknown arm"):
        replicate.arm_config("default", "nope", 0)


def test_small_chatml_tokenizer(tmp_path):
    texts = ['Craft "torch". Inventory: nothing.', '```python\ngather("wood")\ncraft("stick")\n```'] * 50
    tok = train_chatml_tokenizer(texts, 300)
    assert tok.vocab_size == 300
    assert [tok.token_to_id(t) for t in CHATML_SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    for text in (*texts[:2], "unseen ü text <|im_end|> 123"):
        assert tok.decode(tok.encode(text)) == text  # byte level: anything round-trips, specials stay text
    assert tok.encode("<|im_end|>", special=True) == [tok.im_end_id]
    tok.save(str(tmp_path))
    again = load_tokenizer(tmp_path)
    assert again.encode(texts[1]) == tok.encode(texts[1])
    ContextBuilder(again, thinking=False)  # has what the chat format needs


@pytest.fixture(scope="module")
def smoke_grid(tmp_path_factory):
    from rltldr_jax.replication.driver import run_replication

    out = str(tmp_path_factory.mktemp("replicate"))
    overrides = {"pretrain.cache_dir": os.path.join(out, "pretrained")}
    arms = ("grpo", "rltldr", "uninformative_insights", "sftldr")
    configs = {(arm, 0): replicate.arm_config("smoke", arm, 0, overrides) for arm in arms}
    lines: list[str] = []
    paths = run_replication(configs, out, checks=replicate.CHECKS["smoke"], echo=lines.append)
    return out, paths, lines


def test_smoke_grid_writes_the_report(smoke_grid):
    out, paths, lines = smoke_grid
    assert sorted(os.path.basename(p) for p in paths) == [
        "curves.png",
        "insight_curves.png",
        "results.csv",
        "results.md",
    ]
    with open(os.path.join(out, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["arm"] for r in rows] == ["grpo", "rltldr", "uninformative_insights", "sftldr"]
    for column in (
        "arm",
        "seed",
        "train_pass1_no_insight",
        "heldout_pass1_no_insight",
        "train_pass1_insight",
        "env_steps",
        "walltime_s",
        "train_pass1_no_insight_best",
    ):
        assert all(r[column] != "" for r in rows), column
    config = replicate.arm_config("smoke", "rltldr", 0)
    steps = config.rollout.tasks_per_phase * config.rollout.group_size  # one attempt = one env step; one phase
    assert [int(r["env_steps"]) for r in rows] == [steps, steps, steps, 0]  # sftldr is offline
    assert [float(r["lam"]) for r in rows] == [0.0, *[replicate.DEFAULT_LAMBDA] * 3]
    with open(os.path.join(out, "base", "s0", "checks.json")) as f:
        checks = json.load(f)["checks"]
    assert checks["iid_pass@2"] == 0.0 and "sequential_pass@1_insight" in checks and "heldout_pass@1" in checks
    assert any(line.startswith("seed 0: base checks") for line in lines)
    assert sum(" seed 0: no-insight Pass@1 train " in line for line in lines) == 4
    md = open(os.path.join(out, "results.md")).read()
    assert "| grpo | 1 |" in md and "base policy (step 0)" in md and "0-1 / 0-1" in md  # the paper's GRPO row


def test_arms_insert_what_they_should(smoke_grid):
    from rltldr_jax.agent.rollout_files import load_rollouts
    from rltldr_jax.envs import craft

    out, _, _ = smoke_grid
    records = {
        arm: load_rollouts(os.path.join(out, "runs", f"{arm}-s0"))
        for arm in ("grpo", "rltldr", "uninformative_insights")
    }
    assert not any(r.with_insights or r.writer_output for r in records["grpo"])  # GRPO: no insight written or inserted
    real = [r.written_insight for r in records["rltldr"] if r.written_insight]
    fake = [r.written_insight for r in records["uninformative_insights"] if r.written_insight]
    assert real and fake
    tools = set(craft.HIDDEN_RULES.values())
    assert not any(t in f for f in fake for t in tools)
    # the first attempts (same seeds, same base policy, no insight yet) fail alike: each gets one insight in both arms
    first = {
        arm: {r.task_id for r in records[arm] if r.attempt.index == 1 and r.written_insight}
        for arm in ("rltldr", "uninformative_insights")
    }
    assert first["rltldr"] == first["uninformative_insights"]  # (equal token lengths: tests/test_craft.py)


def test_a_second_run_only_reads_what_is_there(smoke_grid):
    from rltldr_jax.replication.driver import run_replication

    out, _, _ = smoke_grid
    before = {
        p: os.path.getmtime(p)
        for p in (os.path.join(out, "runs", "grpo-s0", "summary.json"), os.path.join(out, "base", "s0", "checks.json"))
    }
    configs = {
        ("grpo", 0): replicate.arm_config("smoke", "grpo", 0, {"pretrain.cache_dir": os.path.join(out, "pretrained")})
    }
    lines: list[str] = []
    run_replication(configs, out, checks=replicate.CHECKS["smoke"], echo=lines.append)
    assert {p: os.path.getmtime(p) for p in before} == before
    assert any("grpo seed 0" in line for line in lines)


@pytest.mark.slow  # 40 CPU s: the smoke grid again, two runs at a time
def test_jobs_do_not_change_results(smoke_grid, tmp_path):
    """The smoke grid ran one piece at a time; the same runs two at a time (`jobs=2`) give the same results, bit for
    bit: every run's phases and evaluations, its final parameters (the checkpoint's checksums), and the base checks."""
    from rltldr_jax.replication.driver import run_replication

    out, _, _ = smoke_grid
    again = str(tmp_path / "parallel")
    run_replication(
        _smoke_configs(out, ("grpo", "rltldr", "sftldr")), again, checks=replicate.CHECKS["smoke"], jobs=2, echo=print
    )

    def results(grid, run):
        directory = os.path.join(grid, "runs", run)
        records = []
        if os.path.exists(os.path.join(directory, "metrics.jsonl")):  # (sftldr trains offline: no phases)
            with open(os.path.join(directory, "metrics.jsonl")) as f:
                records = [json.loads(line) for line in f]
        with open(os.path.join(directory, "summary.json")) as f:
            final = json.load(f)["final"]
        (step,) = os.listdir(os.path.join(directory, "checkpoints"))
        with open(os.path.join(directory, "checkpoints", step, "state", "metadata")) as f:
            params = json.load(f)["checksums"]["params"]
        timeless = [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")} for r in records]
        assert len(params) > 10 and final
        return timeless, final, params

    for run in ("grpo-s0", "rltldr-s0", "sftldr-s0"):
        assert results(again, run) == results(out, run), run
    with (
        open(os.path.join(again, "base", "s0", "checks.json")) as a,
        open(os.path.join(out, "base", "s0", "checks.json")) as b,
    ):
        assert json.load(a)["checks"] == json.load(b)["checks"]


def test_run_tasks_keeps_the_order_it_is_given_and_runs_jobs_at_once():
    import threading
    import time

    from rltldr_jax.replication.driver import Task, run_tasks

    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    running, most = [0], [0]

    def piece(key, seconds=0.05):
        def do():
            with lock:
                log.append(("start", key))
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(seconds)
            with lock:
                running[0] -= 1
                log.append(("end", key))

        return do

    tasks = [
        Task("base", piece("base", 0.2)),
        Task("checks", piece("checks"), ("base",)),
        Task("a", piece("a", 0.2), ("base",)),
        Task("b", piece("b"), ("a",)),
        Task("c", piece("c"), ("base",)),
    ]
    run_tasks(tasks, jobs=2)
    at = {event: log.index(event) for event in log}
    assert at["end", "base"] < min(at["start", k] for k in ("checks", "a", "c"))
    assert at["end", "a"] < at["start", "b"]
    assert most[0] == 2 and len(log) == 10
    log.clear()
    running[0] = most[0] = 0
    run_tasks(tasks, jobs=1)
    assert [k for event, k in log if event == "start"] == ["base", "checks", "a", "b", "c"] and most[0] == 1

    def boom():
        raise RuntimeError("no base policy")

    log.clear()
    with pytest.raises(RuntimeError, match="no base policy"):
        run_tasks([Task("base", boom), Task("a", piece("a"), ("base",))], jobs=2)
    assert log == []  # nothing starts after a task's error
    with pytest.raises(ValueError, match="comes after"):
        run_tasks([Task("a", piece("a"), ("base",))])


def _smoke_configs(out, arms, **overrides):
    """The smoke preset's configs of `arms` (seed 0), pretrained in the smoke grid's cache under `out`."""
    extra = {"pretrain.cache_dir": os.path.join(out, "pretrained"), **overrides}
    return {(arm, 0): replicate.arm_config("smoke", arm, 0, extra) for arm in arms}


def _rows(out):
    with open(os.path.join(out, "results.csv")) as f:
        return [(r["arm"], int(r["seed"]), r["workdir"]) for r in csv.DictReader(f)]


def _copy_grid(out, to):
    """A copy of a finished grid directory (its runs and base checks; the pretrained policy stays in `out`)."""
    import shutil

    shutil.copytree(out, to, ignore=shutil.ignore_patterns("pretrained"))
    return str(to)


def test_the_report_holds_every_finished_run_in_out(smoke_grid):
    """Launchers with disjoint --arms on one --out (the README's way to run arms side by side): each writes the
    report from every finished run there, so the last one to finish leaves the complete table; an arm that shared
    another's run keeps its row. Each report file is replaced whole (a new file moved into place)."""
    from rltldr_jax.replication.driver import run_replication

    out, _, _ = smoke_grid
    # lambda_0.03 equals rltldr (λ = 0.03): it shares rltldr's finished run
    lines: list[str] = []
    run_replication(
        _smoke_configs(out, ("rltldr", "lambda_0.03")), out, checks=replicate.CHECKS["smoke"], echo=lines.append
    )
    assert any(line.startswith("lambda_0.03 (= rltldr) seed 0: no-insight Pass@1") for line in lines)
    files = {name: os.stat(os.path.join(out, name)).st_ino for name in ("results.csv", "results.md", "curves.png")}
    run_replication(_smoke_configs(out, ("grpo",)), out, checks=replicate.CHECKS["smoke"], echo=lines.append)
    expected = [
        ("grpo", 0, "runs/grpo-s0"),
        ("rltldr", 0, "runs/rltldr-s0"),
        ("lambda_0.03", 0, "runs/rltldr-s0"),
        ("uninformative_insights", 0, "runs/uninformative_insights-s0"),
        ("sftldr", 0, "runs/sftldr-s0"),
    ]
    assert sorted(_rows(out)) == sorted(expected)
    md = open(os.path.join(out, "results.md")).read()
    for arm in ("grpo", "rltldr (= lambda_0.03)", "uninformative_insights", "sftldr"):  # (one row per distinct run)
        assert f"| {arm} | 1 |" in md, arm
    assert "| lambda_0.03 |" not in md and "Here `rltldr` trains with λ = 0.03 (the paper's λ is 0.5)." in md
    assert all(os.stat(os.path.join(out, name)).st_ino != inode for name, inode in files.items())
    assert not [name for name in os.listdir(out) if ".tmp" in name]
    # the launcher orders the rows by configs/replicate.py ARMS, whoever ran them
    run_replication(
        _smoke_configs(out, ("grpo",)),
        out,
        checks=replicate.CHECKS["smoke"],
        order=list(replicate.ARMS),
        echo=lines.append,
    )
    assert _rows(out) == expected


def test_a_run_made_with_other_settings_is_refused(smoke_grid):
    """Rerunning a finished grid with a changed training setting does not report the old runs as if they were the
    new ones: nothing runs, and the error names the run, the key that differs and the fix."""
    from rltldr_jax.replication.driver import run_replication

    out, _, _ = smoke_grid
    summary = os.path.join(out, "runs", "grpo-s0", "summary.json")
    stamp = os.path.getmtime(summary)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match=r"grpo-s0.*optim\.learning_rate: 0\.001 -> 0\.002.*--restart") as e:
        run_replication(
            _smoke_configs(out, ("grpo", "rltldr"), **{"optim.learning_rate": 0.002}),
            out,
            checks=replicate.CHECKS["smoke"],
            echo=lines.append,
        )
    assert type(e.value).__name__ == "GridError" and "\n" not in str(e.value)
    assert "rltldr-s0" in str(e.value)  # every run that differs is named
    assert os.path.getmtime(summary) == stamp and lines == []  # refused before anything ran


def test_a_grid_with_another_base_policy_is_refused(smoke_grid):
    """Changed pretraining settings mean another base policy: the finished runs and the seed's base checks (made on
    the old one) are refused before anything is pretrained."""
    from rltldr_jax.replication.driver import run_replication
    from rltldr_jax.train.pretrain import pretrained_dir

    out, _, _ = smoke_grid
    steps = replicate.get_config("smoke").pretrain.steps
    configs = _smoke_configs(out, ("grpo",), **{"pretrain.steps": steps + 1})
    with pytest.raises(RuntimeError) as e:
        run_replication(configs, out, checks=replicate.CHECKS["smoke"], echo=print)
    message = str(e.value)
    assert "grpo-s0 (model.checkpoint: " in message and f"pretrain.steps: {steps} -> {steps + 1}" in message, message
    assert "the base checks of seed 0 (base policy " in message and "--restart" in message, message
    assert not os.path.exists(pretrained_dir(configs[("grpo", 0)]))


def test_the_launcher_refuses_a_changed_grid_in_one_line(smoke_grid):
    import subprocess
    import sys

    out, _, _ = smoke_grid
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(repo, "launch", "replicate.py"),
            "--config=" + os.path.join(repo, "configs", "replicate.py:smoke"),
            "--arms=grpo",
            f"--out={out}",
            f"--config.pretrain.cache_dir={os.path.join(out, 'pretrained')}",
            "--config.loss.lam=0.5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: grpo-s0: the finished run in ") and "loss.lam: 0.0 -> 0.5" in line, line
    assert "--restart" in line


def test_old_summaries_are_compared_by_digest_then_by_checkpoint(smoke_grid):
    """A summary written before summaries recorded their config: compared by its digest, and when that differs
    (e.g. the code has new config keys since) by the config saved with the run's checkpoint."""
    from rltldr_jax.replication.grid import config_digest, plan_runs, stale_reason

    out, _, _ = smoke_grid
    (run,) = plan_runs(_smoke_configs(out, ("grpo",)), out)
    (changed,) = plan_runs(_smoke_configs(out, ("grpo",), **{"loss.lam": 0.5}), out)
    checkpoint = json.load(open(os.path.join(out, "runs", "grpo-s0", "summary.json")))["config"]["model"]["checkpoint"]
    run = dataclasses.replace(run, config=replace(run.config, {"model.checkpoint": checkpoint}))
    changed = dataclasses.replace(changed, config=replace(changed.config, {"model.checkpoint": checkpoint}))
    old = {"arm": "grpo", "seed": 0, "digest": config_digest(run.config)}
    assert stale_reason(run, old) is None
    assert stale_reason(changed, old) == "loss.lam: 0.0 -> 0.5"  # (read from the checkpoint)
    assert stale_reason(run, {**old, "digest": "0123456789ab"}) is None  # digests differ, the checkpoint agrees


def test_restart_redoes_a_changed_run_and_moves_the_old_one_aside(smoke_grid, tmp_path):
    from rltldr_jax.replication.driver import run_replication

    out = _copy_grid(smoke_grid[0], tmp_path / "grid")
    configs = _smoke_configs(smoke_grid[0], ("grpo",), **{"optim.learning_rate": 0.002})
    lines: list[str] = []
    run_replication(configs, out, checks=replicate.CHECKS["smoke"], restart=True, echo=lines.append)
    (old,) = [name for name in os.listdir(os.path.join(out, "runs")) if name.startswith("grpo-s0.old-")]
    assert json.load(open(os.path.join(out, "runs", old, "summary.json")))["config"]["optim"]["learning_rate"] == 1e-3
    new = json.load(open(os.path.join(out, "runs", "grpo-s0", "summary.json")))
    assert new["config"]["optim"]["learning_rate"] == 0.002
    assert [(arm, workdir) for arm, _, workdir in _rows(out)][0] == ("grpo", "runs/grpo-s0")  # (not the old one)
    assert {arm for arm, _, _ in _rows(out)} >= {"grpo", "rltldr", "uninformative_insights", "sftldr"}
    # then it is a run made with these settings: a rerun reads it
    stamp = os.path.getmtime(os.path.join(out, "runs", "grpo-s0", "summary.json"))
    run_replication(configs, out, checks=replicate.CHECKS["smoke"], echo=lines.append)
    assert os.path.getmtime(os.path.join(out, "runs", "grpo-s0", "summary.json")) == stamp


def test_a_run_another_launcher_is_running_is_waited_for(smoke_grid, tmp_path):
    """The same arm launched twice: the second launcher finds the run's workdir locked by the first, says so in one
    line, waits, then reads the first one's result (no traceback, no run trained twice, no table left out)."""
    import threading
    import time

    from rltldr_jax.replication.driver import run_replication
    from rltldr_jax.train.resume import lock_workdir

    out = _copy_grid(smoke_grid[0], tmp_path / "grid")
    workdir = os.path.join(out, "runs", "grpo-s0")
    summary = os.path.join(workdir, "summary.json")
    os.rename(summary, tmp_path / "summary.json")  # the other launcher is still running grpo-s0
    lock = lock_workdir(workdir)
    lines: list[str] = []
    result: dict = {}

    def second_launcher():
        try:
            result["paths"] = run_replication(
                _smoke_configs(smoke_grid[0], ("grpo",)), out, checks=replicate.CHECKS["smoke"], echo=lines.append
            )
        except BaseException as e:  # noqa: BLE001 (reported below)
            result["error"] = e

    thread = threading.Thread(target=second_launcher)
    thread.start()
    waiting = f"grpo seed 0: in use by another process (pid {os.getpid()}): waiting for it to end"
    try:
        deadline = time.time() + 300
        while waiting not in lines and thread.is_alive() and time.time() < deadline:
            time.sleep(0.2)
        assert waiting in lines, (lines, result)
        time.sleep(3 * 2.0)  # (it goes on waiting)
        assert thread.is_alive() and not os.path.exists(summary)
    finally:
        os.rename(tmp_path / "summary.json", summary)  # the first launcher finishes the run
        lock.close()
        thread.join(300)
    assert "error" not in result, result
    assert lines.count(waiting) == 1
    assert sum(line.startswith("grpo seed 0: no-insight Pass@1") for line in lines) == 1
    arms = [arm for arm, _, _ in _rows(out)]
    assert set(arms) >= {"grpo", "rltldr", "sftldr", "uninformative_insights"} and len(arms) == len(set(arms))
    assert not [name for name in os.listdir(os.path.join(out, "runs")) if ".old-" in name]  # nothing redone


@pytest.mark.slow
def test_two_launchers_share_one_grid(tmp_path):
    """Two real launchers on one --out, started together, with one arm in common (rltldr) and one each of their own:
    the base policy and rltldr are made once (the other launcher waits, saying so), both exit 0 without a traceback,
    and the report holds the three arms (4-6 minutes on 2 cores)."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "grid")
    launcher = [
        sys.executable,
        os.path.join(repo, "launch", "replicate.py"),
        "--config=" + os.path.join(repo, "configs", "replicate.py:smoke"),
        f"--out={out}",
        f"--config.pretrain.cache_dir={tmp_path / 'pretrained'}",
    ]
    procs = [
        subprocess.Popen(launcher + [arms], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        for arms in ("--arms=grpo,rltldr", "--arms=rltldr,uninformative_insights")
    ]
    outputs = [p.communicate(timeout=1800) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0 and "Traceback" not in stderr, stdout[-3000:] + stderr[-3000:]
        assert "resume: no checkpoint" not in stderr  # (a fresh run starts as one, though the lock made its workdir)
    said = "\n".join(stdout for stdout, _ in outputs)
    assert "in use by another process" in said and "waiting for it to end" in said
    assert sum(line.startswith("rltldr seed 0: no-insight Pass@1") for line in said.splitlines()) == 2
    assert _rows(out) == [
        ("grpo", 0, "runs/grpo-s0"),
        ("rltldr", 0, "runs/rltldr-s0"),
        ("uninformative_insights", 0, "runs/uninformative_insights-s0"),
    ]
    assert sorted(os.listdir(os.path.join(out, "runs"))) == ["grpo-s0", "rltldr-s0", "uninformative_insights-s0"]
    phases = [json.loads(line) for line in open(os.path.join(out, "runs", "rltldr-s0", "metrics.jsonl"))]
    assert len([r for r in phases if r["kind"] == "phase"]) == 1  # trained once (the smoke budget is one phase)


def test_pretraining_is_cached_and_loads_as_a_checkpoint(smoke_grid):
    from rltldr_jax.models import load_pretrained
    from rltldr_jax.train.pretrain import pretrain, pretrained_dir

    out, _, _ = smoke_grid
    config = replicate.arm_config("smoke", "grpo", 0, {"pretrain.cache_dir": os.path.join(out, "pretrained")})
    path = pretrained_dir(config)
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "pretrain.json", "tokenizer.json"]
    stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
    assert pretrain(config) == path and os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp
    record = json.load(open(os.path.join(path, "pretrain.json")))
    assert record["nll_curve"][-1][0] == config.pretrain.steps and np.isfinite(record["nll_curve"][-1][1])
    model = load_pretrained(path)
    assert model.config.vocab_size == 512 and 400 < load_tokenizer(path).vocab_size <= config.pretrain.vocab_size


def test_every_preset_resolves_and_the_gpu_policy_is_the_5_to_20m_one():
    import jax
    from flax import nnx

    from rltldr_jax.models import ModelSpec, get_preset

    for preset, (arms, seeds) in replicate.GRIDS.items():
        assert preset in replicate.CHECKS and set(arms) <= set(replicate.ARMS) and seeds, preset
        for arm in arms:
            replicate.arm_config(preset, arm, seeds[-1])  # validates
    gpu = replicate.arm_config("gpu", "rltldr", 9)
    params = sum(x.size for x in jax.tree.leaves(nnx.state(ModelSpec(get_preset(gpu.model.preset)).abstract())))
    assert 5e6 <= params <= 20e6 and len(replicate.GRIDS["gpu"][1]) == 10


def test_pretrain_launcher_prints_the_cached_checkpoint(smoke_grid):
    import subprocess
    import sys

    out, _, _ = smoke_grid
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cache = os.path.join(out, "pretrained")
    cmd = [
        sys.executable,
        os.path.join(repo, "launch", "pretrain.py"),
        "--config=" + os.path.join(repo, "configs", "replicate.py:smoke"),
        f"--config.pretrain.cache_dir={cache}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from rltldr_jax.train.pretrain import pretrained_dir

    assert proc.stdout.strip() == pretrained_dir(
        replicate.arm_config("smoke", "grpo", 0, {"pretrain.cache_dir": cache})
    )
    bad = subprocess.run(
        [*cmd[:2], "--config=" + os.path.join(repo, "configs", "sapi.py:tiny")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "pretrain.steps is 0" in bad.stderr


def test_a_run_process_ends_with_its_grid(tmp_path):
    """A grid stopped with `kill` (not Ctrl-C, which reaches the whole process group) leaves no run going on alone:
    the process `isolated` started ends within seconds of its parent."""
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "work.py").write_text(
        "import os, time\n\ndef work(path):\n    with open(path, 'w') as f:\n        f.write(str(os.getpid()))\n"
        "    time.sleep(300)\n"
    )
    marker = tmp_path / "pid"
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from work import work; "
        f"from rltldr_jax.replication.driver import isolated; isolated(work, {str(marker)!r})"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.time() + 120
        while not (marker.exists() and marker.read_text()) and time.time() < deadline and parent.poll() is None:
            time.sleep(0.2)
        child = int(marker.read_text())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    assert child != parent.pid  # the marker names the run's process, not the grid's
    deadline = time.time() + 15
    while alive(child) and time.time() < deadline:
        time.sleep(0.2)
    survived = alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived, "the run's process outlived its killed grid"


def test_the_shipped_base_policies_match_the_replication(tmp_path):
    """Seeds 0-2 of the replication ship pretrained; a change to the world, the recipe or the preset that changes
    the pretraining key must come with rebuilt ones (the command is in `shipped_dir`'s docstring)."""
    from rltldr_jax.replication.driver import base_policy
    from rltldr_jax.train.pretrain import SHIPPED_DIR, pretrain, pretrain_key, shipped_dir

    for seed in replicate.GRIDS["default"][1]:
        config = replicate.arm_config("default", "rltldr", seed, {"pretrain.cache_dir": str(tmp_path)})
        path = shipped_dir(config)
        assert path is not None, (
            f"no base policy for seed {seed} in {SHIPPED_DIR} (listed: {os.listdir(SHIPPED_DIR)}): rebuild them"
        )
        assert pretrain(config) == path == base_policy(config)  # used as is: nothing pretrained into the cache
        assert os.listdir(tmp_path) == []
        with open(os.path.join(path, "pretrain.json"), encoding="utf-8") as f:
            record = json.load(f)
        assert record["key"] == pretrain_key(config) and record["seed"] == seed
        assert (
            record["pretrain"]["steps"] == config.pretrain.steps and record["nll_curve"][-1][0] == config.pretrain.steps
        )
        assert replicate.arm_config("quick", "grpo", seed).model.preset == config.model.preset
        assert shipped_dir(replicate.arm_config("quick", "grpo", seed, {"pretrain.cache_dir": str(tmp_path)})) == path
    assert shipped_dir(replace(config, {"pretrain.shipped": False})) is None
