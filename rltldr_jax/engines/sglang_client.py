"""The SGLang client: a GenerationEngine over many generation servers speaking SGLang's native gRPC service.

Servers are SGLang (`sglang serve --grpc-port N --skip-tokenizer-init`, see launch/serve_sglang.py) or
`launch/serve.py` (a JaxEngine behind the same service). One client spreads the requests of many concurrent
episodes over them:

- Routing: each request goes to the live server with the fewest outstanding requests.
- Failures: a request whose server fails (connection lost, killed, timed out) is sent again to another live
  server with the same seed; a server that then fails a health check is marked dead and gets no more
  requests. A request the server aborted (a weight push pauses with mode "abort") waits for the push to end
  and is sent again; such retries do not use up `max_attempts`. A request returns exactly one result: a retry
  only happens when no result came back, a timed-out attempt is aborted on its server first, and every
  attempt carries its own id on the wire (`{request_id}#{n}`), so a late abort of one attempt cannot hit the
  next. When no server is left, `generate` raises `NoServerError`.
- Weight push (`update_weights`): the params are exported as HF safetensors (`save_pretrained`) into
  `{weight_dir}/v{version:06d}` (written under a temporary name and renamed, so a server never reads a
  half-written checkpoint), then on every live server, concurrently: PauseGeneration → update →
  ContinueGeneration. The update is gRPC `UpdateWeightsFromDisk` (`weight_update="grpc"`, with the
  `weight_version` extension field that launch/serve.py honours) or SGLang's HTTP
  `POST /update_weights_from_disk {"model_path", "weight_version"}` (`weight_update="http"`: required for
  SGLang, whose native gRPC message has no version field; a gRPC push whose version does not show up in
  `GetModelInfo` fails with that advice). A server whose update fails while others succeed is taken out of
  rotation (it would serve stale weights); if every server fails, the push raises and the version stays.
  Afterwards every result of a request submitted after the push must report that version; one that does
  not raises `StaleWeightsError`.
- Start-up (`ensure_weights`): the trainer's weights are pushed as its current version unless every server
  proves it serves them (launch/serve.py reports a weights fingerprint; SGLang does not, so there the push is
  skipped only when the caller assumes it, config `engine.assume_initial_weights`).

Differences between backends worth knowing: SGLang also stops on the model's EOS ids (put them in
`stop_token_ids` to get the same behaviour from launch/serve.py); SGLang's logprobs are taken after temperature
but before top-p/top-k truncation, the JaxEngine's after (identical at top_p=1, top_k=-1, the RL setting);
SGLang ignores the seed extension, so a retried request is resampled there; SGLang reports bad requests as
INTERNAL, so they are retried before failing.

All gRPC traffic runs on one private asyncio event loop in a background thread, so `generate` can be awaited
from any event loop (or many), and the blocking methods (`update_weights`, `generate_many`) from plain code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, Literal

import grpc
import numpy as np
from flax import nnx

from rltldr_jax.engines import sglang_proto as pb
from rltldr_jax.engines.engine import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

# Transport failures worth retrying elsewhere; INVALID_ARGUMENT and friends are the caller's bug.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class NoServerError(RuntimeError):
    """Every generation server is dead."""


class StaleWeightsError(RuntimeError):
    """A server answered with an older weight version than the one pushed before the request."""


class ClientClosedError(RuntimeError):
    """The client was closed while the request was in flight."""


@dataclasses.dataclass
class _Server:
    address: str
    http_url: str | None
    stub: Any = None
    channel: Any = None
    outstanding: int = 0
    alive: bool = True
    served: int = 0  # results returned (for tests and logs)


def parse_response(response: Any, request_id: str) -> GenerationResult:
    """A GenerationResult from SGLang's final GenerateResponse (meta_info values are JSON strings)."""
    meta = {k: json.loads(v) for k, v in response.meta_info.items()}
    ids = tuple(int(t) for t in response.output_ids)
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else None
    if kind == "abort":  # abort paths may omit logprobs and version: nothing else is needed
        return GenerationResult(request_id, (), (), "abort", -1)
    if "output_token_logprobs" not in meta:
        raise ValueError(
            f"request {request_id}: the server returned no output_token_logprobs (return_logprob ignored?)"
        )
    logprobs = tuple(float(x[0]) for x in meta["output_token_logprobs"])
    if len(logprobs) != len(ids) or any(
        int(x[1]) != t for x, t in zip(meta["output_token_logprobs"], ids, strict=True)
    ):
        raise ValueError(f"request {request_id}: output_token_logprobs do not match output_ids")
    if kind not in ("stop", "length"):
        raise ValueError(f"request {request_id}: unknown finish_reason {reason!r}")
    raw_version = meta.get("weight_version", "")
    try:
        version = int(raw_version)
    except (TypeError, ValueError):
        raise ValueError(
            f"request {request_id}: weight_version {raw_version!r} is not an integer; start SGLang with "
            "--weight-version 0 (launch/serve_sglang.py does) and push weights through this client"
        ) from None
    return GenerationResult(request_id, ids, logprobs, kind, version)


