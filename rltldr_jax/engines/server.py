"""A JaxEngine behind SGLang's native gRPC service: a generation server for hosts without SGLang.

`launch/serve.py` runs it. It speaks the subset of `sglang.runtime.v1.SglangService` in
`proto/sglang/runtime/v1/sglang.proto`, with SGLang's semantics, so `SglangClient` cannot tell it from an
SGLang server started with `--grpc-port --skip-tokenizer-init`:

- `Generate`: `input_ids` in; one final response (`finished=true`) with `output_ids` and `meta_info`, whose
  values are JSON strings: `id`, `finish_reason` ({"type": "stop", "matched": id} | {"type": "length",
  "length": n} | {"type": "abort", "message": ...}), `prompt_tokens`, `completion_tokens`, `cached_tokens`,
  `weight_version`, and with `return_logprob` `output_token_logprobs` = [[logprob, id, null], ...].
  Generation stops only on `stop_token_ids` (the engine knows no EOS ids; `ignore_eos` is accepted and has no
  effect). Seeds must be in [0, 2**32).
  A client that disconnects aborts its request.
- `UpdateWeightsFromDisk`: loads an HF safetensors directory (as written by `models.save_pretrained`) with
  the running model's architecture and dtype; on any error the old weights stay and `success=false` says why.
  The `weight_version` extension field sets the label later outputs report (unset: the label stays, as in
  SGLang).
  The same update is offered as SGLang's HTTP `POST /update_weights_from_disk` (`start_http_admin`), so the
  client's `weight_update="http"` path (the one to use with SGLang) is tested against a real server.
- `PauseGeneration` ("abort" — the default, as SGLang's — | "in_place" | "retract"), `ContinueGeneration`,
  `Abort` (one rid or all), `FlushCache` (no prefix cache here: always succeeds), `HealthCheck`,
  `GetModelInfo`, `GetLoad`.
- LoRA adapters, as SGLang serves them: HTTP `POST /load_lora_adapter {"lora_name", "lora_path"}` (a PEFT adapter
  directory, `models.lora.save_adapter`'s) and `POST /unload_lora_adapter {"lora_name"}`; a `Generate` request
  names the adapter it samples from in `lora_path`. This server holds one adapter at a time, merged into the base
  weights it loaded last (at start or by `UpdateWeightsFromDisk`): loading another replaces it; a request naming
  another adapter ends NOT_FOUND, and while an adapter is loaded a request naming none ends FAILED_PRECONDITION
  (SGLang would sample from the base: here the base is not served beside the adapter). `GetModelInfo` says which
  (`lora_adapter`).
- `GetModelInfo`'s JSON adds `weights_fingerprint` (`models.fingerprint.weights_fingerprint` of the served
  weights, recomputed on every update) and `param_dtype`, so a trainer can check at start that the server already
  serves its weights instead of pushing them (SGLang reports no fingerprint: the trainer pushes).

Bad requests end with gRPC status INVALID_ARGUMENT and a message naming the problem.

Access: `UpdateWeightsFromDisk` loads any checkpoint path this process can read, so a server is for its trainer
only. launch/serve.py binds 127.0.0.1 unless told otherwise (`--host=0.0.0.0` on clusters) and takes SGLang's
`--api-key` convention: with a key (`api_key`), every RPC must carry the metadata `authorization: Bearer KEY`
(`sglang_proto.auth_metadata`; the client sends it from `$RLTLDR_ENGINE_API_KEY`) or it ends UNAUTHENTICATED, and
the HTTP `POST` needs the header `Authorization: Bearer KEY` (401 otherwise; `GET /health` stays open, as SGLang's).
The key is compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import jax.numpy as jnp
from google.protobuf.descriptor import FieldDescriptor

from rltldr_jax.engines import sglang_proto as pb
from rltldr_jax.engines.engine import GenerationRequest, GenerationResult, SamplingParams
from rltldr_jax.engines.jax_engine import JaxEngine
from rltldr_jax.models.fingerprint import weights_fingerprint
from rltldr_jax.models.hf import load_pretrained

log = logging.getLogger(__name__)

# SGLang's defaults for fields a request leaves unset (HTTP `SamplingParams`).
DEFAULT_MAX_NEW_TOKENS = 128
FLOAT_TYPES = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)


def sampling_params(request: Any) -> SamplingParams:
    """Our SamplingParams from a `GenerateRequest`'s optional fields (unset = SGLang's default).

    Raises ValueError (the RPC's INVALID_ARGUMENT) for any float field of the message that is NaN or infinite: every
    one, whether or not this server uses it (`nan < 0` is False, so range checks alone would let NaN through).
    """
    p = request.sampling_params
    has = p.HasField
    for field in p.DESCRIPTOR.fields:
        if field.type in FLOAT_TYPES and has(field.name) and not math.isfinite(getattr(p, field.name)):
            raise ValueError(f"sampling_params.{field.name} must be a finite number, got {getattr(p, field.name)}")
    return SamplingParams(
        temperature=p.temperature if has("temperature") else 1.0,
        top_p=p.top_p if has("top_p") else 1.0,
        top_k=p.top_k if has("top_k") and p.top_k > 0 else -1,
        max_new_tokens=p.max_new_tokens if has("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS,
        stop_token_ids=tuple(p.stop_token_ids),
        seed=p.seed if has("seed") else None,
    )


def finish_reason_json(result: GenerationResult) -> dict[str, Any]:
    """SGLang's `meta_info["finish_reason"]` for a result."""
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": result.token_ids[-1]}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.token_ids)}
    return {"type": "abort", "message": "aborted by the server (abort, pause with mode=abort, or shutdown)"}


def meta_info(result: GenerationResult, prompt_tokens: int, with_logprobs: bool) -> dict[str, str]:
    """The response's meta_info map: every value JSON-encoded, as SGLang's native gRPC server does."""
    info: dict[str, Any] = {
        "id": result.request_id,
        "finish_reason": finish_reason_json(result),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(result.token_ids),
        "cached_tokens": 0,
        "weight_version": str(result.weight_version),
    }
    if with_logprobs:
        info["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(result.logprobs, result.token_ids, strict=True)
        ]
    return {k: json.dumps(v) for k, v in info.items()}


class EngineService:
    """The RPC implementations (grpc.aio) over one JaxEngine.

    Args:
      engine: the running engine; the service does not close it.
      model_path: what `GetModelInfo` reports (the checkpoint the server started from, or the last one loaded).
      param_dtype: dtype of weights loaded by `UpdateWeightsFromDisk` (the running model's).
      fingerprint: `weights_fingerprint` of the weights the engine started with (None: not reported until the
        first update).
      api_key: when set, every RPC must carry it (`sglang_proto.auth_metadata`) or ends UNAUTHENTICATED.
      base: the model the engine serves at start (needed to load LoRA adapters onto: `load_lora_adapter`), or None.
    """

    def __init__(
        self,
        engine: JaxEngine,
        *,
        model_path: str,
        param_dtype: Any = jnp.float32,
        fingerprint: str | None = None,
        api_key: str | None = None,
        base: Any = None,
    ):
        self.engine = engine
        self.base = base  # the plain model adapters are merged into (replaced by every full update)
        self.adapter: str | None = None  # the name of the loaded LoRA adapter, if any
        self.model_path = model_path
        self.param_dtype = param_dtype
        self.fingerprint = fingerprint
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self._update_lock = asyncio.Lock()

    def handler(self) -> grpc.GenericRpcHandler:
        methods = pb.service_descriptor().methods
        return pb.generic_handler({m.name: self._guarded(getattr(self, m.name), m.server_streaming) for m in methods})

    def authorized(self, authorization: str | None) -> bool:
        """Whether an `authorization` value ("Bearer KEY") is this server's key; always True without one."""
        if self._expected is None:
            return True
        return authorization is not None and hmac.compare_digest(authorization.encode(), self._expected)

    def _guarded(self, implementation: Any, streaming: bool) -> Any:
        """`implementation`, refusing calls without the API key (UNAUTHENTICATED) when the server has one."""
        if self._expected is None:
            return implementation

        async def check(context) -> None:
            metadata = dict(context.invocation_metadata() or ())
            if not self.authorized(metadata.get("authorization")):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"missing or wrong API key: this server requires one (--api_key); set {pb.API_KEY_ENV} to it "
                    "where the client runs",
                )

        if streaming:

            async def stream(request, context):
                await check(context)
                async for response in implementation(request, context):
                    yield response

            return stream

        async def unary(request, context):
            await check(context)
            return await implementation(request, context)

        return unary

    async def Generate(self, request, context):
        if request.HasField("logprob_start_len") and request.logprob_start_len >= 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "input-token logprobs (logprob_start_len >= 0) are not supported"
            )
        named = request.lora_path if request.HasField("lora_path") else ""
        if named != (self.adapter or ""):
            if named:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"LoRA adapter {named!r} is not loaded (this server serves {self.adapter or 'no adapter'}): "
                    "load it first (POST /load_lora_adapter)",
                )
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this server serves LoRA adapter {self.adapter!r}: name it in lora_path (or unload it)",
            )
        rid = request.rid if request.HasField("rid") and request.rid else uuid.uuid4().hex
        try:
            ours = GenerationRequest(tuple(request.input_ids), sampling_params(request), request_id=rid)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationResult] = loop.create_future()

        def done(result: GenerationResult) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

        try:
            self.engine.submit(ours, done)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RuntimeError as e:  # the engine is closed (e.g. its thread died)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        try:
            result = await future
        except asyncio.CancelledError:  # the client went away: free the slot
            self.engine.abort(rid)
            raise
        with_logprobs = request.HasField("return_logprob") and request.return_logprob
        yield pb.GenerateResponse(
            output_ids=result.token_ids, meta_info=meta_info(result, len(ours.prompt_ids), with_logprobs), finished=True
        )

    async def UpdateWeightsFromDisk(self, request, context):
        if request.HasField("load_format") and request.load_format not in ("", "auto", "safetensors"):
            return pb.UpdateWeightsResponse(
                success=False, message=f"load_format {request.load_format!r}: only safetensors"
            )
        version = request.weight_version if request.HasField("weight_version") else None
        ok, message = await self.update_from_disk(request.model_path, version)
        return pb.UpdateWeightsResponse(success=ok, message=message)

    async def update_from_disk(self, model_path: str, weight_version: str | None) -> tuple[bool, str]:
        """Loads an HF checkpoint as the new weights; returns (success, message). Failures keep the old weights."""
        version = self.engine.weight_version
        if weight_version is not None:
            try:
                version = int(weight_version)
            except ValueError:
                return False, f"weight_version must be an integer, got {weight_version!r}"
        async with self._update_lock:
            try:
                model = await asyncio.to_thread(
                    load_pretrained, model_path, dtype=self.param_dtype, compute_dtype=self.engine.dtype
                )
            except Exception as e:  # noqa: BLE001 — any load failure keeps the old weights and is reported
                return False, f"could not load {model_path!r}: {type(e).__name__}: {e}"
            if model.config != self.engine.config:
                return False, f"{model_path!r} has a different architecture than the served model; weights unchanged"
            fingerprint = await asyncio.to_thread(weights_fingerprint, model)
            self.engine.update_weights(model, version)
            self.model_path, self.fingerprint = os.fspath(model_path), fingerprint
            self.base, self.adapter = model, None
        log.info("weights updated from %s, version %d", model_path, version)
        return True, f"loaded {model_path} as version {version}"

    async def load_lora_adapter(self, name: str, path: str) -> tuple[bool, str]:
        """Serves the base merged with the PEFT adapter in `path` under `name` (replacing any loaded adapter); returns
        (success, message). Failures keep what was served."""
        from rltldr_jax.models.lora import load_adapter, merged, without_adapters

        if self.base is None:
            return False, "this server was started without its base model: it cannot load LoRA adapters"
        if not name:
            return False, "lora_name is empty: name the adapter (requests then say lora_path=NAME)"
        async with self._update_lock:
            try:
                model = await asyncio.to_thread(
                    lambda: merged(load_adapter(without_adapters(self.base), path, param_dtype=self.param_dtype))
                )
            except Exception as e:  # noqa: BLE001 — any load failure keeps what is served, and is reported
                return False, f"could not load LoRA adapter {path!r}: {type(e).__name__}: {e}"
            fingerprint = await asyncio.to_thread(weights_fingerprint, model)
            self.engine.update_weights(model, self.engine.weight_version)
            self.adapter, self.fingerprint = name, fingerprint
        log.info("LoRA adapter %s loaded from %s", name, path)
        return True, f"loaded LoRA adapter {name} from {path}"

    async def unload_lora_adapter(self, name: str) -> tuple[bool, str]:
        """Stops serving the adapter `name` (the base is served again); returns (success, message)."""
        async with self._update_lock:
            if name != self.adapter:
                return False, f"LoRA adapter {name!r} is not loaded (loaded: {self.adapter or 'none'})"
            fingerprint = await asyncio.to_thread(weights_fingerprint, self.base)
            self.engine.update_weights(self.base, self.engine.weight_version)
            self.adapter, self.fingerprint = None, fingerprint
        return True, f"unloaded LoRA adapter {name}"

    async def PauseGeneration(self, request, context):
        mode = request.mode or "abort"
        try:
            await asyncio.to_thread(self.engine.pause, mode)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.PauseGenerationResponse(message=f"paused ({mode})")

    async def ContinueGeneration(self, request, context):
        self.engine.resume()
        return pb.ContinueGenerationResponse(message="continued")

    async def Abort(self, request, context):
        self.engine.abort(None if request.abort_all else request.rid)
        return pb.AbortResponse(success=True)

    async def FlushCache(self, request, context):
        return pb.FlushCacheResponse(success=True, message="the JaxEngine keeps no prefix cache")

    async def HealthCheck(self, request, context):
        return pb.HealthCheckResponse(healthy=self.engine.error is None and self.engine.running)

    async def GetModelInfo(self, request, context):
        info = {
            "model_path": self.model_path,
            "weight_version": str(self.engine.weight_version),
            "is_generation": True,
            "max_batch": self.engine.max_batch,
            "max_len": self.engine.max_len,
            "config": self.engine.config.to_hf_dict(),
            "weights_fingerprint": self.fingerprint,
            "param_dtype": jnp.dtype(self.param_dtype).name,
            "lora_adapter": self.adapter,
        }
        return pb.GetModelInfoResponse(model_path=self.model_path, json_info=json.dumps(info))

    async def GetLoad(self, request, context):
        return pb.GetLoadResponse(json_info=json.dumps({**self.engine.load(), "paused": self.engine.paused}))


