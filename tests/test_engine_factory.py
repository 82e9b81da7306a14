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
    model, _ = tiny_policy
    with pytest.raises(ValueError, match=r"engine.kind=grpc needs engine.servers=host:port.*launch/serve.py"):
        policy_engine(EngineConfig.of(settings_of(_tiny(**{"engine.kind": "grpc"}))), model, workdir=str(tmp_path))
    with pytest.raises(ValueError, match="engine.kind=sglang needs engine.http_servers"):
        sglang = _tiny(**{"engine.kind": "sglang", "engine.servers": "localhost:1"})
        policy_engine(EngineConfig.of(settings_of(sglang)), model, workdir=str(tmp_path))


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
