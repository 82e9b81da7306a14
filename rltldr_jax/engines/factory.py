"""Engines from typed settings: the policy's (embedded JaxEngine or a client of generation servers) and the frozen
teacher of `insight.source="teacher"` (Table 3's separate insight generator).

    settings = EngineConfig.from_config(config)               # config.engine.*, config.insight.teacher.*: once
    engine = policy_engine(settings, model, workdir=...)
    teacher, teacher_tokenizer = teacher_engine(settings)     # (None, None) if unused

The policy engine receives the trainer's weight pushes; the teacher never does.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections
from flax import nnx

from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.tokenization import Tokenizer, load_tokenizer

#: Values of `engine.kind`: the embedded JaxEngine, SGLang servers over gRPC, or launch/serve.py's gRPC servers.
ENGINE_KINDS = ("jax", "sglang", "grpc")


def _addresses(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """The frozen insight teacher of `insight.source="teacher"`: `insight.teacher.*`, and the policy's dtypes and
    non-finite policy (`model.dtype`, `model.param_dtype`, `model.allow_nonfinite`) for an embedded one."""

    checkpoint: str
    servers: str
    tokenizer: str
    dtype: str
    param_dtype: str
    allow_nonfinite: bool

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> TeacherConfig | None:
        """The teacher of a run's config, or None unless `insight.source="teacher"`."""
        if config.insight.source != "teacher":
            return None
        t, m = config.insight.teacher, config.model
        return cls(
            checkpoint=t.checkpoint,
            servers=t.servers,
            tokenizer=t.tokenizer,
            dtype=m.dtype,
            param_dtype=m.param_dtype,
            allow_nonfinite=m.allow_nonfinite,
        )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The engines' settings: `engine.*` (kind one of `ENGINE_KINDS`; servers and http_servers comma-separated),
    the context limit `rollout.max_context_tokens` of every sequence, and the teacher (None: none)."""

    kind: str
    servers: str
    http_servers: str
    request_timeout_s: float
    weight_sync_dir: str
    max_batch: int
    batch_invariant: bool
    prefix_cache_mb: float
    prefill_chunk: int
    weights_dtype: str
    decode_steps: int
    decode_group: int
    assume_initial_weights: bool
    max_context_tokens: int
    teacher: TeacherConfig | None = None

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> EngineConfig:
        """The engines of a run's config."""
        e = config.engine
        return cls(
            kind=e.kind,
            servers=e.servers,
            http_servers=e.http_servers,
            request_timeout_s=e.request_timeout_s,
            weight_sync_dir=e.weight_sync_dir,
            max_batch=e.max_batch,
            batch_invariant=e.batch_invariant,
            prefix_cache_mb=e.prefix_cache_mb,
            prefill_chunk=e.prefill_chunk,
            weights_dtype=e.weights_dtype,
            decode_steps=e.decode_steps,
            decode_group=e.decode_group,
            assume_initial_weights=e.assume_initial_weights,
            max_context_tokens=config.rollout.max_context_tokens,
            teacher=TeacherConfig.from_config(config),
        )

    def jax_engine_options(self) -> dict[str, Any]:
        """The embedded JaxEngine's options: batch_invariant, prefill_chunk, prefix_cache_bytes, weights_dtype,
        decode_steps, decode_group."""
        return {
            "batch_invariant": self.batch_invariant,
            "prefill_chunk": self.prefill_chunk,
            "prefix_cache_bytes": int(self.prefix_cache_mb * 2**20),
            "weights_dtype": self.weights_dtype,
            "decode_steps": self.decode_steps,
            "decode_group": self.decode_group,
        }


def policy_engine(config: EngineConfig, model: Any, *, workdir: str, version: int = 0) -> GenerationEngine:
    """The generation engine of `config` for the policy `model` (a Qwen35).

    kind=jax: an embedded JaxEngine holding `model`'s weights. kind=grpc / sglang: a client of running servers
    (launch/serve.py / launch/serve_sglang.py) that already serve the policy at `version`; weight pushes go
    through `weight_sync_dir` (default `{workdir}/weights`).
    """
    if config.kind == "jax":
        from rltldr_jax.engines.jax_engine import JaxEngine

        return JaxEngine(
            model,
            max_batch=config.max_batch,
            max_len=config.max_context_tokens,
            weight_version=version,
            **config.jax_engine_options(),
        )
    from rltldr_jax.engines.sglang_client import SglangClient

    servers = _addresses(config.servers)
    if not servers:
        raise ValueError(
            f"engine.kind={config.kind} needs engine.servers=host:port,...; start them with "
            + ("launch/serve_sglang.py (CUDA GPUs)" if config.kind == "sglang" else "launch/serve.py")
        )
    http = _addresses(config.http_servers) or None
    if config.kind == "sglang" and not http:
        raise ValueError(
            "engine.kind=sglang needs engine.http_servers (SGLang's --port URLs) for versioned weight pushes"
        )
    return SglangClient(
        servers,
        http_urls=http,
        weight_update="http" if config.kind == "sglang" else "grpc",
        graphdef=nnx.graphdef(model),
        weight_dir=config.weight_sync_dir or os.path.join(workdir, "weights"),
        request_timeout_s=config.request_timeout_s or None,
        weight_version=version,
    )


def teacher_engine(config: EngineConfig) -> tuple[GenerationEngine | None, Tokenizer | None]:
    """(engine, tokenizer) of the frozen insight teacher `config.teacher`, or (None, None) without one.

    `teacher.checkpoint`: an HF directory run on an embedded JaxEngine (a Qwen 3.5-family model; its tokenizer is
    `teacher.tokenizer`, else the directory's tokenizer.json, else the policy's). `teacher.servers`: gRPC servers
    already serving the teacher (any model SGLang serves; it must speak ChatML, the writer prompt's format);
    tokenizer from `teacher.tokenizer`, else the policy's.
    """
    t = config.teacher
    if t is None:
        return None, None
    if t.servers:
        from rltldr_jax.engines.sglang_client import SglangClient

        tokenizer = load_tokenizer(t.tokenizer) if t.tokenizer else None
        return SglangClient(_addresses(t.servers), request_timeout_s=config.request_timeout_s or None), tokenizer
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

    dtype = getattr(jnp, t.dtype)
    model = load_pretrained(
        t.checkpoint, dtype=getattr(jnp, t.param_dtype), compute_dtype=dtype, allow_nonfinite=t.allow_nonfinite
    )
    if t.tokenizer or os.path.isfile(os.path.join(t.checkpoint, "tokenizer.json")):
        tokenizer = load_tokenizer(t.tokenizer or t.checkpoint)
    else:
        tokenizer = None  # the policy's
    # The same context limit as the policy's engine, which serves the writer prompts when source="policy".
    engine = JaxEngine(
        model, max_batch=config.max_batch, max_len=config.max_context_tokens, **config.jax_engine_options()
    )
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
