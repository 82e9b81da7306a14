"""A generation backend defined outside the package: it replays fixed token ids, whatever the weights.

Importing this module registers it as `engine.kind=scripted`; a launcher imports it when the kind names the module:

    python launch/train.py --config=configs/sapi.py:tiny --config.engine.kind=examples.scripted_engine:scripted \
        --config.train.max_logprob_gap=0

(its logprobs are scripted, not the policy's, so the engine-vs-trainer gap check is off). Every request gets the
script's tokens, cut after the first stop id or at `max_new_tokens`, each with logprob `SCRIPT_LOGPROB`; the engine
records the requests it answered and the weight versions pushed to it.
"""

from __future__ import annotations

from typing import Any

from rltldr_jax.engines import GenerationEngine, GenerationRequest, GenerationResult
from rltldr_jax.engines.factory import EngineConfig, register_engine

#: The token ids every completion replays (a prefix of them), and the logprob reported for each.
SCRIPT: tuple[int, ...] = (1040, 1041, 1042, 1043, 1044, 1045, 1046, 1047, 1048, 1049, 1050, 1051)
SCRIPT_LOGPROB = -0.25


class ScriptedEngine(GenerationEngine):
    """Answers every request with a prefix of `script`; `update_weights` only records the version (the default
    `ensure_weights`, `abort`, `pause`, `resume` and `close` of `GenerationEngine` suit it as they are)."""

    def __init__(self, script: tuple[int, ...] = SCRIPT, logprob: float = SCRIPT_LOGPROB, *, version: int = 0):
        self.script, self.logprob = tuple(script), float(logprob)
        self.requests: list[GenerationRequest] = []
        self.results: list[GenerationResult] = []
        self.pushes: list[int] = []  # weight versions pushed, in order
        super().update_weights(None, version)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """The script cut after the first stop id (reason "stop") or at `max_new_tokens` (reason "length")."""
        p = request.params
        ids = self.script[: p.max_new_tokens]
        stop = next((k for k, t in enumerate(ids) if t in p.stop_token_ids), None)
        ids = ids if stop is None else ids[: stop + 1]
        reason = "stop" if stop is not None else "length"
        result = GenerationResult(request.request_id, ids, (self.logprob,) * len(ids), reason, self.weight_version)
        self.requests.append(request)
        self.results.append(result)
        return result

    def update_weights(self, params: Any, version: int) -> None:
        """Records the pushed version (the samples do not depend on the weights)."""
        self.pushes.append(int(version))
        super().update_weights(params, version)


@register_engine("scripted")
def build(config: EngineConfig, model: Any, *, workdir: str, version: int) -> ScriptedEngine:
    """The `engine.kind=scripted` builder: a ScriptedEngine labelled with the policy's weight version."""
    del config, model, workdir
    return ScriptedEngine(version=version)
