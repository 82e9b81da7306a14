"""The SGLang client: a GenerationEngine over many generation servers speaking SGLang's native gRPC service.

Servers are SGLang (`sglang serve --grpc-port N --skip-tokenizer-init`, see launch/serve_sglang.py) or
`launch/serve.py` (a JaxEngine behind the same service). One client spreads the requests of many concurrent
episodes over them:

- Routing: each request goes to the live server with the fewest outstanding requests.
- Failures: a request whose server fails (connection lost, killed, timed out) is sent again to another live
  server with the same seed; a server that then fails a health check leaves the rotation. A request the server
  aborted (a weight push pauses with mode "abort") waits for the push to end and is sent again; such retries do
  not use up `max_attempts`. A request returns exactly one result: a retry only happens when no result came
  back, a timed-out attempt is aborted on its server first, and every attempt carries its own id on the wire
  (`{request_id}#{n}`), so a late abort of one attempt cannot hit the next.
- Deadlines and health checks: every attempt has a deadline (`request_timeout_s`, default
  `DEFAULT_REQUEST_TIMEOUT_S` = 1 h: room for the longest completions on a loaded server; None = none). A server
  that stops answering (SIGSTOP, a hung host) is found sooner: every live server is health-checked each
  `health_interval_s`; after `HEALTH_FAILURES_TO_DROP` failed checks in a row it leaves the rotation, and the
  attempts in flight on it are sent to other servers at once.
- Return to rotation: a server out of rotation (failed checks, failed attempts, a failed weight update) is
  health-checked in the background with exponential backoff (from `REVIVE_FIRST_DELAY_S` up to
  `health_interval_s`). When healthy again it must serve the current weights before it rejoins: the same version
  label and a weights fingerprint the client knows for it (the trainer's, from `ensure_weights`, or the one the
  servers reported after the last push, or its own from before it left: a paused server); otherwise the current
  version's checkpoint (the last push's directory) is pushed to it first, as `ensure_weights` does at start. A
  server restarted on the same port with other weights is thus updated; one that cannot be (no checkpoint of the
  current version on disk) stays out, with a warning. While no server is in rotation a request waits up to
  `no_server_wait_s` for one to return, then `generate` raises `NoServerError`.
- Access: servers started with an API key (SGLang's `--api-key`; launch/serve.py's `--api_key`) get it with every
  RPC as `authorization: Bearer KEY` metadata, and with every HTTP push as that header. The key comes from
  `$RLTLDR_ENGINE_API_KEY` (`sglang_proto.API_KEY_ENV`) unless given: never from the run's config, which is saved
  and logged; the client never logs it.
- Weight push (`update_weights`; the wire protocol and the export are `weight_push.WeightPusher`'s, which servers
  take part and what follows is this client's): the params are exported as HF safetensors (`save_pretrained`) into
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
- LoRA (`takes_adapters`, when every server has an HTTP URL): `update_weights` of a model with adapters
  (`models.lora`) exports only them, as a PEFT directory `{weight_dir}/a{version:06d}`, and loads them on every live
  server as the adapter `policy-v{version:06d}` (`POST /load_lora_adapter`, the one it replaces unloaded); later
  requests name it (`lora_path`), and their results carry that version (the servers refuse a request naming an
  adapter they do not hold, so no stale sample can pass). `ensure_weights` of such a model makes the servers serve
  its base (as below), then pushes its adapters. A server returning to rotation changed gets the base (the last full
  push, kept on disk for this) and the current adapter again.
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
import threading
from collections.abc import Sequence
from typing import Any, Literal

import grpc
import numpy as np
from flax import nnx

from rltldr_jax.engines import sglang_proto as pb
from rltldr_jax.engines.engine import GenerationEngine, GenerationRequest, GenerationResult
from rltldr_jax.engines.weight_push import WeightPusher, adapter_name

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


#: Default per-attempt deadline of a Generate call, seconds (config `engine.request_timeout_s`).
DEFAULT_REQUEST_TIMEOUT_S = 3600.0
#: Failed health checks in a row that take a live server out of rotation (one slow answer under load is not enough).
HEALTH_FAILURES_TO_DROP = 2
#: First wait before a server out of rotation is checked again; doubles up to `health_interval_s`.
REVIVE_FIRST_DELAY_S = 0.5


class NoServerError(RuntimeError):
    """No generation server is in rotation (every one is dead or failing its health checks)."""


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
    lost: Any = None  # asyncio.Future resolved (with the reason) when the server leaves the rotation
    failed_checks: int = 0  # failed health checks in a row while live
    # What it reported when last known good (at connect, after a push or a check), and the client's version then.
    version: str | None = None
    fingerprint: str | None = None  # weights fingerprint (launch/serve.py; SGLang reports none)
    client_version: int | None = None
    reviving: Any = None  # the background task checking it while out of rotation
    returns: int = 0  # times it came back into rotation (for tests and logs)


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


class SglangClient(GenerationEngine):
    """GenerationEngine over SGLang-compatible gRPC servers.

    Args:
      addresses: "host:port" of each server's gRPC listener.
      http_urls: SGLang's HTTP base URL of each server (same order), needed for `weight_update="http"`.
      weight_update: "grpc" (launch/serve.py, or SGLang without version labels) or "http" (SGLang).
      weight_dir: directory shared with the servers for weight pushes (required for `update_weights`).
      graphdef: the model's graph definition, when `update_weights` is given an `nnx.State`.
      export_dtype: dtype of the pushed safetensors (servers cast to their own dtype); None keeps the params'.
      pause_mode: PauseGeneration mode around a push. "abort" (default) makes in-flight requests come back
        aborted, and they are retried on the new weights, so no completion mixes two versions.
      request_timeout_s: per-attempt deadline of a Generate call (None or 0: none; stopped servers are still
        found by the health checks).
      max_attempts: failed tries (transport errors, timeouts) per request before `generate` gives up.
      max_aborts: server-side aborts (e.g. by pushes) tolerated per request before `generate` gives up.
      keep_exports: pushed checkpoint directories kept on disk (older ones are deleted).
      connect_timeout_s: how long to wait for every server's health check at start.
      weight_version: the version the servers serve at start.
      api_key: the servers' API key; None reads `$RLTLDR_ENGINE_API_KEY` (unset: no key).
      health_interval_s: period of the live servers' health checks, and the longest wait between checks of a server
        out of rotation.
      health_timeout_s: a health check not answered within this fails.
      no_server_wait_s: how long a request waits for a server to return to rotation when none is in it.
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
        request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
        max_attempts: int = 4,
        max_aborts: int = 64,
        keep_exports: int = 2,
        connect_timeout_s: float = 60.0,
        weight_version: int = 0,
        api_key: str | None = None,
        health_interval_s: float = 10.0,
        health_timeout_s: float = 10.0,
        no_server_wait_s: float = 60.0,
    ):
        if not addresses:
            raise ValueError("SglangClient needs at least one server address (engine.servers=host:port,...)")
        if weight_update not in ("grpc", "http"):
            raise ValueError(f'weight_update must be "grpc" or "http", got {weight_update!r}')
        if weight_update == "http" and (not http_urls or len(http_urls) != len(addresses)):
            raise ValueError("weight_update='http' needs one http_url per server (SGLang's --port), in the same order")
        self._servers = [_Server(a, (http_urls or [None] * len(addresses))[i]) for i, a in enumerate(addresses)]
        self.request_timeout_s = request_timeout_s or None
        self.health_interval_s = float(health_interval_s)
        self.health_timeout_s = float(health_timeout_s)
        self.no_server_wait_s = float(no_server_wait_s)
        self._api_key = api_key if api_key is not None else (os.environ.get(pb.API_KEY_ENV) or None)
        # What a push does on the wire (export, pause → update → continue on one server); this class decides where.
        self.pusher = WeightPusher(
            weight_update=weight_update,
            weight_dir=weight_dir,
            graphdef=graphdef,
            export_dtype=export_dtype,
            pause_mode=pause_mode,
            keep_exports=keep_exports,
            api_key=self._api_key,
        )
        self.max_attempts = max_attempts
        self.max_aborts = max_aborts
        self._version = int(weight_version)
        # What serving the current version means, for a server that returns to rotation: the weights fingerprint
        # per server param dtype (None: the trainer's own), and the checkpoint directory to push to it otherwise.
        self._fingerprints: dict[str | None, str] = {}
        self._checkpoint: str | None = None
        self._checkpoint_is_adapter = False
        self._base_checkpoint: str | None = None  # the last full push: what the current adapter sits on
        self._adapter: str | None = None  # the LoRA adapter requests sample from (`lora_path`), if any
        self._background: set[asyncio.Task] = set()
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
        self._call(self._start_monitor())

    # -- public API -------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def takes_adapters(self) -> bool:  # type: ignore[override]
        """LoRA adapters are pushed alone when every server has an HTTP URL (`/load_lora_adapter` is HTTP)."""
        return all(s.http_url for s in self._servers)

    @property
    def adapter(self) -> str | None:
        """The name of the LoRA adapter requests sample from (None: the servers' weights alone)."""
        return self._adapter

    @property
    def weight_update(self) -> Literal["grpc", "http"]:
        """How servers load pushed weights: "grpc" (launch/serve.py) or "http" (SGLang)."""
        return self.pusher.weight_update

    @property
    def weight_dir(self) -> str | None:
        """The directory shared with the servers for weight pushes."""
        return self.pusher.weight_dir

    @property
    def live_servers(self) -> list[str]:
        return [s.address for s in self._servers if s.alive]

    def served_counts(self) -> dict[str, int]:
        """Results returned per server."""
        return {s.address: s.served for s in self._servers}

    def outstanding_counts(self) -> dict[str, int]:
        """Requests each server holds now (sent, not yet answered)."""
        return {s.address: s.outstanding for s in self._servers}

    def returns(self) -> dict[str, int]:
        """Times each server came back into rotation after leaving it."""
        return {s.address: s.returns for s in self._servers}

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
        """Exports `params` (a model, or an nnx.State with `graphdef`) and pushes them to every live server; a model
        with LoRA adapters pushes only its adapters (module doc)."""
        from rltldr_jax.models.lora import has_adapters

        if isinstance(params, nnx.Module) and has_adapters(params):
            if not self.takes_adapters:
                raise ValueError(
                    "pushing LoRA adapters needs every server's HTTP URL (engine.http_servers); or push the merged "
                    "model (models.lora.merged)"
                )
            path = self.pusher.export_adapter(params, version)
            try:
                self._call(self._push(path, int(version), adapter=True))
            except BaseException:
                self.pusher.discard(path)
                raise
            self.pusher.retain(path, protect=self._base_checkpoint)
            return
        path = self.pusher.export(params, version)
        try:
            self.push_weights(path, version)
        except BaseException:
            self.pusher.discard(path)  # no server uses it
            raise
        self.pusher.retain(path, protect=path)

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
        from rltldr_jax.models.lora import has_adapters, without_adapters

        if has_adapters(model):  # the base first (verified or pushed), then the adapters on top
            outcome = self.ensure_weights(without_adapters(model), version, assume=assume)
            self.update_weights(model, version)
            return outcome
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
            self._fingerprints = dict(ours)
            paths = {str(info.get("model_path") or "") for info in infos.values()}
            if len(paths) == 1 and os.path.isdir(path := paths.pop()):  # (what a LoRA adapter sits on: its base)
                self._base_checkpoint = path
            for server in self._servers:
                if server.address in infos:
                    self._record(server, infos[server.address])
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
            background = [t for t in self._background if not t.done()]
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
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
            s.stub = pb.Stub(s.channel, api_key=self._api_key)
            s.lost = asyncio.get_running_loop().create_future()
        problems = await asyncio.gather(*(self._check(s, timeout_s, wait=True) for s in self._servers))
        down = {s.address: p for s, p in zip(self._servers, problems, strict=True) if p}
        if down:
            hint = (
                f"; set {pb.API_KEY_ENV} to the servers' API key"
                if any("UNAUTHENTICATED" in p for p in down.values())
                else ""
            )
            raise NoServerError(
                f"generation servers not reachable or unhealthy after {timeout_s:.0f} s: {down}; start them with "
                f"launch/serve.py or launch/serve_sglang.py and check engine.servers{hint}"
            )
        infos = await asyncio.gather(*(self._model_info(s) for s in self._servers), return_exceptions=True)
        for s, info in zip(self._servers, infos, strict=True):
            if isinstance(info, dict):
                self._record(s, info)

    def _record(self, server: _Server, info: dict[str, Any]) -> None:
        """Remembers what a server in good standing serves (its `GetModelInfo`), to recognise it if it leaves the
        rotation and comes back unchanged (paused, not restarted)."""
        server.version = str(info.get("weight_version", ""))
        server.fingerprint = info.get("weights_fingerprint") or None
        server.client_version = self._version

    async def _check(self, server: _Server, timeout_s: float, wait: bool = False) -> str | None:
        """One health check: None if healthy, else what went wrong."""
        try:
            response = await server.stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=wait)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"no answer within {timeout_s:g} s"
            return f"{e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001 — whatever else went wrong, the server is not known to be healthy
            return f"{type(e).__name__}: {e}"
        return None if response.healthy else "reports unhealthy"

    async def _model_info(self, server: _Server) -> dict[str, Any]:
        response = await server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60.0)
        return json.loads(response.json_info or "{}")

    async def _pick(self, avoid: set[str]) -> _Server:
        """The live server with the fewest outstanding requests, preferring those not in `avoid`; waits up to
        `no_server_wait_s` for one to return when none is live."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.no_server_wait_s
        while not (live := [s for s in self._servers if s.alive]):
            if loop.time() >= give_up:
                raise NoServerError(
                    f"no generation server in rotation for {self.no_server_wait_s:g} s: "
                    f"{[s.address for s in self._servers]} are dead or fail their health checks"
                )
            await asyncio.sleep(0.05)
        fresh = [s for s in live if s.address not in avoid] or live
        return min(fresh, key=lambda s: s.outstanding)

    async def _mark_if_dead(self, server: _Server, error: BaseException) -> None:
        if server.alive and await self._check(server, self.health_timeout_s):
            self._take_out(server, f"{error}")

    def _take_out(self, server: _Server, reason: str) -> None:
        """Takes `server` out of rotation (its attempts in flight end and are sent elsewhere) and starts checking it
        in the background until it can return."""
        if server.alive:
            server.alive = False
            log.warning(
                "generation server %s leaves the rotation (%s); %d left", server.address, reason, len(self.live_servers)
            )
        if not server.lost.done():
            server.lost.set_result(reason)
        if not self._closing and (server.reviving is None or server.reviving.done()):
            server.reviving = self._spawn(self._revive(server))

    def _spawn(self, coroutine) -> asyncio.Task:
        """`coroutine` as a background task on the client's loop (call it there) that `close()` cancels."""
        task = self._loop.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _start_monitor(self) -> None:
        self._spawn(self._monitor())

    async def _monitor(self) -> None:
        """Health-checks every live server each `health_interval_s`; `HEALTH_FAILURES_TO_DROP` failures in a row take
        it out of rotation. Skipped while a weight push runs (the push pauses servers and checks them itself)."""
        while not self._closing:
            await asyncio.sleep(self.health_interval_s)
            if not self._no_push.is_set():
                continue
            live = [s for s in self._servers if s.alive]
            problems = await asyncio.gather(*(self._check(s, self.health_timeout_s) for s in live))
            for server, problem in zip(live, problems, strict=True):
                if not problem:
                    server.failed_checks = 0
                    continue
                server.failed_checks += 1
                if server.failed_checks >= HEALTH_FAILURES_TO_DROP and server.alive and self._no_push.is_set():
                    self._take_out(server, f"{server.failed_checks} health checks failed, the last: {problem}")

    async def _revive(self, server: _Server) -> None:
        """Checks a server out of rotation with exponential backoff until it is healthy and serves the current
        weights (pushing them if needed), then returns it to rotation."""
        delay, told = REVIVE_FIRST_DELAY_S, None
        while not self._closing:
            await asyncio.sleep(delay)
            delay = min(2 * delay, max(self.health_interval_s, REVIVE_FIRST_DELAY_S))
            if await self._check(server, self.health_timeout_s):
                continue
            async with self._push_lock:  # the current version cannot change under it
                try:
                    how = await self._bring_up_to_date(server)
                except Exception as e:  # noqa: BLE001 — it stays out and is checked again
                    if str(e) != told:
                        log.warning(
                            "generation server %s answers again but stays out of rotation: %s", server.address, e
                        )
                        told = str(e)
                    continue
                server.failed_checks = 0
                server.lost = asyncio.get_running_loop().create_future()
                server.alive = True
                server.returns += 1
            log.warning("generation server %s is back in rotation (%s)", server.address, how)
            return

    async def _bring_up_to_date(self, server: _Server) -> str:
        """Makes a healthy server out of rotation serve the current weights; returns how, or raises why it cannot.

        It may rejoin as it is when it reports what it served when it left, and no push happened since (a paused
        server; a server without a fingerprint, SGLang, is trusted on its version label, as at start), or the current
        version with the weights fingerprint the current weights have. Otherwise the current version's checkpoint is
        pushed to it.
        """
        info = await self._model_info(server)
        served = str(info.get("weight_version", ""))
        fingerprint = info.get("weights_fingerprint") or None
        if (served, fingerprint, self._version) == (server.version, server.fingerprint, server.client_version):
            return f"unchanged since it left: version {served}" + (", same weights fingerprint" if fingerprint else "")
        expected = self._fingerprints.get(info.get("param_dtype") or None)
        if served == str(self._version) and fingerprint is not None and fingerprint == expected:
            self._record(server, info)
            return f"version {served}, weights fingerprint verified"
        why = f"version {served or '?'}" + (f" with weights fingerprint {fingerprint}" if fingerprint else "")
        if self._checkpoint is None:
            raise RuntimeError(
                f"it serves {why}, not the current version {self._version}'s weights, and no checkpoint of them is on "
                "disk to push (restart it from the trainer's current weights)"
            )
        if self._checkpoint_is_adapter:  # (it may have restarted from other weights: the base first)
            if self._base_checkpoint is None:
                raise RuntimeError(
                    f"it serves {why}, and the base the current LoRA adapter sits on was never pushed, so it cannot "
                    "be restored (restart it from the trainer's base weights)"
                )
            await self._push_one(server, self._base_checkpoint, self._version)
        info = await self._push_one(
            server, self._checkpoint, self._version, adapter=self._checkpoint_is_adapter, reload=True
        )
        self._record(server, info or {"weight_version": str(self._version)})
        return f"it served {why}: pushed {self._checkpoint} as version {self._version}"

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
        adapter = {"lora_path": self._adapter} if self._adapter else {}
        return pb.GenerateRequest(
            input_ids=request.prompt_ids,
            sampling_params=sampling,
            stream=False,
            return_logprob=True,
            rid=rid,
            **adapter,
        )

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        seed = request.params.seed if request.params.seed is not None else int(self._rng.integers(0, 2**32))
        tried: set[str] = set()
        errors: list[str] = []
        failures = aborts = 0
        while True:
            await self._no_push.wait()  # a push in progress: its pause would only abort this attempt
            server = await self._pick(tried)
            submitted_version = self._version
            tried.add(server.address)
            rid = f"{request.request_id}#{failures + aborts}"
            server.outstanding += 1
            try:
                message = self._message(request, seed, rid)
                final = await self._attempt(server, message)
                if final is None or not final.finished:
                    raise _Unfinished(f"the stream from {server.address} ended before the request finished")
                result = parse_response(final, request.request_id)
                if message.HasField("lora_path") and result.finish_reason != "abort":
                    # (the server sampled from the adapter this request named: the version it was pushed as)
                    result = dataclasses.replace(result, weight_version=submitted_version)
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

    async def _attempt(self, server: _Server, message: Any) -> Any:
        """Sends one Generate to `server`; its final response (None if none came). Ends with `_Unfinished` as soon as
        the server leaves the rotation (a failed health check), so the request is sent elsewhere at once."""

        async def stream() -> Any:
            final = None
            async for response in server.stub.Generate(message, timeout=self.request_timeout_s):
                final = response
            return final

        attempt, lost = asyncio.ensure_future(stream()), server.lost
        try:
            await asyncio.wait({attempt, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not attempt.done():  # the server left the rotation, or this request is cancelled (close)
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
        if attempt.cancelled():
            raise _Unfinished(f"{server.address} left the rotation ({lost.result()})")
        return attempt.result()

    async def _abort(self, server: _Server, rid: str) -> None:
        try:
            await server.stub.Abort(pb.AbortRequest(rid=rid), timeout=5.0)
        except grpc.aio.AioRpcError:
            pass

    async def _model_infos(self) -> dict[str, dict[str, Any]]:
        """Every live server's `GetModelInfo` JSON, by address."""
        live = [s for s in self._servers if s.alive]
        if not live:
            raise NoServerError("no live generation server")
        infos = await asyncio.gather(*(self._model_info(s) for s in live))
        return dict(zip((s.address for s in live), infos, strict=True))

    async def _push(self, model_path: str, version: int, *, adapter: bool = False) -> None:
        async with self._push_lock:
            live = [s for s in self._servers if s.alive]
            if not live:
                raise NoServerError("no live generation server to push weights to")
            self._no_push.clear()
            try:
                outcomes = await asyncio.gather(
                    *(self._push_one(s, model_path, version, adapter=adapter) for s in live), return_exceptions=True
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
                self.push_failures.append(reason)
                self._take_out(server, f"its weight update failed ({reason})")
            if not any(s.alive for s in self._servers):
                raise NoServerError(f"weight push of {model_path} left no live server")
            # Servers out of rotation get this checkpoint when they return (they wait for the push lock).
            self._version, self._checkpoint, self._fingerprints = version, model_path, {}
            self._checkpoint_is_adapter = adapter
            if not adapter:
                self._base_checkpoint = model_path
            self._adapter = adapter_name(version) if adapter else None  # (a full push: the servers' own weights)
            for server, outcome in zip(live, outcomes, strict=True):
                if server.alive and not isinstance(outcome, BaseException):
                    info = outcome or {"weight_version": str(version)}  # None: an HTTP push (SGLang)
                    self._record(server, info)
                    if server.fingerprint:
                        self._fingerprints.setdefault(info.get("param_dtype") or None, server.fingerprint)
            log.info("pushed %s as version %d to %d servers", model_path, version, len(self.live_servers))

    async def _push_one(
        self, server: _Server, model_path: str, version: int, *, adapter: bool = False, reload: bool = False
    ) -> dict[str, Any] | None:
        """`WeightPusher.push_one` on one server (pause → update → continue), or with `adapter` its
        `push_adapter_one` (the adapter directory `model_path` as `adapter_name(version)`); a server that cannot be
        continued leaves the rotation. Returns the server's `GetModelInfo` after a gRPC update (None over HTTP)."""
        if adapter:
            await self.pusher.push_adapter_one(
                server.stub,
                server.http_url,
                model_path,
                adapter_name(version),
                None if reload else self._adapter,
                lambda reason: self._take_out(server, reason),
                reload=reload,
            )
            return None
        return await self.pusher.push_one(
            server.stub,
            server.http_url,
            model_path,
            version,
            lambda: self._model_info(server),
            lambda reason: self._take_out(server, reason),
        )


class _Unfinished(Exception):
    """A Generate stream that ended without a finished response."""