async def start_server(service: EngineService, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Starts a grpc.aio server for `service`; returns it and the bound port (`port=0` picks a free one)."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )
    server.add_generic_rpc_handlers((service.handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    await server.start()
    return server, bound


def start_http_admin(
    service: EngineService, loop: asyncio.AbstractEventLoop, host: str, port: int
) -> ThreadingHTTPServer:
    """SGLang's HTTP weight-update endpoints, `POST /update_weights_from_disk`, `/load_lora_adapter` and
    `/unload_lora_adapter`, plus `GET /health`.

    With the service's API key, a POST needs `Authorization: Bearer KEY` (401 otherwise); `GET /health` is open.

    The body is SGLang's `UpdateWeightFromDiskReqInput` JSON (`model_path` required; `weight_version`
    optional; other fields such as `flush_cache` or `abort_all_requests` are accepted and ignored); the reply
    is `{"success": bool, "message": str}`, with status 200 or 400. Runs in a thread; `port=0` picks a free one
    (`server.server_address[1]`).
    """

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 — http.server's naming
            if self.path == "/health":
                healthy = service.engine.running
                self._reply(200 if healthy else 503, {"healthy": healthy})
            else:
                self._reply(404, {"success": False, "message": f"no GET {self.path}"})

        def do_POST(self):  # noqa: N802
            if not service.authorized(self.headers.get("Authorization")):
                return self._reply(
                    401,
                    {
                        "success": False,
                        "message": f"missing or wrong API key (header Authorization: Bearer KEY); set {pb.API_KEY_ENV}",
                    },
                )
            needs = {
                "/update_weights_from_disk": ("model_path",),
                "/load_lora_adapter": ("lora_name", "lora_path"),
                "/unload_lora_adapter": ("lora_name",),
            }
            if self.path not in needs:
                return self._reply(404, {"success": False, "message": f"no POST {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                args = [str(body[key]) for key in needs[self.path]]
            except (ValueError, KeyError, TypeError) as e:
                keys = " and ".join(needs[self.path])
                return self._reply(
                    400, {"success": False, "message": f"bad request body ({e!r}); send JSON with {keys}"}
                )
            if self.path == "/update_weights_from_disk":
                version = body.get("weight_version")
                update = service.update_from_disk(args[0], None if version is None else str(version))
            elif self.path == "/load_lora_adapter":
                update = service.load_lora_adapter(*args)
            else:
                update = service.unload_lora_adapter(*args)
            ok, message = asyncio.run_coroutine_threadsafe(update, loop).result()
            self._reply(200 if ok else 400, {"success": ok, "message": message})

        def log_message(self, fmt, *args):
            log.info("http %s", fmt % args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http-admin", daemon=True).start()
    return server
