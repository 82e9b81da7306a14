"""Engines from a config: the policy's engine errors, and the frozen teacher of insight.source="teacher"."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from helpers import tiny_config

from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams
from rltldr_jax.engines.factory import EngineConfig, policy_engine, teacher_engine
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained
from rltldr_jax.settings import settings_of


def _tiny(**overrides):
    return tiny_config(overrides)


def test_remote_policy_engines_need_their_servers(tiny_policy, tmp_path):
    """What a server backend lacks (its servers) is found from the config alone (`run_errors`: the launchers check it,
    `--dry_run` too, before any weights load); a builder called with such settings refuses them with the same line."""
    from rltldr_jax.config import base

    model, _ = tiny_policy
    assert base.run_errors(_tiny()) == []
    (grpc,) = base.run_errors(_tiny(**{"engine.kind": "grpc"}))
    assert grpc.startswith("engine.kind=grpc needs engine.servers=host:port,...; start them with launch/serve.py")
    (sglang,) = base.run_errors(_tiny(**{"engine.kind": "sglang"}))
    assert "start them with launch/serve_sglang.py" in sglang
    (http,) = base.run_errors(_tiny(**{"engine.kind": "sglang", "engine.servers": "localhost:1"}))
    assert http.startswith("engine.kind=sglang needs engine.http_servers")
    both = {"engine.kind": "sglang", "engine.servers": "localhost:1", "engine.http_servers": "http://localhost:2"}
    assert base.run_errors(_tiny(**both)) == []
    paper = base.run_errors(base.override(_tiny(), {"model.preset": "qwen3_5_9b"}))
    assert paper == [
        "model.preset=qwen3_5_9b needs model.checkpoint: --config.model.checkpoint=Qwen/Qwen3.5-9B (the released "
        "weights, fetched into the HF cache; offline, run `hf download Qwen/Qwen3.5-9B` on a machine with network "
        "first) or an HF directory of them; only the tiny preset starts from random weights"
    ]
    assert base.run_errors(base.override(_tiny(), {"model.preset": "qwen3_5_9b"}), weights=False) == []
    with pytest.raises(ValueError, match=r"engine.kind=grpc needs engine.servers=host:port.*launch/serve.py"):
        policy_engine(EngineConfig.of(settings_of(_tiny(**{"engine.kind": "grpc"}))), model, workdir=str(tmp_path))


def test_dry_run_reports_what_the_paper_config_lacks_before_building_anything():
    """`--dry_run` of the paper's config prints it, then exits 1 naming the servers and the weights it still needs;
    given them it exits 0 (nothing is loaded or connected: the checkpoint path need not exist here)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    train = [sys.executable, "launch/train.py", "--config=configs/sapi.py", "--dry_run"]
    r = subprocess.run(train, cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "engine:" in r.stdout, r.stderr[-2000:]
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: engine.kind=sglang needs engine.servers=host:port,...; start them with launch/serve_sglang.py"
        )
    )
    assert "model.preset=qwen3_5_9b needs model.checkpoint" in r.stderr
    given = [
        "--config.engine.servers=h1:40000",
        "--config.engine.http_servers=http://h1:30000",
        "--config.model.checkpoint=/nonexistent/qwen3_5_9b",
    ]
    r = subprocess.run(train + given, cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "qwen3_5_9b" in r.stdout, r.stderr[-2000:]


def test_teacher_from_an_hf_checkpoint_writes_the_insights(tiny_policy, tokenizer, tmp_path):
    """The teacher is its own model on its own engine (a different architecture here: 2 layers), and the insight
    writer sends the writer prompts there, not to the policy."""
    policy_model, policy = tiny_policy
    teacher_config = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2, layer_types=())
    save_pretrained(ModelSpec(teacher_config).build(seed=5), tmp_path / "teacher", dtype=None)
    config = _tiny(**{"insight.source": "teacher", "insight.teacher.checkpoint": str(tmp_path / "teacher")})
    assert teacher_engine(EngineConfig.of(settings_of(_tiny()))) == (None, None)  # not asked for
    teacher, teacher_tokenizer = teacher_engine(EngineConfig.of(settings_of(config)))
    try:
        assert (
            isinstance(teacher, JaxEngine) and teacher.config.num_hidden_layers == 2 != policy.config.num_hidden_layers
        )
        assert teacher_tokenizer is None  # no tokenizer.json in the directory: the policy's
        writer = InsightWriter.of(settings_of(config), tokenizer, policy, teacher, teacher_tokenizer)
        assert writer.engine is teacher and writer.tokenizer is tokenizer
        params = SamplingParams(max_new_tokens=3, seed=1)
        result = asyncio.run(teacher.generate(GenerationRequest((1, 2, 3), params)))
        assert len(result.token_ids) == 3 and all(lp <= 0 for lp in result.logprobs)
    finally:
        teacher.close()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        nowhere = _tiny(**{"insight.source": "teacher", "insight.teacher.checkpoint": str(tmp_path / "nowhere")})
        teacher_engine(EngineConfig.of(settings_of(nowhere)))