class SglangClient:
    """GenerationEngine over SGLang-compatible gRPC servers (implements `GenerationEngine`).

    Args:
      addresses: "host:port" of each server's gRPC listener.
      http_urls: SGLang's HTTP base URL of each server (same order), needed for `weight_update="http"`.
      weight_update: "grpc" (launch/serve.py, or SGLang without version labels) or "http" (SGLang).
      weight_dir: directory shared with the servers for weight pushes (required for `update_weights`).
      graphdef: the model's graph definition, when `update_weights` is given an `nnx.State`.
      export_dtype: dtype of the pushed safetensors (servers cast to their own dtype); None keeps the params'.
      pause_mode: PauseGeneration mode around a push. "abort" (default) makes in-flight requests come back
        aborted, and they are retried on the new weights, so no completion mixes two versions.
      request_timeout_s: per-attempt deadline of a Generate call (None: none).
      max_attempts: failed tries (transport errors, timeouts) per request before `generate` gives up.
      max_aborts: server-side aborts (e.g. by pushes) tolerated per request before `generate` gives up.
      keep_exports: pushed checkpoint directories kept on disk (older ones are deleted).
      connect_timeout_s: how long to wait for every server's health check at start.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        http_urls: Sequence[str] | None = None,
        weight_update: Literal["grpc", "http"] = "grpc",
        weight_dir: str | os.PathLike | None = None,
        graphdef: Any = None,
        export_dtype: Any = None,
        pause_mode: Literal["abort", "in_place", "retract"] = "abort",
        request_timeout_s: float | None = None,
        max_attempts: int = 4,
        max_aborts: int = 64,
        keep_exports: int = 2,
        connect_timeout_s: float = 60.0,
        weight_version: int = 0,
    ):
        if not addresses:
            raise ValueError("SglangClient needs at least one server address (engine.servers=host:port,...)")
        if weight_update not in ("grpc", "http"):
            raise ValueError(f'weight_update must be "grpc" or "http", got {weight_update!r}')
        if weight_update == "http" and (not http_urls or len(http_urls) != len(addresses)):
            raise ValueError("weight_update='http' needs one http_url per server (SGLang's --port), in the same order")
        self._servers = [_Server(a, (http_urls or [None] * len(addresses))[i]) for i, a in enumerate(addresses)]
        self.weight_update = weight_update
        self.weight_dir = os.fspath(weight_dir) if weight_dir is not None else None
        self.graphdef = graphdef
        self.export_dtype = export_dtype
        self.pause_mode = pause_mode
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max_attempts
        self.max_aborts = max_aborts
        self.keep_exports = keep_exports
        self._version = int(weight_version)
        self._exports: list[str] = []
        self._rng = np.random.default_rng()
        self.retries = 0  # attempts that failed and were sent again (for metrics)
        self.push_failures: list[str] = []  # servers taken out of rotation by a failed update
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-client", daemon=True)
        self._thread.start()
        self._tasks: set[asyncio.Task] = set()
        self._call(self._setup())
        try:
            self._call(self._connect(connect_timeout_s))
        except BaseException:
            self.close()
            raise

    # -- public API -------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def live_servers(self) -> list[str]:
        return [s.address for s in self._servers if s.alive]

    def served_counts(self) -> dict[str, int]:
        """Results returned per server."""
        return {s.address: s.served for s in self._servers}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generates one completion on some live server; many calls may be in flight at once."""
        self._check_open()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._tracked(request), self._loop))

    def generate_many(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Blocking batch generation (results in request order)."""

        async def gather():
            return await asyncio.gather(*(self._tracked(r) for r in requests))

        self._check_open()
        return self._call(gather())

    def update_weights(self, params: Any, version: int) -> None:
        """Exports `params` (a model, or an nnx.State with `graphdef`) and pushes them to every live server."""
        from rltldr_jax.models.hf import save_pretrained

        if self.weight_dir is None:
            raise ValueError(
                "update_weights needs weight_dir: a directory every server can read (engine.weight_sync_dir)"
            )
        if isinstance(params, nnx.Module):
            model = params
        elif self.graphdef is not None:
            model = nnx.merge(self.graphdef, params)
        else:
            raise ValueError(
                "update_weights got an nnx.State but the client has no graphdef; pass graphdef= or the model"
            )
        path = os.path.join(self.weight_dir, f"v{int(version):06d}")
        tmp = path + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tmp, dtype=self.export_dtype)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        try:
            self.push_weights(path, version)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # no server uses it
            raise
        self._exports.append(path)
        while len(self._exports) > self.keep_exports:
            shutil.rmtree(self._exports.pop(0), ignore_errors=True)

    def ensure_weights(self, model: nnx.Module, version: int, *, assume: bool = False) -> str:
        """Makes every live server serve `model` as `version` before the first phase (fresh or resumed run).

        A server that reports a `weights_fingerprint` (launch/serve.py) proves its weights: equal to `model`'s at
        the server's `param_dtype` and labelled `version` means nothing to do. SGLang reports none: its weights
        are unknown. The weights are pushed (`update_weights`) when any server differs, or when any is unknown
        and `assume` is False; `assume=True` (config `engine.assume_initial_weights`) trusts unknown servers to
        have been started from the trainer's checkpoint, skipping a push of the whole model at start.

        Returns:
          "verified" (every server proved it), "assumed" (no push, some servers unknown) or "pushed".
        """
        from rltldr_jax.models.fingerprint import weights_fingerprint

        infos = self._call(self._model_infos())
        ours: dict[str | None, str] = {}
        differ, unknown = [], []
        for address, info in infos.items():
            served = str(info.get("weight_version", version))
            if served != str(version):
                differ.append(f"{address} serves weight_version {served}, the trainer is at {version}")
                continue
            fingerprint = info.get("weights_fingerprint")
            if not fingerprint:
                unknown.append(address)
                continue
            dtype = info.get("param_dtype") or None
            if dtype not in ours:
                ours[dtype] = weights_fingerprint(model, dtype)
            if fingerprint != ours[dtype]:
                differ.append(
                    f"{address} serves other weights than the trainer's (fingerprint {fingerprint} != {ours[dtype]})"
                )
        if not differ and (assume or not unknown):
            self._version = int(version)
            outcome = "assumed" if unknown else "verified"
            log.info(
                "generation servers serve the trainer's weights (version %d): %s",
                version,
                f"assumed for {unknown} (engine.assume_initial_weights)" if unknown else "fingerprints verified",
            )
            return outcome
        why = differ or [f"{a} reports no weights fingerprint (SGLang)" for a in unknown]
        log.warning("pushing the trainer's weights as version %d before the first phase: %s", version, "; ".join(why))
        self.update_weights(model, version)
        return "pushed"

    def push_weights(self, model_path: str | os.PathLike, version: int) -> None:
        """Loads an HF checkpoint directory (readable by the servers) on every live server as `version`."""
        self._call(self._push(os.fspath(model_path), int(version)))

    def close(self) -> None:
        """Ends every request still in flight with `ClientClosedError`, closes the channels and the loop."""

        async def shutdown():
            self._closing = True
            pending = [t for t in self._tasks if not t.done()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            # Let the callers' coroutines (generate / generate_many wrappers) see ClientClosedError and finish
            # before the loop stops; otherwise their futures would never resolve.
            callers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if callers:
                _, still = await asyncio.wait(callers, timeout=10)
                for t in still:
                    t.cancel()
            for s in self._servers:
                if s.channel is not None:
                    await s.channel.close()

        if self._loop.is_closed():
            return
        if self._loop.is_running():
            self._call(shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> SglangClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals (run on the client's loop) -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing or self._loop.is_closed():
            raise ClientClosedError("the SglangClient is closed")

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _setup(self) -> None:
        """Loop-bound primitives: a push lock and an event set whenever no push is running."""
        self._push_lock = asyncio.Lock()
        self._no_push = asyncio.Event()
        self._no_push.set()

    async def _tracked(self, request: GenerationRequest) -> GenerationResult:
        """`_generate` as a task that `close()` can cancel; a cancelled request raises ClientClosedError."""
        if self._closing:
            raise ClientClosedError("the SglangClient is closed")
        task = asyncio.ensure_future(self._generate(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closing:
                raise ClientClosedError(
                    f"the SglangClient was closed while request {request.request_id} was in flight"
                ) from None
            raise

    async def _connect(self, timeout_s: float) -> None:
        for s in self._servers:
            s.channel = grpc.aio.insecure_channel(
                s.address,
                options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
            )
            s.stub = pb.Stub(s.channel)
        healthy = await asyncio.gather(*(self._healthy(s, timeout_s, wait=True) for s in self._servers))
        down = [s.address for s, ok in zip(self._servers, healthy, strict=True) if not ok]
        if down:
            raise NoServerError(
                f"generation servers not reachable or unhealthy after {timeout_s:.0f} s: {down}; start them with "
                "launch/serve.py or launch/serve_sglang.py and check engine.servers"
            )

    async def _healthy(self, server: _Server, timeout_s: float, wait: bool = False) -> bool:
        try:
            response = await server.stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=wait)
            return bool(response.healthy)
        except grpc.aio.AioRpcError:
            return False

    def _pick(self, avoid: set[str]) -> _Server:
        live = [s for s in self._servers if s.alive]
        if not live:
            raise NoServerError(f"every generation server is dead: {[s.address for s in self._servers]}")
        fresh = [s for s in live if s.address not in avoid] or live
        return min(fresh, key=lambda s: s.outstanding)

    async def _mark_if_dead(self, server: _Server, error: BaseException) -> None:
        if server.alive and not await self._healthy(server, timeout_s=5.0):
            server.alive = False
            log.warning("generation server %s is dead (%s); %d left", server.address, error, len(self.live_servers))

    def _message(self, request: GenerationRequest, seed: int, rid: str) -> Any:
        p = request.params
        sampling = pb.SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            max_new_tokens=p.max_new_tokens,
            stop_token_ids=p.stop_token_ids,  # ignore_eos stays unset: in SGLang it would disable these too
            seed=seed,
        )
        return pb.GenerateRequest(
            input_ids=request.prompt_ids, sampling_params=sampling, stream=False, return_logprob=True, rid=rid
        )

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        seed = request.params.seed if request.params.seed is not None else int(self._rng.integers(0, 2**32))
        tried: set[str] = set()
        errors: list[str] = []
        failures = aborts = 0
        while True:
            await self._no_push.wait()  # a push in progress: its pause would only abort this attempt
            submitted_version = self._version
            server = self._pick(tried)
            tried.add(server.address)
            rid = f"{request.request_id}#{failures + aborts}"
            server.outstanding += 1
            try:
                final = None
                async for response in server.stub.Generate(
                    self._message(request, seed, rid), timeout=self.request_timeout_s
                ):
                    final = response
                if final is None or not final.finished:
                    raise _Unfinished(f"the stream from {server.address} ended before the request finished")
                result = parse_response(final, request.request_id)
            except (grpc.aio.AioRpcError, _Unfinished) as e:
                code = e.code() if isinstance(e, grpc.aio.AioRpcError) else grpc.StatusCode.UNAVAILABLE
                if code not in RETRYABLE:
                    raise ValueError(
                        f"request {request.request_id} rejected by {server.address}: {e.details()}"
                    ) from None
                errors.append(
                    f"{server.address}: {code.name} {e.details() if isinstance(e, grpc.aio.AioRpcError) else e}"
                )
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:  # make sure the old attempt stops generating
                    await self._abort(server, rid)
                await self._mark_if_dead(server, e)
                self.retries += 1
                failures += 1
                if failures >= self.max_attempts:
                    raise RuntimeError(f"request {request.request_id} failed {failures} times: {errors}") from None
                continue
            finally:
                server.outstanding -= 1
            if result.finish_reason == "abort":  # paused with mode=abort for a push, or the server is shutting down
                self.retries += 1
                aborts += 1
                tried.discard(server.address)  # the server may be fine: it was only paused
                if aborts >= self.max_aborts:
                    raise RuntimeError(
                        f"request {request.request_id} was aborted by the servers {aborts} times: {errors}"
                    )
                await asyncio.sleep(0.01)
                continue
            if result.weight_version < submitted_version:
                raise StaleWeightsError(
                    f"{server.address} answered request {request.request_id} with weight version "
                    f"{result.weight_version} after version {submitted_version} was pushed: "
                    "its update did not take effect"
                )
            server.served += 1
            return result

    async def _abort(self, server: _Server, rid: str) -> None:
        try:
            await server.stub.Abort(pb.AbortRequest(rid=rid), timeout=5.0)
        except grpc.aio.AioRpcError:
            pass

    async def _model_infos(self) -> dict[str, dict[str, Any]]:
        """Every live server's `GetModelInfo` JSON, by address."""

        async def one(server: _Server) -> dict[str, Any]:
            response = await server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60.0)
            return json.loads(response.json_info or "{}")

        live = [s for s in self._servers if s.alive]
        if not live:
            raise NoServerError("no live generation server")
        return dict(zip((s.address for s in live), await asyncio.gather(*(one(s) for s in live)), strict=True))

    async def _push(self, model_path: str, version: int) -> None:
        async with self._push_lock:
            live = [s for s in self._servers if s.alive]
            if not live:
                raise NoServerError("no live generation server to push weights to")
            self._no_push.clear()
            try:
                outcomes = await asyncio.gather(
                    *(self._push_one(s, model_path, version) for s in live), return_exceptions=True
                )
            finally:
                self._no_push.set()
            failed = []
            for server, outcome in zip(live, outcomes, strict=True):
                if isinstance(outcome, grpc.aio.AioRpcError | ConnectionError):  # unreachable: dead servers drop out
                    await self._mark_if_dead(server, outcome)
                if isinstance(outcome, BaseException) and server.alive:
                    failed.append((server, f"{server.address}: {outcome}"))
            if len(failed) == len(live):
                raise RuntimeError(
                    f"weight push of {model_path} (version {version}) failed on every server: {[f for _, f in failed]}"
                )
            for server, reason in failed:  # the others have the new weights: a server with old ones must not serve
                server.alive = False
                self.push_failures.append(reason)
                log.warning("taking %s out of rotation: its weight update failed (%s)", server.address, reason)
            if not any(s.alive for s in self._servers):
                raise NoServerError(f"weight push of {model_path} left no live server")
            self._version = version
            log.info("pushed %s as version %d to %d servers", model_path, version, len(self.live_servers))

    async def _push_one(self, server: _Server, model_path: str, version: int) -> None:
        """pause → update → continue on one server; continue is always attempted, and a server that cannot be
        continued is marked dead (a paused server would pass health checks but never answer)."""
        error: BaseException | None = None
        try:
            await server.stub.PauseGeneration(pb.PauseGenerationRequest(mode=self.pause_mode), timeout=600.0)
            if self.weight_update == "grpc":
                response = await server.stub.UpdateWeightsFromDisk(
                    pb.UpdateWeightsRequest(model_path=model_path, weight_version=str(version)), timeout=3600.0
                )
                if not response.success:
                    raise RuntimeError(f"update refused: {response.message}")
                info = json.loads(
                    (await server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60.0)).json_info or "{}"
                )
                if str(info.get("weight_version", version)) != str(version):
                    raise RuntimeError(
                        f"the server reports weight_version {info.get('weight_version')!r} "
                        f"after loading version {version}: "
                        "it ignores the gRPC weight_version field (SGLang does); "
                        "use weight_update='http' with its HTTP URLs"
                    )
            else:
                body = {"model_path": model_path, "weight_version": str(version), "flush_cache": True}
                ok, message = await asyncio.to_thread(_post_json, f"{server.http_url}/update_weights_from_disk", body)
                if not ok:
                    raise RuntimeError(f"update refused: {message}")
        except BaseException as e:  # noqa: BLE001 — re-raised below, after continuing
            error = e
        for attempt in range(3):
            try:
                await server.stub.ContinueGeneration(pb.ContinueGenerationRequest(), timeout=60.0)
                break
            except grpc.aio.AioRpcError as e:
                if attempt == 2:
                    server.alive = False
                    log.warning(
                        "%s could not be continued after a push and is dead to this client: %s", server.address, e
                    )
                    error = error or e
        if error is not None:
            raise error


class _Unfinished(Exception):
    """A Generate stream that ended without a finished response."""


def _post_json(url: str, body: dict[str, Any], timeout_s: float = 3600.0) -> tuple[bool, str]:
    """POSTs JSON; returns SGLang's (success, message)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}: {e.read().decode(errors='replace')[:500]}"
    except urllib.error.URLError as e:
        raise ConnectionError(f"{url}: {e.reason}") from None
    return bool(reply.get("success", False)), str(reply.get("message", reply))
