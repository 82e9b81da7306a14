"""The SGLang client against two real launch/serve.py servers on localhost, over real gRPC (and HTTP).

SGLang itself needs a CUDA GPU; these servers speak the same `sglang.runtime.v1.SglangService` subset.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib.util
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rltldr_jax.config import base
from rltldr_jax.engines import GenerationRequest, SamplingParams
from rltldr_jax.engines import sglang_proto as pb
from rltldr_jax.engines.factory import EngineConfig, policy_engine
from rltldr_jax.engines.jax_engine import JaxEngine
from rltldr_jax.engines.server import EngineService, start_http_admin, start_server
from rltldr_jax.engines.sglang_client import (
    DEFAULT_REQUEST_TIMEOUT_S,
    ClientClosedError,
    NoServerError,
    SglangClient,
)
from rltldr_jax.models import ModelSpec, get_preset, load_pretrained, save_pretrained, sequence_logprobs
from rltldr_jax.models.fingerprint import weights_fingerprint
from rltldr_jax.settings import settings_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=256)

# The upstream interface (sgl-project/sglang proto/sglang/runtime/v1/sglang.proto, 0.5.23): every message
# field we declare must carry upstream's number, or a real SGLang server would misread it.
UPSTREAM_FIELDS = {
    "SamplingParams": {
        "temperature": 1,
        "top_p": 2,
        "top_k": 3,
        "max_new_tokens": 8,
        "stop_token_ids": 11,
        "ignore_eos": 12,
    },
    "GenerateRequest": {
        "input_ids": 1,
        "sampling_params": 2,
        "stream": 3,
        "return_logprob": 4,
        "logprob_start_len": 6,
        "lora_path": 8,
        "rid": 7,
    },
    "GenerateResponse": {"output_ids": 1, "meta_info": 2, "finished": 3},
    "HealthCheckResponse": {"healthy": 1},
    "GetModelInfoResponse": {"model_path": 1, "json_info": 2},
    "GetLoadRequest": {"dp_rank": 1},
    "GetLoadResponse": {"json_info": 1},
    "AbortRequest": {"rid": 1, "abort_all": 2},
    "AbortResponse": {"success": 1},
    "FlushCacheResponse": {"success": 1, "message": 2},
    "PauseGenerationRequest": {"mode": 1},
    "PauseGenerationResponse": {"message": 1},
    "ContinueGenerationResponse": {"message": 1},
    "UpdateWeightsRequest": {"model_path": 1, "load_format": 2},
    "UpdateWeightsResponse": {"success": 1, "message": 2},
}
EXTENSIONS = {"SamplingParams": {"seed": 1000}, "UpdateWeightsRequest": {"weight_version": 1000}}
UPSTREAM_METHODS = {
    "Generate": ("GenerateRequest", "GenerateResponse", True),
    "HealthCheck": ("HealthCheckRequest", "HealthCheckResponse", False),
    "GetModelInfo": ("GetModelInfoRequest", "GetModelInfoResponse", False),
    "GetLoad": ("GetLoadRequest", "GetLoadResponse", False),
    "Abort": ("AbortRequest", "AbortResponse", False),
    "FlushCache": ("FlushCacheRequest", "FlushCacheResponse", False),
    "PauseGeneration": ("PauseGenerationRequest", "PauseGenerationResponse", False),
    "ContinueGeneration": ("ContinueGenerationRequest", "ContinueGenerationResponse", False),
    "UpdateWeightsFromDisk": ("UpdateWeightsRequest", "UpdateWeightsResponse", False),
}


def test_proto_matches_the_upstream_interface():
    service = pb.service_descriptor()
    assert service.full_name == "sglang.runtime.v1.SglangService"
    methods = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert methods == UPSTREAM_METHODS
    for message, fields in pb.file_descriptor().message_types_by_name.items():
        declared = {f.name: f.number for f in fields.fields}
        assert declared == {**UPSTREAM_FIELDS.get(message, {}), **EXTENSIONS.get(message, {})}, message


class Server:
    """A launch/serve.py subprocess on free gRPC and HTTP ports."""

    def __init__(self, model_path: str, tmp: str, name: str):
        self.model_path = model_path
        self.port_file = os.path.join(tmp, f"{name}.port")
        self.log = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115 — closed in stop()
        self.grpc = self.http = None
        self._start(0, 0)

    def _start(self, grpc_port: int, http_port: int) -> None:
        cmd = [
            sys.executable,
            os.path.join(ROOT, "launch", "serve.py"),
            f"--checkpoint={self.model_path}",
            f"--port={grpc_port}",
            f"--http_port={http_port}",
            f"--port_file={self.port_file}",
            "--max_batch=2",
            "--max_len=128",
        ]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def restart(self) -> None:
        """Kills the server and starts a new one on the same ports, from the same checkpoint (weight version 0)."""
        self.process.kill()
        self.process.wait()
        os.remove(self.port_file)
        self._start(int(self.grpc.rsplit(":", 1)[1]), int(self.http.rsplit(":", 1)[1]))

    def wait(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.port_file):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server failed to start:\n{open(self.log.name).read()[-3000:]}")
            time.sleep(0.2)
        grpc_port, http_port = open(self.port_file).read().split()
        self.grpc, self.http = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpc")
    models = {name: ModelSpec(CONFIG).build(seed=seed) for name, seed in (("m0", 0), ("m1", 1), ("m2", 2))}
    for name, model in models.items():
        save_pretrained(model, tmp / name)
    return tmp, models


@pytest.fixture(scope="module")
def servers(checkpoints):
    tmp, _ = checkpoints
    pair = [Server(str(tmp / "m0"), str(tmp), name) for name in ("a", "b")]
    try:
        for s in pair:
            s.wait()
        yield pair
    finally:
        for s in pair:
            s.stop()


def _prompts(n: int, seed: int = 0, length: int = 12) -> list[tuple[int, ...]]:
    """Prompts of one length: the servers' warm-up compiled its bucket, the teacher-forced check compiles once."""
    return [tuple(row) for row in np.random.default_rng(seed).integers(0, 256, size=(n, length)).tolist()]


