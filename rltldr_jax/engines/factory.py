"""Engines from a config: the policy's (embedded JaxEngine or a client of generation servers) and the frozen
teacher of `insight.source="teacher"` (Table 3's separate insight generator).

    engine = policy_engine(config, model, workdir=...)        # config.engine.*
    teacher, teacher_tokenizer = teacher_engine(config)       # config.insight.teacher.* (None, None if unused)

The policy engine receives the trainer's weight pushes; the teacher never does.
"""

from __future__ import annotations

import os
from typing import Any

from flax import nnx

from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.tokenization import Tokenizer, load_tokenizer


def _addresses(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def jax_engine_options(config: Any) -> dict[str, Any]:
    """The embedded JaxEngine's options from `config.engine`: batch_invariant, prefill_chunk, prefix_cache_mb,
    weights_dtype."""
    c = config.engine
    return {
        "batch_invariant": c.batch_invariant,
        "prefill_chunk": c.prefill_chunk,
        "prefix_cache_bytes": int(c.prefix_cache_mb * 2**20),
        "weights_dtype": c.weights_dtype,
    }


def policy_engine(config: Any, model: Any, *, workdir: str, version: int = 0) -> GenerationEngine:
    """The generation engine of `config.engine` for the policy `model` (a Qwen35).

    kind=jax: an embedded JaxEngine holding `model`'s weights. kind=grpc / sglang: a client of running servers
    (launch/serve.py / launch/serve_sglang.py) that already serve the policy at `version`; weight pushes go
    through `engine.weight_sync_dir` (default `{workdir}/weights`).
    """
    c = config.engine
    if c.kind == "jax":
        from rltldr_jax.engines.jax_engine import JaxEngine

        return JaxEngine(
            model, max_batch=c.max_batch, max_len=config.rollout.max_context_tokens, weight_version=version,
            **jax_engine_options(config),
        )
    from rltldr_jax.engines.sglang_client import SglangClient

    servers = _addresses(c.servers)
    if not servers:
        raise ValueError(
            f"engine.kind={c.kind} needs engine.servers=host:port,...; start them with "
            + ("launch/serve_sglang.py (CUDA GPUs)" if c.kind == "sglang" else "launch/serve.py")
        )
    http = _addresses(c.http_servers) or None
    if c.kind == "sglang" and not http:
        raise ValueError("engine.kind=sglang needs engine.http_servers (SGLang's --port URLs) for versioned weight pushes")
    return SglangClient(
        servers, http_urls=http, weight_update="http" if c.kind == "sglang" else "grpc", graphdef=nnx.graphdef(model),
        weight_dir=c.weight_sync_dir or os.path.join(workdir, "weights"),
        request_timeout_s=c.request_timeout_s or None, weight_version=version,
    )  # fmt: skip


def teacher_engine(config: Any) -> tuple[GenerationEngine | None, Tokenizer | None]:
    """(engine, tokenizer) of the frozen insight teacher, or (None, None) unless `insight.source="teacher"`.

    `insight.teacher.checkpoint`: an HF directory run on an embedded JaxEngine (a Qwen 3.5-family model; its
    tokenizer is `insight.teacher.tokenizer`, else the directory's tokenizer.json, else the policy's).
    `insight.teacher.servers`: gRPC servers already serving the teacher (any model SGLang serves; it must speak
    ChatML, the judge prompt's format); tokenizer from `insight.teacher.tokenizer`, else the policy's.
    """
    ins = config.insight
    if ins.source != "teacher":
        return None, None
    t = ins.teacher
    if t.servers:
        from rltldr_jax.engines.sglang_client import SglangClient

        tokenizer = load_tokenizer(t.tokenizer) if t.tokenizer else None
        return SglangClient(_addresses(t.servers), request_timeout_s=config.engine.request_timeout_s or None), tokenizer
    if not t.checkpoint:
        raise ValueError("insight.source='teacher' needs insight.teacher.checkpoint or insight.teacher.servers")
    if not os.path.isfile(os.path.join(t.checkpoint, "config.json")):
        raise FileNotFoundError(
            f"insight.teacher.checkpoint={t.checkpoint!r} has no config.json: give an HF checkpoint directory of the "
            "teacher (download it on a machine with internet), or serve it and set insight.teacher.servers"
        )
    import jax.numpy as jnp

    from rltldr_jax.engines.jax_engine import JaxEngine
    from rltldr_jax.models import load_pretrained

    dtype = getattr(jnp, config.model.dtype)
    model = load_pretrained(t.checkpoint, dtype=getattr(jnp, config.model.param_dtype), compute_dtype=dtype,
                            allow_nonfinite=config.model.allow_nonfinite)  # fmt: skip
    if t.tokenizer or os.path.isfile(os.path.join(t.checkpoint, "tokenizer.json")):
        tokenizer = load_tokenizer(t.tokenizer or t.checkpoint)
    else:
        tokenizer = None  # the policy's
    # The same context limit as the policy's engine, which serves the judge prompts when source="policy".
    engine = JaxEngine(
        model, max_batch=config.engine.max_batch, max_len=config.rollout.max_context_tokens, **jax_engine_options(config)
    )  # fmt: skip
    return engine, tokenizer


def ensure_served(engine: GenerationEngine, model: Any, version: int, *, assume: bool = False) -> str:
    """Makes the policy engine sample from `model` (labelled `version`) before the first phase, fresh or resumed.

    The embedded JaxEngine was built from `model` itself ("embedded"). A client of servers checks them and pushes
    the weights unless they prove (or, with `assume`, are trusted) to serve them (`SglangClient.ensure_weights`:
    "verified", "assumed" or "pushed").
    """
    ensure = getattr(engine, "ensure_weights", None)
    if ensure is None:
        return "embedded"
    return ensure(model, version, assume=assume)


def close_engine(engine: Any) -> None:
    """Stops an engine that has threads or channels to release (JaxEngine, SglangClient); None is fine."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()
