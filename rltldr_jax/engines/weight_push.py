"""How new weights reach one generation server: the SGLang-specific half of `SglangClient`'s weight push.

`SglangClient` routes requests over many servers and decides which of them take part in a push (its lock, the
rotation, the version every later result must report); a `WeightPusher` does what a push means on the wire:

- `export(params, version)`: the params as HF safetensors (`save_pretrained`) in `{weight_dir}/v{version:06d}`,
  written under a temporary name and renamed, so a server never reads a half-written checkpoint; `retain(path)`
  keeps the last `keep_exports` of them on disk.
- `push_one(...)`: on one server, PauseGeneration → update → ContinueGeneration. The update is gRPC
  `UpdateWeightsFromDisk` with the `weight_version` extension field that launch/serve.py honours
  (`weight_update="grpc"`; a server whose `GetModelInfo` does not show the version afterwards fails with advice),
  or SGLang's HTTP `POST /update_weights_from_disk {"model_path", "weight_version"}` (`weight_update="http"`:
  SGLang's native gRPC message has no version field). Continue is always attempted.
- LoRA adapters: `export_adapter(model, version)` writes a policy's adapters as a PEFT directory
  `{weight_dir}/a{version:06d}` (`models.lora.save_adapter`: megabytes, not the model), and `push_adapter_one` loads
  it on one server as the adapter named `adapter_name(version)`: pause → HTTP `POST /load_lora_adapter
  {"lora_name", "lora_path"}` (SGLang's; launch/serve.py offers it too) → continue, then `POST
  /unload_lora_adapter` of the adapter it replaces (best effort). Requests name the adapter they sample from.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import grpc
from flax import nnx

from rltldr_jax.engines import sglang_proto as pb

WeightUpdate = Literal["grpc", "http"]
PauseMode = Literal["abort", "in_place", "retract"]


class WeightPusher:
    """Exports weights to a shared directory and loads them on one server at a time (module doc).

    Args:
      weight_update: "grpc" (launch/serve.py, or SGLang without version labels) or "http" (SGLang).
      weight_dir: directory shared with the servers (required for `export`).
      graphdef: the model's graph definition, when `export` is given an `nnx.State`.
      export_dtype: dtype of the exported safetensors (servers cast to their own dtype); None keeps the params'.
      pause_mode: PauseGeneration mode around an update ("abort": in-flight requests come back aborted).
      keep_exports: exported checkpoint directories kept on disk (older ones are deleted).
      api_key: sent as `Authorization: Bearer KEY` with HTTP updates (gRPC stubs carry it themselves).
    """

    def __init__(
        self,
        *,
        weight_update: WeightUpdate = "grpc",
        weight_dir: str | os.PathLike | None = None,
        graphdef: Any = None,
        export_dtype: Any = None,
        pause_mode: PauseMode = "abort",
        keep_exports: int = 2,
        api_key: str | None = None,
    ):
        if weight_update not in ("grpc", "http"):
            raise ValueError(f'weight_update must be "grpc" or "http", got {weight_update!r}')
        self.weight_update = weight_update
        self.weight_dir = os.fspath(weight_dir) if weight_dir is not None else None
        self.graphdef = graphdef
        self.export_dtype = export_dtype
        self.pause_mode = pause_mode
        self.keep_exports = keep_exports
        self._api_key = api_key
        self._exports: list[str] = []

    def export(self, params: Any, version: int) -> str:
        """Writes `params` (a model, or an nnx.State with `graphdef`) as the HF checkpoint of `version`; its path."""
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
        return path

    def export_adapter(self, model: Any, version: int) -> str:
        """Writes the LoRA adapters of `model` as the PEFT adapter directory of `version`; its path."""
        from rltldr_jax.models.lora import save_adapter

        if self.weight_dir is None:
            raise ValueError(
                "update_weights needs weight_dir: a directory every server can read (engine.weight_sync_dir)"
            )
        path = os.path.join(self.weight_dir, f"a{int(version):06d}")
        save_adapter(model, path)  # (written beside, then renamed into place)
        return path

    async def push_adapter_one(
        self,
        stub: Any,
        http_url: str | None,
        adapter_path: str,
        name: str,
        replaces: str | None,
        on_stuck: Callable[[str], None],
        *,
        reload: bool = False,
    ) -> None:
        """pause → load the adapter in `adapter_path` as `name` → continue on one server (SGLang's HTTP URL
        `http_url`), then unload `replaces` (best effort: SGLang keeps adapters until unloaded, launch/serve.py holds
        one); raises the load's error after continuing. `reload`: unload `name` first (best effort), for a server that
        may hold an older adapter of that name (one returning to rotation)."""
        if not http_url:
            raise ValueError("pushing LoRA adapters needs the servers' HTTP URLs (engine.http_servers)")
        error: BaseException | None = None
        try:
            await stub.PauseGeneration(pb.PauseGenerationRequest(mode=self.pause_mode), timeout=600.0)
            if reload:
                await self._post(f"{http_url}/unload_lora_adapter", {"lora_name": name})
            ok, message = await self._post(
                f"{http_url}/load_lora_adapter", {"lora_name": name, "lora_path": adapter_path}
            )
            if not ok:
                raise RuntimeError(f"loading LoRA adapter {name} refused: {message}")
        except BaseException as e:  # noqa: BLE001 — re-raised below, after continuing
            error = e
        await self._continue(stub, on_stuck)
        if error is not None:
            raise error
        if replaces and replaces != name:
            await self._post(f"{http_url}/unload_lora_adapter", {"lora_name": replaces})

    async def _post(self, url: str, body: dict[str, Any]) -> tuple[bool, str]:
        """`post_json` with the servers' API key, off the event loop."""
        return await asyncio.to_thread(post_json, url, body, api_key=self._api_key)

    async def _continue(self, stub: Any, on_stuck: Callable[[str], None]) -> None:
        """ContinueGeneration, three tries; then `on_stuck(reason)` (a paused server would pass health checks but
        never answer) and the error is raised."""
        for attempt in range(3):
            try:
                await stub.ContinueGeneration(pb.ContinueGenerationRequest(), timeout=60.0)
                return
            except grpc.aio.AioRpcError as e:
                if attempt == 2:
                    on_stuck(f"it could not be continued after a push: {e.code().name}")
                    raise

    def retain(self, path: str, *, protect: str | None = None) -> None:
        """Keeps an exported checkpoint that servers now use; deletes the oldest beyond `keep_exports`, except
        `protect` (the base a LoRA adapter is pushed onto: a server returning to rotation needs it again)."""
        self._exports.append(path)
        old = [p for p in self._exports if p != protect]
        while len(old) > self.keep_exports:
            gone = old.pop(0)
            self._exports.remove(gone)
            shutil.rmtree(gone, ignore_errors=True)

    @staticmethod
    def discard(path: str) -> None:
        """Deletes an exported checkpoint no server uses (its push failed)."""
        shutil.rmtree(path, ignore_errors=True)

    async def push_one(
        self,
        stub: Any,
        http_url: str | None,
        model_path: str,
        version: int,
        model_info: Callable[[], Awaitable[dict[str, Any]]],
        on_stuck: Callable[[str], None],
    ) -> dict[str, Any] | None:
        """pause → update → continue on one server (`stub`, SGLang's HTTP base URL `http_url`); continue is always
        attempted, and when it fails three times `on_stuck(reason)` is called (a paused server would pass health
        checks but never answer). Returns the server's `GetModelInfo` (`model_info()`) after a gRPC update, None
        over HTTP; raises the update's error after continuing."""
        error: BaseException | None = None
        info = None
        try:
            await stub.PauseGeneration(pb.PauseGenerationRequest(mode=self.pause_mode), timeout=600.0)
            if self.weight_update == "grpc":
                response = await stub.UpdateWeightsFromDisk(
                    pb.UpdateWeightsRequest(model_path=model_path, weight_version=str(version)), timeout=3600.0
                )
                if not response.success:
                    raise RuntimeError(f"update refused: {response.message}")
                info = await model_info()
                if str(info.get("weight_version", version)) != str(version):
                    raise RuntimeError(
                        f"the server reports weight_version {info.get('weight_version')!r} "
                        f"after loading version {version}: "
                        "it ignores the gRPC weight_version field (SGLang does); "
                        "use weight_update='http' with its HTTP URLs"
                    )
            else:
                body = {"model_path": model_path, "weight_version": str(version), "flush_cache": True}
                ok, message = await self._post(f"{http_url}/update_weights_from_disk", body)
                if not ok:
                    raise RuntimeError(f"update refused: {message}")
        except BaseException as e:  # noqa: BLE001 — re-raised below, after continuing
            error = e
        try:
            await self._continue(stub, on_stuck)
        except grpc.aio.AioRpcError as e:
            error = error or e
        if error is not None:
            raise error
        return info


def adapter_name(version: int) -> str:
    """The name a pushed LoRA adapter is loaded under on the servers (requests' `lora_path`): one per version."""
    return f"policy-v{int(version):06d}"


def post_json(
    url: str, body: dict[str, Any], timeout_s: float = 3600.0, *, api_key: str | None = None
) -> tuple[bool, str]:
    """POSTs JSON (with `Authorization: Bearer KEY` given a key); returns SGLang's (success, message)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}: {e.read().decode(errors='replace')[:500]}"
    except urllib.error.URLError as e:
        raise ConnectionError(f"{url}: {e.reason}") from None
    return bool(reply.get("success", False)), str(reply.get("message", reply))