@jax.jit
def _logprobs(model, ids):
    return sequence_logprobs(model, ids)[0]


def _teacher_forced(model, prompt, tokens) -> np.ndarray:
    """The trainer's recomputation: logprobs of `tokens` given `prompt` under `model`."""
    return np.asarray(_logprobs(model, jnp.asarray([prompt + tokens])))[0, len(prompt) :]


def test_generation_over_two_servers_matches_trainer_logprobs(servers, checkpoints):
    _, models = checkpoints
    with SglangClient([s.grpc for s in servers]) as client:
        requests = [GenerationRequest(p, SamplingParams(max_new_tokens=10, seed=i)) for i, p in enumerate(_prompts(8))]
        results = client.generate_many(requests)
        assert all(n > 0 for n in client.served_counts().values())  # least-outstanding routing used both
    for request, result in zip(requests, results, strict=False):
        assert (
            result.request_id == request.request_id and result.finish_reason == "length" and result.weight_version == 0
        )
        np.testing.assert_allclose(
            result.logprobs, _teacher_forced(models["m0"], request.prompt_ids, result.token_ids), atol=2e-5
        )


def test_same_seed_same_completion_on_either_server(servers):
    request = GenerationRequest(_prompts(1, seed=1)[0], SamplingParams(max_new_tokens=12, seed=42, stop_token_ids=(7,)))
    outputs = []
    for s in servers:
        with SglangClient([s.grpc]) as client:
            outputs.append(client.generate_many([request])[0])
    assert outputs[0].token_ids == outputs[1].token_ids
    np.testing.assert_allclose(outputs[0].logprobs, outputs[1].logprobs, atol=1e-6)


def test_bad_request_is_rejected_not_retried(servers):
    with SglangClient([s.grpc for s in servers]) as client:
        with pytest.raises(ValueError, match="prompt ids outside"):
            client.generate_many([GenerationRequest((5, 999), SamplingParams(max_new_tokens=2))])
        assert client.retries == 0


NONFINITE = [("temperature", math.nan), ("temperature", math.inf), ("temperature", -math.inf), ("top_p", math.nan)]


@pytest.mark.parametrize(("field", "value"), [*NONFINITE, ("top_p", math.inf)])
def test_nonfinite_sampling_params_are_invalid_argument(servers, field, value):
    """NaN temperature used to come back as token 0 with NaN logprobs (`nan < 0` is False), inf was accepted."""
    with grpc.insecure_channel(servers[0].grpc) as channel:
        stub = pb.Stub(channel)
        sampling = pb.SamplingParams(max_new_tokens=2, seed=0, **{field: value})
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(pb.GenerateRequest(input_ids=[1, 2], sampling_params=sampling), timeout=60))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in error.value.details() and "finite" in error.value.details()
        assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=30).healthy  # and the server stays up


@pytest.mark.parametrize(("field", "value"), NONFINITE)
def test_client_refuses_nonfinite_sampling_params(field, value):
    with pytest.raises(ValueError, match=f"{field} must be .*finite.*, got {value}"):
        SamplingParams(**{field: value})


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(NoServerError, match="not reachable"):
        SglangClient(["127.0.0.1:9"], connect_timeout_s=1.0)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_weight_push_changes_outputs_and_version(servers, checkpoints, tmp_path, transport):
    _, models = checkpoints
    new, version = (models["m1"], 1) if transport == "grpc" else (models["m2"], 2)
    prompt = _prompts(1, seed=2)[0]
    greedy = GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
    kwargs = {"weight_update": transport, "http_urls": [s.http for s in servers] if transport == "http" else None}
    with SglangClient([s.grpc for s in servers], weight_dir=tmp_path, **kwargs) as client:
        before = client.generate_many([greedy, greedy])
        client.update_weights(new, version)
        assert client.weight_version == version and os.listdir(tmp_path) == [f"v{version:06d}"]
        after = client.generate_many([GenerationRequest(prompt, greedy.params) for _ in range(4)])  # both servers
    assert all(r.weight_version == version for r in after) and len({r.token_ids for r in after}) == 1
    assert all(r.token_ids != b.token_ids or r.logprobs != b.logprobs for r in after for b in before)
    for r in after:  # the new weights produced every token: logprobs are the new model's
        np.testing.assert_allclose(r.logprobs, _teacher_forced(new, prompt, r.token_ids), atol=2e-5)


