"""Generation engines behind one protocol: the embedded JaxEngine and (later) the SGLang gRPC client."""

from rltldr_jax.engines.engine import FinishReason, GenerationEngine, GenerationRequest, GenerationResult, SamplingParams
from rltldr_jax.engines.jax_engine import JaxEngine

__all__ = ["FinishReason", "GenerationEngine", "GenerationRequest", "GenerationResult", "JaxEngine", "SamplingParams"]
