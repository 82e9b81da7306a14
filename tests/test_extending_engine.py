"""A generation backend from outside the package (examples/scripted_engine.py) runs a phase of the real Trainer; the
engine registry's names, alias and errors; the defaults of the `GenerationEngine` base class."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from helpers import tiny_config, tiny_run_settings

from examples.scripted_engine import SCRIPT, SCRIPT_LOGPROB, ScriptedEngine
from rltldr_jax.agent.rollout_files import record_from_json
from rltldr_jax.config import base
from rltldr_jax.engines import GenerationEngine, GenerationRequest, GenerationResult, SamplingParams
from rltldr_jax.engines.factory import ENGINES, engine_kind_error, register_engine, resolve_engine
from rltldr_jax.train.loop import Trainer


def test_a_scripted_backend_registered_outside_the_package_runs_a_training_phase(tmp_path):
    """`engine.kind=examples.scripted_engine:scripted`: the rollouts hold exactly the scripted tokens and logprobs,
    and the phase's weight push reaches the engine as version 1."""
    config = tiny_run_settings(
        str(tmp_path / "run"),
        1,
        {"engine.kind": "examples.scripted_engine:scripted", "train.max_logprob_gap": 0.0},  # scripted logprobs
    )
    trainer = Trainer(config)
    engine = trainer.engine
    try:
        assert isinstance(engine, ScriptedEngine) and engine.weight_version == 0 and engine.pushes == []
        assert trainer.initial_weights == "embedded"  # the base class's ensure_weights
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    assert engine.pushes == [1] and engine.weight_version == trainer.version == 1
    assert metrics["rollout/counts/attempts"] == 2 and metrics["update/optimizer_steps"] >= 1
    # Every completion is a prefix of the script (no stop id in it: cut at the request's budget).
    assert engine.results and all(r.token_ids == SCRIPT[: len(r.token_ids)] for r in engine.results)
    assert {r.finish_reason for r in engine.results} == {"length"}
    assert all(r.token_ids for r in engine.results)
    path = os.path.join(trainer.workdir, "rollouts", "phase_00000.jsonl")
    records = [record_from_json(json.loads(line)) for line in open(path)]
    assert len(records) == 2
    sampled = [
        (t, lp)
        for r in records
        for s in r.attempt.steps
        for t, forced, lp in zip(s.action_ids, s.forced, s.logprobs, strict=True)
        if not forced
    ]
    returned = [t for r in engine.results for t in r.token_ids]
    assert sorted(t for t, _ in sampled) == sorted(returned)  # the sampled tokens are exactly the engine's
    assert {lp for _, lp in sampled} == {SCRIPT_LOGPROB}
    assert all(s.weight_version == 0 for r in records for s in r.attempt.steps)


def test_engine_kinds_follow_the_registry():
    assert {"jax", "sglang", "jax_grpc"} <= set(ENGINES)
    assert resolve_engine("grpc") is resolve_engine("jax_grpc")  # the name before the registry stays an alias
    assert resolve_engine("examples.scripted_engine:scripted") is ENGINES["scripted"]
    assert engine_kind_error("jax") is None
    unknown = engine_kind_error("vllm")
    assert unknown is not None and "\n" not in unknown
    assert unknown.startswith("engine.kind='vllm' is not one of ") and "'jax', 'jax_grpc'" in unknown
    with pytest.raises(base.ConfigError, match=r"engine.kind='vllm' is not one of .*'sglang'"):
        tiny_config({"engine.kind": "vllm"})
    with pytest.raises(base.ConfigError, match=r"cannot import no_such_module \(ModuleNotFoundError"):
        tiny_config({"engine.kind": "no_such_module:x"})
    with pytest.raises(base.ConfigError, match=r"importing examples.scripted_engine registered no engine 'other'"):
        tiny_config({"engine.kind": "examples.scripted_engine:other"})
    with pytest.raises(ValueError, match="not an alias"):
        register_engine("grpc")


class _Echo(GenerationEngine):
    """Only `generate`: the prompt's last token, once."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(request.request_id, request.prompt_ids[-1:], (0.0,), "length", self.weight_version)


def test_the_base_class_defaults():
    with pytest.raises(TypeError, match="abstract"):
        GenerationEngine()  # type: ignore[abstract]
    with _Echo() as engine:
        assert engine.weight_version == 0 and engine.max_batch == 0 and not engine.paused
        assert engine.ensure_weights(None, 0) == "embedded"
        engine.update_weights(None, 3)
        engine.pause("abort")
        engine.resume()
        engine.abort("any")
        params = SamplingParams(max_new_tokens=1)
        results = engine.generate_many([GenerationRequest((5, 6), params), GenerationRequest((7,), params)])
        assert [(r.token_ids, r.weight_version) for r in results] == [((6,), 3), ((7,), 3)]
        assert asyncio.run(engine.generate(GenerationRequest((9,), params))).token_ids == (9,)