def test_push_of_a_bad_checkpoint_fails_and_keeps_weights(servers, checkpoints, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    probe = GenerationRequest((1, 2), SamplingParams(max_new_tokens=1))
    with SglangClient([s.grpc for s in servers]) as client:
        version = client.generate_many([probe])[0].weight_version
    with SglangClient([s.grpc for s in servers], weight_version=version) as client:
        with pytest.raises(RuntimeError, match="could not load"):
            client.push_weights(tmp_path, 99)
        assert client.weight_version == version
        assert client.generate_many([probe])[0].weight_version == version


def test_pushes_during_a_long_request_do_not_lose_it(servers, checkpoints):
    """pause(mode=abort) aborts the request at every push; it is retried each time and ends on the last weights."""
    tmp, _ = checkpoints
    request = GenerationRequest(_prompts(1, seed=4)[0], SamplingParams(max_new_tokens=100, seed=3))
    admin = pb.Stub(grpc.insecure_channel(servers[0].grpc))
    admin.PauseGeneration(pb.PauseGenerationRequest(mode="in_place"), timeout=30)
    with SglangClient([servers[0].grpc], weight_version=100) as client:
        done = concurrent.futures.Future()
        threading.Thread(target=lambda: done.set_result(client.generate_many([request])[0]), daemon=True).start()
        for version in range(101, 107):  # more pushes than max_attempts
            # Between pushes the server stays paused, so the request can only finish after the last one.
            admin.PauseGeneration(pb.PauseGenerationRequest(mode="in_place"), timeout=30)
            time.sleep(0.05)  # the retry reaches the paused server and is aborted by the next push
            client.push_weights(tmp / ("m1" if version % 2 else "m0"), version)
        result = done.result(timeout=120)
        assert result.request_id == request.request_id and len(result.token_ids) == 100 and result.weight_version == 106
        assert client.retries >= 1


def test_a_server_whose_update_fails_leaves_the_rotation(servers, checkpoints):
    tmp, _ = checkpoints
    urls = [servers[0].http, "http://127.0.0.1:9"]  # the second server's admin endpoint is unreachable
    with SglangClient([s.grpc for s in servers], weight_update="http", http_urls=urls, weight_version=200) as client:
        client.push_weights(tmp / "m0", 201)
        assert client.weight_version == 201 and client.live_servers == [servers[0].grpc]
        assert "127.0.0.1:9" in client.push_failures[0]
        results = client.generate_many([GenerationRequest(p, SamplingParams(max_new_tokens=3)) for p in _prompts(4)])
        assert {r.weight_version for r in results} == {201}


def test_close_ends_requests_in_flight_and_failed_start_leaks_nothing(servers):
    before = set(threading.enumerate())  # threads of earlier tests may end meanwhile: compare sets, not counts
    for _ in range(2):
        with pytest.raises(NoServerError):
            SglangClient(["127.0.0.1:9"], connect_timeout_s=0.5)
    # A leak is a thread that stays: under load a closing channel's thread can take a moment to end.
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(threading.enumerate()) - before, "a failed start left threads behind"
    admin = pb.Stub(grpc.insecure_channel(servers[0].grpc))
    admin.PauseGeneration(pb.PauseGenerationRequest(mode="in_place"), timeout=30)  # requests wait in the server
    client = SglangClient([servers[0].grpc])
    outcome = concurrent.futures.Future()

    def run():
        try:
            outcome.set_result(
                client.generate_many(
                    [GenerationRequest((1, 2, 3), SamplingParams(max_new_tokens=8, seed=i)) for i in range(4)]
                )
            )
        except Exception as e:  # noqa: BLE001
            outcome.set_result(e)

    threading.Thread(target=run, daemon=True).start()
    time.sleep(0.3)
    try:
        client.close()
        assert isinstance(outcome.result(timeout=30), ClientClosedError)
    finally:
        admin.ContinueGeneration(pb.ContinueGenerationRequest(), timeout=30)
    with pytest.raises(ClientClosedError):
        asyncio.run(client.generate(GenerationRequest((1,), SamplingParams(max_new_tokens=1))))


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def test_default_request_deadline_is_finite(servers, checkpoints, tmp_path):
    """engine.request_timeout_s used to default to 0: no deadline, a request on a stopped server waited forever."""
    _, models = checkpoints
    config = base.override(base.get_config(), {"engine.kind": "grpc", "engine.servers": servers[0].grpc})
    settings = EngineConfig.of(settings_of(base.validate(config)))
    assert settings.request_timeout_s == DEFAULT_REQUEST_TIMEOUT_S == 3600
    client = policy_engine(settings, models["m0"], workdir=str(tmp_path))
    try:
        assert client.request_timeout_s == 3600
    finally:
        client.close()
    zero = EngineConfig.of(settings_of(base.validate(base.override(config, {"engine.request_timeout_s": 0.0}))))
    client = policy_engine(zero, models["m0"], workdir=str(tmp_path))
    try:
        assert client.request_timeout_s is None  # 0, set explicitly: no deadline (health checks still run)
    finally:
        client.close()


def test_a_paused_server_is_found_and_returns_to_rotation(servers):
    """SIGSTOP one server while requests are in flight: the health checks take it out and its requests finish on the
    other; SIGCONT: it passes the checks, still serves the weights it had, and gets requests again."""
    victim, survivor = servers
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=48, seed=i)) for i, p in enumerate(_prompts(8, seed=5))
    ]

    async def phase(client):
        tasks = [asyncio.ensure_future(client.generate(r)) for r in requests]
        # Requests in flight on each server. (Waiting for a first result instead once stopped a victim that had just
        # answered all of its batch together: nothing was left to retry.)
        deadline = time.monotonic() + 60
        while min(client.outstanding_counts().values()) < 1:
            assert time.monotonic() < deadline, f"no request in flight on each server: {client.outstanding_counts()}"
            await asyncio.sleep(0.002)
        victim.process.send_signal(signal.SIGSTOP)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)

    with SglangClient([s.grpc for s in servers], health_interval_s=0.5, health_timeout_s=2.0) as client:
        try:
            results = asyncio.run(phase(client))
            # The health checks take the paused server out within a few intervals; on a loaded machine the requests
            # it held can finish elsewhere before that (a fresh clone's suite next to the slow tier once saw it).
            _wait_for(lambda: client.live_servers == [survivor.grpc], 30, "the paused server to be taken out")
            assert client.retries >= 1
        finally:
            victim.process.send_signal(signal.SIGCONT)
        _wait_for(lambda: victim.grpc in client.live_servers, 60, "the resumed server to return")
        assert client.returns() == {victim.grpc: 1, survivor.grpc: 0}
        before = client.served_counts()[victim.grpc]
        more = client.generate_many([GenerationRequest(p, SamplingParams(max_new_tokens=4)) for p in _prompts(6)])
        assert client.served_counts()[victim.grpc] > before and len(more) == 6
    assert [r.request_id for r in results] == [q.request_id for q in requests]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 48 for r in results)


