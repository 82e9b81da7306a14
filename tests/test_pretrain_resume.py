"""Pretraining stopped on the way continues to the same bytes as a run never stopped: stopped by SIGTERM (it saves at
the next pool of demonstrations and raises `RunStopped`), then killed (an error after a periodic save), then finished;
its state directory is gone at the end and the record names the steps it continued from."""

import json
import os
import signal

import pytest

from rltldr_jax.config import replicate_v2
from rltldr_jax.train import pretrain as pretraining
from rltldr_jax.train.stopping import RunStopped

STEPS = 12  # three pools of demonstrations (LENGTH_BUCKETS steps each)


def _config(cache_dir: str):
    """Round two's pretraining recipe (forge, insight writing, rewording) on the smoke preset's model, 12 steps."""
    return replicate_v2.arm_config(
        "smoke",
        "rltldr",
        100,
        {"pretrain.steps": STEPS, "pretrain.cache_dir": cache_dir, "pretrain.shipped": False},
    )


def _read(path: str, name: str) -> bytes:
    with open(os.path.join(path, name), "rb") as f:
        return f.read()


@pytest.mark.slow  # three pretrainings
def test_a_stopped_and_a_killed_pretraining_continue_to_the_same_bytes(tmp_path, monkeypatch):
    assert pretraining.LENGTH_BUCKETS == 4 and pretraining.SAVE_EVERY_SECONDS >= 60  # (the steps below follow)
    # One batch shape for every pool (the demonstrations here pad to 128-320 tokens): one train step to compile per
    # pretraining, not four (233 CPU s before, 89 after, on 2026-12-07).
    monkeypatch.setattr(pretraining, "PAD_MULTIPLE", 512)
    whole = _config(str(tmp_path / "whole"))
    done = pretraining.pretrain(whole)
    assert not os.path.exists(pretraining.resume_dir(whole))  # (made for the run, removed at its end)

    config = _config(str(tmp_path / "stopped"))
    state = pretraining.resume_dir(config)

    def stop_at_step_1(step: float, nll: float) -> None:
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded; the pool in progress (steps 1-4) is finished first

    with pytest.raises(RunStopped, match=r"stopped by SIGTERM at step 4 of 12; its state is saved in .*\.resume"):
        pretraining.pretrain(config, on_log=stop_at_step_1)
    assert not os.path.exists(pretraining.pretrained_dir(config)) and sorted(os.listdir(state)) == ["4"]

    class Killed(Exception):
        pass

    def kill_at_step_10(step: float, nll: float) -> None:
        assert step > 4, step  # continued from step 4, not from the start
        if step == 10:
            raise Killed

    monkeypatch.setattr(pretraining, "SAVE_EVERY_SECONDS", 0.0)  # a save at every pool boundary: steps 4 and 8
    with pytest.raises(Killed):
        pretraining.pretrain(config, on_log=kill_at_step_10)
    assert sorted(os.listdir(state)) == ["8"]  # (keeps the newest only)

    monkeypatch.setattr(pretraining, "SAVE_EVERY_SECONDS", 300.0)
    path = pretraining.pretrain(config)
    assert not os.path.exists(state)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _read(path, name) == _read(done, name), name
    record, reference = (json.load(open(os.path.join(p, "pretrain.json"))) for p in (path, done))
    assert record["nll_curve"] == reference["nll_curve"] and len(record["nll_curve"]) == STEPS
    assert record["resumed_from"] == [4, 8] and "resumed_from" not in reference
    assert record["key"] == reference["key"] and record["seconds"] > 0
