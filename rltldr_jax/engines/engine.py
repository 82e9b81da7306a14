"""The GenerationEngine protocol: token ids in, token ids and their logprobs out.

Two implementations share it: the embedded `JaxEngine` (CPU, Colab, tests) and the SGLang gRPC client (GPU
servers). Episodes call `await engine.generate(request)`; many are in flight at once and the engine batches
them. After each update phase the trainer calls `update_weights(params, version)`; every result says which
weight version produced its last token.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from typing import Any, Literal, Protocol

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


class GenerationEngine(Protocol):
    """Anything that turns prompt ids into sampled ids with logprobs and accepts new weights."""

    @property
    def weight_version(self) -> int: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def update_weights(self, params: Any, version: int) -> None: ...