def test_a_server_restarted_on_its_port_gets_the_current_weights(servers, checkpoints, tmp_path):
    """A server killed and started again on the same port (from other weights, at version 0) is found, given the
    current version's checkpoint, and used again: its completions are the pushed model's."""
    _, models = checkpoints
    victim, survivor = servers
    prompt = _prompts(1, seed=6)[0]
    with SglangClient(
        [s.grpc for s in servers], weight_dir=tmp_path, health_interval_s=0.5, health_timeout_s=2.0
    ) as client:
        client.update_weights(models["m1"], 300)
        victim.restart()  # serves m0 as version 0 once up
        during = client.generate_many([GenerationRequest(p, SamplingParams(max_new_tokens=3)) for p in _prompts(2)])
        assert {r.weight_version for r in during} == {300}
        victim.wait()
        _wait_for(lambda: client.returns()[victim.grpc] == 1, 120, "the restarted server to return")
        assert client.live_servers == [victim.grpc, survivor.grpc]
    with SglangClient([victim.grpc], weight_version=300) as direct:  # what the restarted server serves now
        result = direct.generate_many([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6))])[0]
    assert result.weight_version == 300
    np.testing.assert_allclose(result.logprobs, _teacher_forced(models["m1"], prompt, result.token_ids), atol=2e-5)


def test_a_server_killed_mid_phase_loses_no_request(servers):
    """Kill one server while requests are in flight: every request completes exactly once on the other."""
    victim, survivor = servers
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=48, seed=i)) for i, p in enumerate(_prompts(16, seed=3))
    ]

    async def phase(client):
        tasks = [asyncio.ensure_future(client.generate(r)) for r in requests]
        while sum(t.done() for t in tasks) < 2:  # mid-phase: some finished, many in flight on both servers
            await asyncio.sleep(0.05)
        victim.process.send_signal(signal.SIGKILL)
        return await asyncio.gather(*tasks)

    with SglangClient([s.grpc for s in servers]) as client:
        results = asyncio.run(phase(client))
        assert client.live_servers == [survivor.grpc] and client.retries >= 1
    assert [r.request_id for r in results] == [q.request_id for q in requests]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 48 for r in results)


