"""Generation servers sample from the trainer's weights from the first phase on.

Two real launch/serve.py servers on localhost, started from other weights than the trainer's (another seed): the
Trainer sees it in their weights fingerprints and pushes its own, so the first phase's sampler-vs-trainer
logprob gap is at the engine's numerical floor; servers that already serve the trainer's weights are verified
and not pushed to; servers given other weights behind the trainer's back stop the run at the first minibatch.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import pytest
from helpers import tiny_run_settings

from rltldr_jax.engines import JaxEngine
from rltldr_jax.engines.server import EngineService, start_server
from rltldr_jax.engines.sglang_client import SglangClient
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained
from rltldr_jax.models.fingerprint import weights_fingerprint
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.step import LogprobGapError, check_logprob_gap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LEN = 2048  # the tiny preset's rollout.max_context_tokens


def _serve(tmp: str, name: str, seed: int, *, http: bool = False) -> tuple[subprocess.Popen, str, object]:
    """A launch/serve.py server of the tiny preset (`seed`); its gRPC address (with `http`: "GRPC HTTP-URL")."""
    port_file = os.path.join(tmp, f"{name}.port")
    log = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115 — closed by the fixture
    cmd = [
        sys.executable,
        os.path.join(ROOT, "launch", "serve.py"),
        "--preset=tiny",
        f"--seed={seed}",
        "--port=0",
        f"--port_file={port_file}",
        "--max_batch=4",
        f"--max_len={MAX_LEN}",
        "--no_warmup",
        *(["--http_port=0"] if http else []),
    ]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 300
    while not os.path.exists(port_file):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"server failed to start:\n{open(log.name).read()[-3000:]}")
        time.sleep(0.2)
    ports = open(port_file).read().split()
    address = f"127.0.0.1:{ports[0]}" + (f" http://127.0.0.1:{ports[1]}" if http else "")
    return process, address, log


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers of the tiny preset with seed 7 (the trainer's seed is 0): other weights than the trainer's."""
    tmp = str(tmp_path_factory.mktemp("servers"))
    started = []
    try:
        for name in ("a", "b"):
            started.append(_serve(tmp, name, seed=7))
        yield [address for _, address, _ in started]
    finally:
        for process, _, log in started:
            process.kill()
            process.wait()
            log.close()


def _config(workdir: str, servers: list[str]):
    """The shared tiny run (tests/helpers.py: its filters keep the all-failure group, so that its actions reach the
    GRPO term and the logprob gap is measured), 1 action per attempt, sampled by `servers`."""
    return tiny_run_settings(
        workdir, 1, {"engine.kind": "grpc", "engine.servers": ",".join(servers), "rollout.max_steps": 1}
    )


def _push(servers: list[str], model, path: str, version: int) -> None:
    """Loads `model` on every server as `version`, behind any trainer's back."""
    save_pretrained(model, path)
    with SglangClient(servers) as client:
        client.push_weights(path, version)


def test_fingerprint_tells_weights_apart_across_dtypes(tmp_path):
    m0, m0_again, m1 = (ModelSpec(get_preset("tiny")).build(seed=s) for s in (0, 0, 1))
    assert weights_fingerprint(m0) == weights_fingerprint(m0_again) != weights_fingerprint(m1)
    save_pretrained(m0, tmp_path / "m0")
    from rltldr_jax.models import load_pretrained

    served = load_pretrained(str(tmp_path / "m0"), dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)  # a bf16 server
    assert weights_fingerprint(served) == weights_fingerprint(m0, dtype="bfloat16") != weights_fingerprint(m0)


@pytest.mark.slow  # 38 CPU s; a server with other weights stops the run: below
def test_servers_with_other_weights_get_the_trainers(servers, tmp_path):
    trainer = Trainer(_config(str(tmp_path / "run"), servers))
    try:
        assert trainer.initial_weights == "pushed"
        assert os.path.isdir(tmp_path / "run" / "weights" / "v000000")  # the start-up push, as version 0
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    assert metrics["update/grpo_tokens"] > 0
    # Sampled by the servers, recomputed by the trainer: equal up to fp32 rounding (the floor, ~1e-6).
    assert abs(metrics["update/first_minibatch/logprob_gap"]) < 1e-4


def test_servers_that_serve_the_trainers_weights_are_verified(servers, tmp_path):
    _push(servers, ModelSpec(get_preset("tiny")).build(seed=0), str(tmp_path / "trainer-init"), version=0)
    trainer = Trainer(_config(str(tmp_path / "run"), servers))
    try:
        assert trainer.initial_weights == "verified"
        assert not os.path.exists(tmp_path / "run" / "weights")  # nothing pushed
    finally:
        trainer.close()


