"""The GenerationEngine base class: token ids in, token ids and their logprobs out.

Every backend subclasses `GenerationEngine`: the embedded `JaxEngine` (CPU, Colab, tests), the client of generation
servers `SglangClient` (SGLang, or launch/serve.py), and any registered from outside the package (`engines.factory`'s
`register_engine`). Episodes call `await engine.generate(request)`; many are in flight at once and the engine batches
them. After each update phase the trainer calls `update_weights(params, version)`; every result says which weight
version produced its last token. A backend must provide `generate`; every other member has a default for a backend
with nothing to do there.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import math
import uuid
from collections.abc import Sequence
from typing import Any, Literal, Self

from rltldr_jax import blocking

FinishReason = Literal["stop", "length", "abort"]


def top_k_error(top_k: int, *, prefix: str = "") -> str | None:
    """What is wrong with a top-k value, None if nothing: -1 (off) or a positive k. `prefix` names the key's section
    in the message ("rollout." for config validation)."""
    if top_k == 0 or top_k < -1:
        return f"{prefix}top_k={top_k}: use -1 (off) or a positive k"
    return None


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
      temperature: softmax temperature; 0 means greedy (argmax).
      top_p: nucleus mass kept (1 = off). Values < 1 make the returned logprobs those of the truncated,
        renormalised distribution, so importance ratios against the trainer's logprobs are biased.
      top_k: keep the k most likely tokens (-1 = off).
      max_new_tokens: generation stops after this many tokens (finish reason "length").
      stop_token_ids: generation stops after sampling one of these (finish reason "stop"; the token is returned).
      seed: per-request seed in [0, 2**32); with a seed, the completion does not depend on what else is in the
        batch (JAX's default 32-bit keys would silently drop higher bits, so larger seeds are refused).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        # `nan < 0` is False: finiteness first, or NaN would sample token 0 with NaN logprobs.
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a finite number in (0, 1], got {self.top_p}")
        problem = top_k_error(self.top_k)
        if problem:
            raise ValueError(problem)
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """Prompt ids and sampling parameters; `request_id` identifies it across retries."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams = SamplingParams()
    request_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        if not self.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """The new tokens, the logprob of each under the sampling distribution, why generation ended, and the
    weight version that produced the last token."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int


class GenerationEngine(abc.ABC):
    """Anything that turns prompt ids into sampled ids with logprobs and accepts new weights.

    Subclasses implement `generate`. The defaults suit a backend that holds no weights of its own to verify and has
    no queue to pause: `update_weights` only records the version (which `weight_version` then reports),
    `ensure_weights` reports "embedded", `pause("abort")` calls `abort`, and `abort`, `resume` and `close` do
    nothing. Engines are context managers (`with engine: ...` closes them). Subclasses need not call
    `GenerationEngine.__init__`.

    Attributes:
      max_batch: how many sequences the engine generates at once, the collector's default limit of attempts in
        flight; 0 = unknown (the collector then allows 64).
    """

    max_batch: int = 0
    _base_weight_version: int = 0
    #: Whether `update_weights` / `ensure_weights` accept a policy with LoRA adapters (`models.lora`) and push only
    #: the adapters; otherwise the trainer hands over the merged policy.
    takes_adapters: bool = False

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generates one completion; many calls may be in flight at once (from one event loop)."""

    def generate_many(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Blocking batch generation (results in request order), for scripts and evaluation: `generate` on a fresh
        event loop (on a thread of its own when called from a running loop, such as a Jupyter kernel's)."""

        async def gather() -> list[GenerationResult]:
            return list(await asyncio.gather(*(self.generate(r) for r in requests)))

        return blocking.run(gather())

    @property
    def weight_version(self) -> int:
        """The version label of the weights that later requests are generated with."""
        return self._base_weight_version

    def update_weights(self, params: Any, version: int) -> None:
        """Serves `params` (a model or its `nnx.state`) as `version` from now on. Default: records the version only
        (a backend whose samples do not depend on the trainer's weights)."""
        del params
        self._base_weight_version = int(version)

    def ensure_weights(self, model: Any, version: int, *, assume: bool = False) -> str:
        """Makes the engine serve `model` as `version` before the first phase (fresh or resumed run); returns how:
        "embedded" (built from `model` itself, the default: nothing to do), "verified", "assumed" or "pushed"
        (`SglangClient.ensure_weights`). `assume` trusts servers that cannot prove their weights."""
        del model, version, assume
        return "embedded"

    def abort(self, request_id: str | None = None) -> None:
        """Finishes one request (None: every queued and running one) with finish reason "abort". Default: nothing
        (requests in flight simply finish)."""
        del request_id

    def pause(self, mode: str = "in_place") -> None:
        """Stops generating until `resume()`; with mode "abort" the queued and running requests finish with reason
        "abort" (SGLang's `pause_generation` modes: "abort", "in_place", "retract"). Default: "abort" calls `abort()`,
        the other modes do nothing."""
        if mode == "abort":
            self.abort()

    def resume(self) -> None:
        """Continues after `pause()`. Default: nothing."""
        return

    @property
    def paused(self) -> bool:
        """Whether the engine is paused (between `pause()` and `resume()`). Default: False."""
        return False

    def close(self) -> None:
        """Releases the engine's threads, channels or servers; requests still in flight end. Default: nothing."""
        return

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OnMainProcess(GenerationEngine):
    """Stands in, on processes other than 0, for a generation engine that only process 0 holds (the collector and
    the evaluation run there: the multi-host rules of `rltldr_jax.distributed`). Weight pushes, `ensure_weights` and
    `close` do nothing (the defaults of `GenerationEngine`); generating, and any member a backend adds, raises."""

    def __init__(self, what: str):
        self.what = what

    def _elsewhere(self) -> AttributeError:
        import jax  # (this module stays free of JAX: backends and configs import it)

        return AttributeError(
            f"{self.what} lives on process 0 of this multi-process job (process {jax.process_index()} has none): "
            "generate inside distributed.from_main_process(...)"
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise self._elsewhere()

    def generate_many(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        raise self._elsewhere()

    def __getattr__(self, name: str) -> Any:
        raise self._elsewhere()