@pytest.fixture(scope="module")
def serve_module():
    """launch/serve.py's module (its argument checks run without starting a server)."""
    return importlib.import_module("rltldr_jax.cli.serve")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--max_batch=0", "--max_batch must be >= 1, got 0"),  # was: healthy, and never answered
        ("--max_batch=-3", "--max_batch must be >= 1, got -3"),
        ("--max_len=0", "--max_len must be >= 2 (a prompt token and a new one), got 0"),
        ("--max_len=1", "--max_len must be >= 2 (a prompt token and a new one), got 1"),
        ("--port=99999", "--port must be in [0, 65535] (0 picks a free port), got 99999"),
        ("--port=-1", "--port must be in [0, 65535] (0 picks a free port), got -1"),
        ("--http_port=70000", "--http_port must be in [0, 65535] (0 picks a free port), got 70000"),
        ("--weight_version=-1", "--weight_version must be >= 0, got -1"),
        ("--prefill_chunk=24", "--prefill_chunk must be a power of two >= 16, got 24"),
        ("--decode_steps=0", "--decode_steps must be >= 1, got 0"),
        (
            "--max_batch=12",  # was: a traceback from the engine (groups of 8 do not tile 12 slots)
            "--decode_group=8 does not divide --max_batch=12: set --decode_group to a divisor of max_batch (or "
            "max_batch a multiple of it)",
        ),
    ],
)
def test_serve_refuses_bad_flags_in_one_line(serve_module, capsys, flag, message):
    with pytest.raises(SystemExit) as exit_info:
        serve_module.parse_args(["--preset=tiny", flag])
    assert exit_info.value.code not in (0, None)
    assert str(exit_info.value.code) == f"error: {message}"  # sys.exit(text): printed as one line, no usage
    assert capsys.readouterr().err == ""


KEY = "s3cret-key-for-tests"