def test_servers_serving_other_weights_stop_the_run_at_the_first_minibatch(servers, tmp_path):
    """Other weights pushed behind the trainer's back. Two random tiny models both spread their next-token
    distributions over 248k ids, so their gap is small (measured: -0.074 nats, under the default 0.1); the other
    model here has its (tied) embedding scaled by 10, peaked like a trained model's (measured gap: -5.7)."""
    other = ModelSpec(get_preset("tiny")).build(seed=9)
    other.embed_tokens.embedding[...] = other.embed_tokens.embedding[...] * 10.0
    trainer = Trainer(_config(str(tmp_path / "run"), servers))
    try:
        _push(servers, other, str(tmp_path / "other"), version=0)  # behind its back
        with pytest.raises(LogprobGapError, match=r"phase 1: the sampler's logprobs differ .* other weights"):
            trainer.run_phase()
        assert trainer.checkpoints.latest_step() is None  # nothing saved
    finally:
        trainer.close()


def test_servers_without_a_fingerprint_are_pushed_to_unless_assumed(tmp_path):
    """SGLang reports no fingerprint: the trainer pushes, unless engine.assume_initial_weights."""
    model = ModelSpec(get_preset("tiny")).build(seed=0)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = JaxEngine(model, max_batch=1, max_len=64)
    service = EngineService(engine, model_path="unknown", fingerprint=None)
    server, port = asyncio.run_coroutine_threadsafe(start_server(service), loop).result()
    try:
        with SglangClient([f"127.0.0.1:{port}"], weight_dir=str(tmp_path / "weights")) as client:
            assert client.ensure_weights(model, 0, assume=True) == "assumed"
            assert not os.path.exists(tmp_path / "weights")
            assert client.ensure_weights(model, 0) == "pushed"
            assert service.fingerprint == weights_fingerprint(model)  # the pushed weights are now proven
            assert client.ensure_weights(model, 0) == "verified"
            # A version label other than the trainer's is not trusted either (a resumed run at version 3).
            assert client.ensure_weights(model, 3, assume=True) == "pushed" and client.weight_version == 3
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        engine.close()


def test_the_guard_reads_the_first_minibatch():
    ok = {"logprob_gap": -3e-7, "grpo_tokens": 12.0}
    check_logprob_gap(ok, 0.1, phase=0)
    check_logprob_gap({"logprob_gap": -2.0, "grpo_tokens": 0.0}, 0.1, phase=0)  # no GRPO token: nothing measured
    check_logprob_gap({"logprob_gap": -2.0, "grpo_tokens": 5.0}, 0.0, phase=0)  # 0 = off
    check_logprob_gap({"logprob_gap": float("nan"), "grpo_tokens": 5.0}, 0.1, phase=0)  # the NaN guard's business
    with pytest.raises(LogprobGapError, match=r"phase 4: .* by \+0\.2000 nats .*train.max_logprob_gap=0.1"):
        check_logprob_gap({"logprob_gap": 0.2, "grpo_tokens": 5.0}, 0.1, phase=3)


@pytest.mark.slow  # 112 CPU s; the adapter push itself: test_grpc_engine.py
def test_a_lora_run_pushes_its_base_once_then_only_adapters(tmp_path_factory, tmp_path):
    """A LoRA run (rank 8) on servers with HTTP admin (engine.http_servers: the client takes adapters): at start the
    base is pushed (the servers hold other weights), then each phase pushes only the adapters (a000001, not a
    v000001 model), and the servers sample from base + adapters: the logprob gap stays at the numerical floor in the
    second phase, after the adapters trained."""
    tmp = str(tmp_path_factory.mktemp("lora_servers"))
    started = [_serve(tmp, name, seed=7, http=True) for name in ("a", "b")]
    try:
        grpc_addresses, http_urls = zip(*(address.split() for _, address, _ in started), strict=True)
        overrides = {
            "engine.kind": "grpc",
            "engine.servers": ",".join(grpc_addresses),
            "engine.http_servers": ",".join(http_urls),
            "rollout.max_steps": 1,
            "model.lora.rank": 8,
        }
        trainer = Trainer(tiny_run_settings(str(tmp_path / "run"), 2, overrides))
        try:
            assert trainer.engine.takes_adapters and trainer.initial_weights == "pushed"
            trainer.run_phase()
            second = trainer.run_phase()
            assert trainer.engine.adapter == "policy-v000002"
        finally:
            trainer.close()
    finally:
        for process, _, log in started:
            process.kill()
            process.wait()
            log.close()
    # the base stays on disk while adapters sit on it (a server returning to rotation gets it again); a000000 is gone
    assert sorted(os.listdir(tmp_path / "run" / "weights")) == ["a000001", "a000002", "v000000"]
    assert second["update/grpo_tokens"] > 0
    assert abs(second["update/first_minibatch/logprob_gap"]) < 1e-4
