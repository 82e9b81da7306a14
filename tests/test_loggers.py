"""A run's logs besides metrics.jsonl (rltldr_jax/train/loggers.py): Weights & Biases in offline mode (no network) on a
tiny training run, read back from the offline run's own record file; TensorBoard's hparams; `{workdir}/config.json`;
the learning rate; and strict JSON (no bare NaN) in what the package writes."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config, tiny_run_settings, tiny_settings
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from rltldr_jax import strict_json
from rltldr_jax.config import base
from rltldr_jax.replication.grid import Run, read_summary, summarize_run, write_summary
from rltldr_jax.settings import Optim, as_dict, replace
from rltldr_jax.train.loggers import WANDB_RUN_FILE, WandbLogger, open_loggers, save_config
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.report import MetricsLog
from rltldr_jax.train.step import learning_rate_of, make_optimizer

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="the wandb package (pip install -e '.[test]')")


def _refuse(constant: str) -> float:
    raise ValueError(f"not strict JSON: {constant}")


def strict_loads(text: str):
    """`json.loads` that refuses NaN / Infinity (which Python's json accepts by default)."""
    return json.loads(text, parse_constant=_refuse)


def wandb_records(path: str) -> list:
    """The records of a `.wandb` file: wandb's own protobuf `Record`s in its append-only log (a 7-byte header, then
    32 KiB blocks of chunks, each with a 7-byte header: checksum, length, type full/first/middle/last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, chunk, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # the rest of a block is padding
            pos += left
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def finished_records(path: str, timeout: float = 60.0) -> list:
    """`wandb_records` once the file holds the run's exit record: wandb's service process may still be writing the
    last records when `finish()` returns."""
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def offline_runs(wandb_dir: str) -> list[str]:
    """The offline runs' record files under `wandb_dir`, oldest first (`offline-run-{time}-{id}`, and a `-{n}` suffix
    when the same run id started again within the same second)."""

    def order(path: str) -> tuple[str, int]:
        name = os.path.basename(os.path.dirname(path))
        stamp, run_id = name.split("-")[2], os.path.basename(path).removeprefix("run-").removesuffix(".wandb")
        suffix = name.split(run_id)[-1].removeprefix("-")
        return stamp, int(suffix or 0)

    return sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")), key=order)


def history(records: list) -> list[dict[str, float]]:
    """The rows `run.log` wrote (W&B's own keys `_step`, `_runtime`, `_timestamp` left out)."""
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            rows.append({k: v for k, v in items.items() if not k.startswith("_")})
    return rows


def run_config(records: list) -> dict:
    """The W&B run's config as its run record holds it (top-level key -> value)."""
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"}


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """One tiny phase and its evaluation with `logging.wandb` offline, wandb's files in $WANDB_DIR:
    (workdir, $WANDB_DIR, settings)."""
    root = tmp_path_factory.mktemp("wandb")
    workdir, wandb_dir = str(root / "run"), str(root / "wandb_dir")
    settings = tiny_run_settings(workdir, 1, {"logging.wandb": True, "logging.wandb_project": "tests"})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")  # (logging.wandb_mode "" leaves the mode to wandb: offline here)
        env.setenv("WANDB_DIR", wandb_dir)
        env.setenv("WANDB_SILENT", "true")
        Trainer(settings).run()  # (closes itself: the W&B run is finished)
    return workdir, wandb_dir, settings


def test_wandb_offline_holds_the_config_and_the_metrics_of_metrics_jsonl(wandb_run):
    workdir, wandb_dir, settings = wandb_run
    (path,) = offline_runs(wandb_dir)  # in $WANDB_DIR, not in the workdir
    assert not os.path.exists(os.path.join(workdir, "wandb"))
    records = finished_records(path)
    run_id = json.load(open(os.path.join(workdir, WANDB_RUN_FILE)))["id"]
    assert path.endswith(f"-{run_id}{os.sep}run-{run_id}.wandb")
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "tests" and run.display_name == "run" and run.job_type == "rl"
    # The config: every section, nested as in config.json.
    config = run_config(records)
    assert {k: config[k] for k in as_dict(settings)} == json.loads(strict_json.dumps(as_dict(settings), default=str))
    assert config["loss"]["lam"] == settings.loss.lam and config["logging"]["wandb"] is True
    # The x-axes: env_steps by default, tokens and walltime_s beside.
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert {m.name for m in metrics if m.name} == {"env_steps", "tokens", "walltime_s"}
    assert [(m.glob_name, m.step_metric) for m in metrics if m.glob_name] == [("*", "env_steps")]
    # Every metrics.jsonl record, under the same names (a null there is a NaN here), at the same environment steps.
    rows = history(records)
    logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["kind"] for r in logged] == ["phase", "eval"] and len(rows) == 2
    for row, record in zip(rows, logged, strict=True):
        assert row["env_steps"] == record["env_steps"] > 0 and row["tokens"] > 0 and row["walltime_s"] > 0
        values = {k: v for k, v in record.items() if k not in ("kind", "phase", "env_steps")}
        assert set(values) <= set(row)
        for key, value in values.items():
            if value is None:
                assert math.isnan(row[key]), key
            else:
                assert row[key] == pytest.approx(value, rel=1e-6), key
    assert rows[0]["update/learning_rate"] == pytest.approx(settings.optim.learning_rate) == 1e-4
    assert rows[1]["eval/pass@1/all"] == logged[1]["eval/pass@1/all"]
    # finish(): the run ended with exit code 0.
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0