def _in_process_server(path: str, api_key: str | None = None):
    """An in-process server on the checkpoint `path` (gRPC and HTTP admin, as launch/serve.py runs them): yields
    (gRPC address, HTTP base URL, service)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    model = load_pretrained(path)  # its own copy: pushes must not change the fixture's models
    engine = JaxEngine(model, max_batch=1, max_len=64)
    service = EngineService(
        engine, model_path=path, fingerprint=weights_fingerprint(model), api_key=api_key, base=model
    )
    server, port = asyncio.run_coroutine_threadsafe(start_server(service), loop).result()
    http = start_http_admin(service, loop, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{http.server_address[1]}", service
    finally:
        http.shutdown()
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        engine.close()


@pytest.fixture
def keyed_server(checkpoints):
    """An in-process server on m0 that requires the API key KEY."""
    tmp, _ = checkpoints
    yield from _in_process_server(str(tmp / "m0"), KEY)


@pytest.fixture
def plain_server(checkpoints):
    """An in-process server on m0, without a key."""
    tmp, _ = checkpoints
    yield from _in_process_server(str(tmp / "m0"))


def _post_json(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow  # 27 CPU s
def test_the_server_serves_a_lora_adapter_as_sglang_does(plain_server, checkpoints, tmp_path):
    """POST /load_lora_adapter of a PEFT adapter (ours): requests naming it sample from base + adapter (their logprobs
    are the merged model's teacher-forced ones), a request naming another adapter or none is refused with the fix,
    a bad adapter keeps what is served, /unload_lora_adapter serves the base again."""
    from flax import nnx

    from rltldr_jax.models import lora

    address, http, service = plain_server
    tmp, models = checkpoints
    adapted = lora.attach(load_pretrained(str(tmp / "m0")), lora.LoraSpec(rank=4, alpha=8.0))
    state = lora.adapter_state(adapted)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(state))))
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), state))
    lora.save_adapter(adapted, tmp_path / "adapter")
    prompt = _prompts(1, seed=3)[0]

    def generate(stub, lora_path=None):
        request = pb.GenerateRequest(
            input_ids=list(prompt),
            sampling_params=pb.SamplingParams(max_new_tokens=4, temperature=1.0, seed=5),
            return_logprob=True,
            **({} if lora_path is None else {"lora_path": lora_path}),
        )
        (response,) = list(stub.Generate(request, timeout=120))
        logprobs = json.loads(response.meta_info["output_token_logprobs"])
        return list(response.output_ids), np.array([lp for lp, _, _ in logprobs])

    missing = {"lora_name": "v1", "lora_path": str(tmp_path / "nothing")}
    assert _post_json(f"{http}/load_lora_adapter", missing)[0] == 400 and service.adapter is None
    status, reply = _post_json(f"{http}/load_lora_adapter", {**missing, "lora_path": str(tmp_path / "adapter")})
    assert status == 200 and reply["success"], reply
    with grpc.insecure_channel(address) as channel:
        stub = pb.Stub(channel)
        assert json.loads(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).json_info)["lora_adapter"] == "v1"
        tokens, logprobs = generate(stub, "v1")
        np.testing.assert_allclose(logprobs, _teacher_forced(lora.merged(adapted), list(prompt), tokens), atol=2e-4)
        for name, code in ((None, grpc.StatusCode.FAILED_PRECONDITION), ("v0", grpc.StatusCode.NOT_FOUND)):
            with pytest.raises(grpc.RpcError) as error:
                generate(stub, name)
            assert error.value.code() == code and "v1" in error.value.details()
        assert _post_json(f"{http}/unload_lora_adapter", {"lora_name": "v0"})[0] == 400
        assert _post_json(f"{http}/unload_lora_adapter", {"lora_name": "v1"}) == (
            200,
            {"success": True, "message": "unloaded LoRA adapter v1"},
        )
        tokens, logprobs = generate(stub)
        np.testing.assert_allclose(logprobs, _teacher_forced(models["m0"], list(prompt), tokens), atol=2e-4)


def _post(url: str, body: dict, headers: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_api_key_is_required_on_every_rpc(keyed_server, checkpoints, monkeypatch, caplog):
    """UpdateWeightsFromDisk loaded any path the server could read, from any client: with --api_key, every RPC
    without the key ends UNAUTHENTICATED (and the HTTP update is 401); the client sends the key from the environment,
    and nothing logs it."""
    caplog.set_level(logging.DEBUG)
    address, http, service = keyed_server
    tmp, _ = checkpoints
    calls = {
        "UpdateWeightsFromDisk": pb.UpdateWeightsRequest(model_path=str(tmp / "m1"), weight_version="7"),
        "HealthCheck": pb.HealthCheckRequest(),
        "GetModelInfo": pb.GetModelInfoRequest(),
        "PauseGeneration": pb.PauseGenerationRequest(mode="in_place"),
        "Abort": pb.AbortRequest(abort_all=True),
    }
    generate = pb.GenerateRequest(input_ids=[1, 2], sampling_params=pb.SamplingParams(max_new_tokens=2))
    with grpc.insecure_channel(address) as channel:
        for key in (None, "wrong", KEY[:-1]):
            stub = pb.Stub(channel, api_key=key)
            for name, request in calls.items():
                with pytest.raises(grpc.RpcError) as error:
                    getattr(stub, name)(request, timeout=30)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
                assert pb.API_KEY_ENV in error.value.details() and KEY not in error.value.details()
            with pytest.raises(grpc.RpcError) as error:
                list(stub.Generate(generate, timeout=30))
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert pb.Stub(channel, api_key=KEY).HealthCheck(pb.HealthCheckRequest(), timeout=30).healthy
    update = {"model_path": str(tmp / "m1"), "weight_version": 7}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        assert _post(f"{http}/update_weights_from_disk", update, headers) == 401
    assert service.model_path == str(tmp / "m0") and service.engine.weight_version == 0  # nothing was loaded
    with urllib.request.urlopen(f"{http}/health", timeout=30) as response:  # open, as SGLang's
        assert response.status == 200

    monkeypatch.delenv(pb.API_KEY_ENV, raising=False)
    with pytest.raises(NoServerError, match=f"UNAUTHENTICATED.*set {pb.API_KEY_ENV}"):
        SglangClient([address], connect_timeout_s=10)
    monkeypatch.setenv(pb.API_KEY_ENV, KEY)
    with SglangClient([address]) as client:
        assert (
            client.generate_many([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])[0].weight_version == 0
        )
        client.push_weights(tmp / "m1", 7)
    with SglangClient([address], weight_update="http", http_urls=[http], weight_version=7) as client:
        client.push_weights(tmp / "m0", 8)
        assert (
            client.generate_many([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])[0].weight_version == 8
        )
    assert service.model_path == str(tmp / "m0") and service.engine.weight_version == 8
    assert caplog.records and KEY not in caplog.text


def test_serve_takes_checkpoint_or_preset_and_parses_afresh_each_time(serve_module, checkpoints, tmp_path):
    """--checkpoint (the launchers' name for the policy; --model_path before) or --preset, one of them; each
    `parse_args` starts from the defaults; neither importing the module nor parsing defines a flag on absl's global
    FLAGS, where other launchers imported in the same test session define `--checkpoint` or `--preset` too."""
    from absl import flags

    tmp, _ = checkpoints
    assert serve_module.parse_args([f"--checkpoint={tmp / 'm0'}"]).checkpoint == str(tmp / "m0")
    assert serve_module.parse_args([f"--model_path={tmp / 'm1'}"]).checkpoint == str(tmp / "m1")  # the old name
    args = serve_module.parse_args(
        ["--preset=tiny", "--port=0", "--no_warmup", "--port_file=p", "--weights_dtype=bfloat16"]
    )
    assert (args.checkpoint, args.preset, args.port, args.no_warmup) == (None, "tiny", 0, True)
    assert (args.port_file, args.weights_dtype) == (os.path.abspath("p"), "bfloat16")  # absolute where it enters
    again = serve_module.parse_args(["--preset=tiny"])
    assert (again.port, again.no_warmup, again.port_file, again.weights_dtype) == (40000, False, None, "")
    for argv, message in (
        ([], "error: give --checkpoint=DIR (an HF checkpoint directory or hub id) or --preset=NAME (random weights)"),
        ([f"--checkpoint={tmp / 'm0'}", "--preset=tiny"], "error: give --checkpoint or --preset, not both"),
        ([f"--checkpoint={tmp_path}"], f"error: --checkpoint {str(tmp_path)!r} has no config.json; give an HF "),
        (["--preset=tiny", "--max_batch=x"], "error: flag --max_batch=x: invalid literal for int() with base 10: 'x'"),
        (["--preset=tiny", "--dtype=float16"], "error: flag --dtype=float16: value should be one of "),
    ):
        with pytest.raises(SystemExit) as exit_info:
            serve_module.parse_args(argv)
        assert str(exit_info.value.code).startswith(message), argv
    assert not flags.FLAGS.get_flags_for_module(serve_module.__name__)


def test_serve_binds_this_host_by_default_and_takes_the_key(serve_module, monkeypatch):
    monkeypatch.delenv(pb.API_KEY_ENV, raising=False)
    args = serve_module.parse_args(["--preset=tiny"])
    assert args.host == "127.0.0.1" and args.api_key is None and serve_module.exposure_warning(args) is None
    exposed = serve_module.parse_args(["--preset=tiny", "--host=0.0.0.0"])
    assert "0.0.0.0 without an API key" in serve_module.exposure_warning(exposed)
    assert serve_module.parse_args(["--preset=tiny", "--api-key=abc"]).api_key == "abc"  # SGLang's spelling
    assert serve_module.parse_args(["--preset=tiny", "--api-key", "abc"]).api_key == "abc"
    assert serve_module.parse_args(["--preset=tiny", "--api_key=abc"]).api_key == "abc"
    monkeypatch.setenv(pb.API_KEY_ENV, KEY)
    keyed = serve_module.parse_args(["--preset=tiny", "--host=0.0.0.0"])
    assert keyed.api_key == KEY and serve_module.exposure_warning(keyed) is None
    with pytest.raises(SystemExit, match="--api_key is empty"):
        serve_module.parse_args(["--preset=tiny", "--api_key= "])


def test_serve_sglang_commands_and_clear_error_without_sglang():
    script = os.path.join(ROOT, "launch", "serve_sglang.py")
    dry = subprocess.run(
        [sys.executable, script, "--checkpoint=/ckpt/q", "--num_servers=2", "--tp=2", "--dry_run"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert dry[1].startswith("CUDA_VISIBLE_DEVICES=2,3 ")
    for flag in ("--grpc-port 40001", "--port 30001", "--skip-tokenizer-init", "--weight-version 0", "--tp-size 2"):
        assert flag in dry[1]
    assert dry[2].endswith(
        "engine.servers=127.0.0.1:40000,127.0.0.1:40001 --config.engine.http_servers=http://127.0.0.1:30000,http://127.0.0.1:30001"
    )
    lora = subprocess.run(
        [sys.executable, script, "--checkpoint=/ckpt/q", "--lora_rank=16", "--dry_run"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--enable-lora --max-lora-rank 16 --lora-target-modules all --max-loras-per-batch 2" in lora
    keyed = subprocess.run(
        [sys.executable, script, "--checkpoint=/ckpt/q", "--dry_run"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, pb.API_KEY_ENV: KEY},
    ).stdout
    assert "--api-key '***'" in keyed and KEY not in keyed  # SGLang gets the key; the printout hides it
    launcher = importlib.import_module("rltldr_jax.cli.serve_sglang")
    assert launcher.API_KEY_ENV == pb.API_KEY_ENV  # its own copy (it does not import jax for --dry_run)
    no_jax = (
        "import sys; from rltldr_jax.cli.serve_sglang import main\n"
        "main(['--model_path=/ckpt/q', '--dry_run', '--', '--enable-memory-saver'])\n"
        "assert 'jax' not in sys.modules and 'rltldr_jax.cli.common' not in sys.modules, 'imported jax'\n"
    )
    old_name = subprocess.run([sys.executable, "-c", no_jax], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "--model-path /ckpt/q " in old_name.stdout and old_name.stdout.splitlines()[0].endswith(
        " --enable-memory-saver"
    )  # SGLang's own flags, after --
    assert old_name.stderr == "notice: --model_path is now --checkpoint (the old name goes in the next release)\n"
    for argv, message in (
        ([], "give --checkpoint=DIR: the HF checkpoint directory (or hub id) the servers serve"),
        (["--checkpoint=q", "--tp=0"], "--num_servers and --tp must be >= 1, got 1 and 0"),
        (
            ["--checkpoint=q", "--num_servers=2", "--grpc_port=30001"],
            "the HTTP ports 30000-30001 and the gRPC ports 30001-30002 of 2 servers overlap; move --grpc_port",
        ),
        (
            ["--checkpoint=q", "--enable-memory-saver"],
            "Unknown command line flag 'enable-memory-saver'; SGLang's own flags go after --, e.g. -- "
            "--enable-memory-saver",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            launcher.parse_args(argv)
        assert exit_info.value.code == f"error: {message}", argv
    real = subprocess.run([sys.executable, script, "--checkpoint=/ckpt/q"], capture_output=True, text=True, check=False)
    assert real.returncode != 0
    assert "SGLang is not installed" in real.stderr or "no CUDA GPU" in real.stderr


def test_a_lora_policy_is_pushed_as_adapters_and_sampled_from_them(checkpoints, tmp_path):
    """SglangClient with a LoRA policy (takes_adapters: the servers' HTTP URLs given): ensure_weights verifies the
    base and loads the adapters, each update pushes only the adapters (a PEFT directory, not the model) under a
    versioned name, requests name them, results carry the version, and the logprobs are the merged policy's."""
    import contextlib

    from flax import nnx

    from rltldr_jax.models import lora

    tmp, models = checkpoints
    with contextlib.ExitStack() as stack:
        pair = [stack.enter_context(contextlib.contextmanager(_in_process_server)(str(tmp / "m0"))) for _ in range(2)]
        policy = lora.attach(load_pretrained(str(tmp / "m0")), lora.LoraSpec(rank=4, alpha=8.0))
        client = stack.enter_context(
            SglangClient([a for a, _, _ in pair], http_urls=[h for _, h, _ in pair], weight_dir=tmp_path / "sync")
        )
        assert client.takes_adapters
        assert client.ensure_weights(policy, 0) == "verified"  # (the base: the servers' own weights)
        assert client.adapter == "policy-v000000" and all(s.adapter == "policy-v000000" for _, _, s in pair)
        prompts = _prompts(4, seed=7)
        for version in (1, 2):
            state = lora.adapter_state(policy)
            keys = iter(jax.random.split(jax.random.key(version), len(jax.tree.leaves(state))))
            nnx.update(policy, jax.tree.map(lambda x, k=keys: x + 0.2 * jax.random.normal(next(k), x.shape), state))
            client.update_weights(policy, version)
            assert sorted(os.listdir(tmp_path / "sync"))[-1] == f"a{version:06d}"
            assert sorted(os.listdir(tmp_path / "sync" / f"a{version:06d}")) == [
                lora.ADAPTER_CONFIG,
                lora.ADAPTER_WEIGHTS,
            ]
            assert all(s.adapter == f"policy-v{version:06d}" for _, _, s in pair)
            results = client.generate_many(
                [GenerationRequest(p, SamplingParams(max_new_tokens=3, seed=i)) for i, p in enumerate(prompts)]
            )
            merged = lora.merged(policy)
            assert {r.weight_version for r in results} == {version}
            assert sum(client.served_counts().values()) >= len(prompts)
            for p, r in zip(prompts, results, strict=True):
                np.testing.assert_allclose(r.logprobs, _teacher_forced(merged, list(p), list(r.token_ids)), atol=2e-4)
        # a server that lost its weights behind the client's back (restarted from others) and left the rotation gets
        # the base (kept on disk) and the current adapter again before it returns
        address, http, service = pair[1]
        assert _post_json(f"{http}/update_weights_from_disk", {"model_path": str(tmp / "m2")})[0] == 200
        assert service.adapter is None
        server = next(s for s in client._servers if s.address == address)
        client._loop.call_soon_threadsafe(client._take_out, server, "lost its weights (test)")
        deadline = time.monotonic() + 120
        while client.returns()[address] == 0:
            assert time.monotonic() < deadline, "the server did not return to rotation"
            time.sleep(0.2)
        assert service.adapter == "policy-v000002" and service.model_path == str(tmp / "m0")
        with grpc.insecure_channel(address) as channel:
            request = pb.GenerateRequest(
                input_ids=list(prompts[0]),
                sampling_params=pb.SamplingParams(max_new_tokens=3, temperature=1.0, seed=1),
                return_logprob=True,
                lora_path="policy-v000002",
            )
            (response,) = list(pb.Stub(channel).Generate(request, timeout=120))
        logprobs = [lp for lp, _, _ in json.loads(response.meta_info["output_token_logprobs"])]
        expected = _teacher_forced(merged, list(prompts[0]), list(response.output_ids))
        np.testing.assert_allclose(logprobs, expected, atol=2e-4)
        # a full push replaces the servers' weights: requests name no adapter again
        client.push_weights(tmp / "m1", 3)
        assert client.adapter is None and all(s.adapter is None for _, _, s in pair)
        (r,) = client.generate_many([GenerationRequest(prompts[0], SamplingParams(max_new_tokens=2, seed=0))])
        np.testing.assert_allclose(
            r.logprobs, _teacher_forced(models["m1"], list(prompts[0]), list(r.token_ids)), atol=2e-4
        )
