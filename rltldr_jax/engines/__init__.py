"""Generation engines behind one base class, `GenerationEngine`: the embedded JaxEngine, the SGLang gRPC client, and
any backend registered with `engines.factory.register_engine` (chosen by `engine.kind`)."""

from rltldr_jax.engines.engine import (
    FinishReason,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from rltldr_jax.engines.jax_engine import JaxEngine
from rltldr_jax.engines.sglang_client import ClientClosedError, NoServerError, SglangClient, StaleWeightsError

__all__ = [
    "ClientClosedError",
    "FinishReason",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "JaxEngine",
    "NoServerError",
    "SamplingParams",
    "SglangClient",
    "StaleWeightsError",
]