def test_config_json_and_tensorboard_hparams_hold_every_key(wandb_run):
    workdir, _, settings = wandb_run
    text = open(os.path.join(workdir, "config.json")).read()
    assert strict_loads(text) == json.loads(strict_json.dumps(as_dict(settings), default=str))
    assert "\n  " in text  # indented, one key a line
    assert not save_config(settings, workdir)  # unchanged: not rewritten
    # TensorBoard: the config flattened to dotted keys, in the hparams plugin's session-start record.
    events = EventAccumulator(os.path.join(workdir, "tb"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["loss.lam"].number_value == settings.loss.lam
    assert start.hparams["env.name"].string_value == "sapi"
    assert start.hparams["logging.wandb"].bool_value is True
    sections = [v for v in as_dict(settings).values() if isinstance(v, dict)]
    leaves = len(as_dict(settings)) - len(sections) + sum(len(flat(s)) for s in sections)
    assert len(start.hparams) == leaves
    # ... and the learning rate beside the other scalars.
    assert [e.value for e in events.Scalars("update/learning_rate")] == pytest.approx([1e-4])


def flat(section: dict) -> list:
    """The leaves of a nested dict."""
    return [x for v in section.values() for x in (flat(v) if isinstance(v, dict) else [v])]


def test_a_resumed_run_continues_its_wandb_run_and_rewrites_config_json(tmp_path, monkeypatch):
    """open_loggers as the Trainer calls it: a fresh start, then a resume with a changed key."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # (logging.wandb_dir "": wandb's files then go in the workdir)
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    settings = tiny_run_settings(workdir, 1, {"logging.wandb": True, "logging.wandb_mode": "offline"})
    first = open_loggers(settings, workdir)
    first.scalars({"update/loss": 0.5}, 3, tokens=10, walltime=1.0)
    first.close()
    assert strict_loads(open(os.path.join(workdir, "config.json")).read())["train"]["max_phases"] == 1
    resumed_settings = replace(settings, {"train.max_phases": 2})
    second = open_loggers(resumed_settings, workdir, resume=True, resumed_at=(3, 10, 1.0))
    second.scalars({"update/loss": 0.25}, 6, tokens=20, walltime=2.0)
    second.close(RuntimeError("stopped"))
    assert strict_loads(open(os.path.join(workdir, "config.json")).read())["train"]["max_phases"] == 2
    # One offline directory per start (in the workdir), one W&B run id.
    paths = offline_runs(workdir)
    assert len(paths) == 2
    ids = {os.path.basename(p).removeprefix("run-").removesuffix(".wandb") for p in paths}
    assert ids == {json.load(open(os.path.join(workdir, WANDB_RUN_FILE)))["id"]}
    first_records, second_records = (finished_records(p) for p in paths)
    assert history(first_records) == [
        {"update/loss": 0.5, "env_steps": 3, "tokens": 10, "walltime_s": 1.0}
    ] and history(second_records) == [{"update/loss": 0.25, "env_steps": 6, "tokens": 20, "walltime_s": 2.0}]
    assert run_config(second_records)["train"]["max_phases"] == 2
    assert [r.exit.exit_code for r in second_records if r.WhichOneof("record_type") == "exit"] == [1]  # failed
    # A fresh start (not a resume) is another W&B run.
    other = str(tmp_path / "other")
    os.makedirs(other)
    open_loggers(replace(settings, {"workdir": other}), other).close()
    assert json.load(open(os.path.join(other, WANDB_RUN_FILE)))["id"] not in ids


def test_only_the_enabled_process_logs(tmp_path):
    """A process other than 0 (enabled=False) imports nothing and writes nothing."""
    settings = tiny_run_settings(str(tmp_path), 1, {"logging.wandb": True, "logging.wandb_mode": "offline"})
    loggers = open_loggers(settings, str(tmp_path), enabled=False)
    loggers.scalars({"x": 1.0}, 1, tokens=1, walltime=1.0)
    loggers.close()
    assert os.listdir(tmp_path) == []


def test_without_the_wandb_package_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that cannot be imported
    fix = "pip install -e '.[wandb]'"
    with pytest.raises(base.ConfigError, match=r"logging\.wandb=True needs the wandb package") as e:
        tiny_config({"logging.wandb": True})
    assert fix in str(e.value)
    tiny_config({"logging.wandb": False})  # off: no need for it
    with pytest.raises(ImportError) as e:
        WandbLogger(tiny_settings().logging, str(tmp_path), {}, enabled=True)
    assert fix in str(e.value) and "\n" not in str(e.value)


def test_a_bad_wandb_mode_is_refused():
    with pytest.raises(base.ConfigError, match=r"logging\.wandb_mode='cloud' is not one of"):
        tiny_config({"logging.wandb_mode": "cloud"})


def test_the_learning_rate_follows_the_schedule_at_the_optimizers_step_count():
    """Warmup then cosine decay: the learning rate of the last step taken (skipped non-finite steps do not count)."""
    optim = Optim(learning_rate=1e-3, warmup_steps=2, decay_steps=4, end_learning_rate=1e-4)
    tx = make_optimizer(1e-3, warmup_steps=2, decay_steps=4, end_learning_rate=1e-4)
    params = {"w": jnp.ones(3)}
    states = [tx.init(params)]
    for _ in range(7):
        states.append(tx.update({"w": jnp.ones(3)}, states[-1], params)[1])
    cosine = [1e-4 + 0.9e-3 * (1 + math.cos(math.pi * s / 4)) / 2 for s in range(5)]
    seen = [learning_rate_of(optim, state) for state in states]
    assert seen == pytest.approx([0.0, 0.0, 0.5e-3, *cosine], rel=1e-5, abs=1e-9)
    assert learning_rate_of(Optim(), states[3]) == 3e-6  # constant: no schedule to read
    # sft.learning_rate replaces optim.learning_rate (the offline SFT baselines): the peak after the warmup.
    assert learning_rate_of(optim, states[3], learning_rate=2e-3) == pytest.approx(2e-3)


def test_strict_json_writes_null_for_non_finite_numbers():
    value = {"a": math.nan, "b": [math.inf, np.float32(1.5), -math.inf], "c": np.int64(3), "d": (np.array([0.5]),)}
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"a": None, "b": [None, 1.5, None], "c": 3, "d": [[0.5]]}
    assert strict_loads(strict_json.dumps({"x": object()}, default=lambda o: math.nan)) == {"x": None}
    assert strict_json.nan_for_null({"a": None, "b": [None, 1.0]})["b"][1] == 1.0
    assert math.isnan(strict_json.nan_for_null({"a": None})["a"])


def test_summary_json_of_a_run_with_a_nan_metric_is_strict(tmp_path):
    """summary.json of a run whose evaluation logged NaN (metrics.jsonl: null): strict JSON that gives the NaN back."""
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    log = MetricsLog(os.path.join(workdir, "metrics.jsonl"), keep_through_phase=0)
    log.write("phase", 1, 4, {"rollout/pass@1/insight": 0.5})
    log.write("eval", 1, 4, {"eval/pass@1/all": math.nan, "eval_train/pass@1/all": 0.25})
    run = Run("rltldr", 0, tiny_run_settings(workdir, 1))
    summary = summarize_run(run, walltime_s=math.inf)
    assert math.isnan(summary["heldout_pass1_no_insight"])
    write_summary(workdir, summary)
    text = open(os.path.join(workdir, "summary.json")).read()
    saved = strict_loads(text)  # (raises on a bare NaN)
    assert saved["heldout_pass1_no_insight"] is None and saved["walltime_s"] is None
    assert saved["final"]["eval/pass@1/all"] is None and saved["train_pass1_no_insight"] == 0.25
    assert saved["measures"]["final"]["eval/pass@1/all"] is None and saved["measures"]["selected_index"] is None
    back = read_summary(workdir)
    assert math.isnan(back["heldout_pass1_no_insight"]) and math.isnan(back["final"]["eval/pass@1/all"])
    assert math.isnan(back["measures"]["final"]["eval/pass@1/all"]) and back["measures"]["selected_index"] is None
    assert back["train_pass1_insight"] == 0.5 and back["config"] == saved["config"]
