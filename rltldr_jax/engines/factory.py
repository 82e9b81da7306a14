"""Engines from typed settings: the policy's (a backend of the registry `ENGINES`, chosen by `engine.kind`) and the
frozen teacher of `insight.source="teacher"` (Table 3's separate insight generator).

    engines = EngineConfig.of(settings)                       # settings.engine.*, settings.insight.teacher.*: once
    engine = policy_engine(engines, model, workdir=...)
    teacher, teacher_tokenizer = teacher_engine(engines)      # (None, None) if unused

The policy engine receives the trainer's weight pushes; the teacher never does.

Backends: `engine.kind` names a builder registered with `@register_engine(name)`. Built in: "jax" (the embedded
JaxEngine), "sglang" (SGLang servers over gRPC, launch/serve_sglang.py) and "jax_grpc" (JaxEngines behind
launch/serve.py's gRPC servers; "grpc", its name before the registry, stays an alias: saved run configs and scripts
use it). A backend outside the package registers itself when its module is imported, and is chosen with
`engine.kind=package.module:name`: the module is imported (by config validation, and again here) and `name` must be
registered then. A builder is called as `builder(settings, model, workdir=..., version=...)` and returns a
`GenerationEngine` that already serves `model`'s weights labelled `version`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Protocol

from flax import nnx

from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.settings import Settings, build
from rltldr_jax.tokenization import Tokenizer, load_tokenizer
from rltldr_jax.user_modules import import_user_module


class EngineBuilder(Protocol):
    """Builds the policy's engine: `builder(settings, model, workdir=..., version=...)`.

    Args:
      config: the run's `EngineConfig` (its `kind` as the user wrote it).
      model: the policy (a Qwen35); the engine must serve its weights, labelled `version`.
      workdir: the run's directory (e.g. for weight pushes through files).
      version: the weight version of `model` (0 on a fresh run, the checkpoint's on a resumed one).
    """

    def __call__(self, config: EngineConfig, model: Any, *, workdir: str, version: int) -> GenerationEngine: ...


#: The registry of `engine.kind` values: name -> builder (`register_engine` adds to it).
ENGINES: dict[str, EngineBuilder] = {}
#: What each kind asks of the `engine.*` settings before anything is built: name -> check (`register_engine`'s
#: `check`), returning what is wrong in one line, or None.
ENGINE_CHECKS: dict[str, Callable[[Any], str | None]] = {}
#: Older names of registered kinds, still accepted: alias -> name.
ENGINE_ALIASES: dict[str, str] = {"grpc": "jax_grpc"}


def register_engine(
    name: str, *, check: Callable[[Any], str | None] | None = None
) -> Callable[[EngineBuilder], EngineBuilder]:
    """A decorator that registers a builder as `engine.kind=name` (re-registering a name replaces its builder, so a
    module imported twice is harmless).

        @register_engine("scripted", check=lambda engine: None if engine.servers else "kind=scripted needs servers")
        def build(config, model, *, workdir, version):
            return ScriptedEngine(...)

    `check(engine)` gets the `engine.*` settings (attributes `servers`, `http_servers`, ...: the config section when
    a config is validated, the `EngineConfig` when the engine is built) and returns what is wrong with them for this
    backend in one line, or None: config validation (and so `--dry_run`) runs it, before any weights are loaded.
    """
    if not name or ":" in name or name in ENGINE_ALIASES:
        raise ValueError(f"engine name {name!r}: give a non-empty name without ':' that is not an alias")

    def register(builder: EngineBuilder) -> EngineBuilder:
        ENGINES[name] = builder
        if check is None:
            ENGINE_CHECKS.pop(name, None)
        else:
            ENGINE_CHECKS[name] = check
        return builder

    return register


def engine_kinds() -> tuple[str, ...]:
    """The accepted values of `engine.kind` now: the registered names and the aliases, sorted."""
    return tuple(sorted({*ENGINES, *ENGINE_ALIASES}))


def engine_kind_error(kind: Any, *, prefix: str = "engine.") -> str | None:
    """What is wrong with an `engine.kind` value, in one line, None if nothing. A `module:name` value imports
    `module` (where it registers its backends)."""
    try:
        resolve_engine(kind)
    except ValueError as e:
        return f"{prefix}{e}"
    return None


def engine_settings_error(engine: Any, *, prefix: str = "engine.") -> str | None:
    """What the backend of `engine.kind` finds wrong with the `engine.*` settings (its registered `check`), in one
    line, None if nothing (or if the kind itself is invalid: `engine_kind_error` says so)."""
    try:
        resolve_engine(engine.kind)
    except ValueError:
        return None
    check = ENGINE_CHECKS.get(_registered_name(engine.kind))
    problem = check(engine) if check is not None else None
    return f"{prefix}{problem}" if problem else None


def _registered_name(kind: str) -> str:
    """The registered name of a valid `engine.kind` value (an alias's name; `module:name`'s name)."""
    name = ENGINE_ALIASES.get(kind, kind)
    return name.rpartition(":")[2] if ":" in name else name


def resolve_engine(kind: Any) -> EngineBuilder:
    """The builder of an `engine.kind` value: a registered name, an alias, or `module:name` (imports `module`).

    Raises:
      ValueError: one line naming the choices, or why the module did not provide the backend.
    """
    if not isinstance(kind, str):
        raise ValueError(f"kind={kind!r} must be a string")
    name = ENGINE_ALIASES.get(kind, kind)
    module, colon, registered = kind.partition(":")
    if colon:
        if not module or not registered:
            raise ValueError(f"kind={kind!r}: write package.module:name")
        try:
            import_user_module(module)
        except ImportError as e:
            raise ValueError(f"kind={kind!r}: cannot import {module} ({type(e).__name__}: {e})") from None
        if registered not in ENGINES:
            raise ValueError(
                f"kind={kind!r}: importing {module} registered no engine {registered!r} "
                f"(registered: {', '.join(sorted(ENGINES))}; use @register_engine({registered!r}))"
            )
        name = registered
    if name not in ENGINES:
        raise ValueError(
            f"kind={kind!r} is not one of {', '.join(map(repr, engine_kinds()))}, nor package.module:name of a "
            "backend its module registers (register_engine)"
        )
    return ENGINES[name]


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
    def of(cls, settings: Settings) -> TeacherConfig | None:
        """The teacher of a run's settings, or None unless `insight.source="teacher"`."""
        if settings.insight.source != "teacher":
            return None
        m = settings.model
        return build(
            cls, settings.insight.teacher, dtype=m.dtype, param_dtype=m.param_dtype, allow_nonfinite=m.allow_nonfinite
        )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The engines' settings: `engine.*` (kind: a registered engine, see `resolve_engine`; servers and http_servers
    comma-separated),
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
    def of(cls, settings: Settings) -> EngineConfig:
        """The engines of a run's settings."""
        return build(
            cls,
            settings.engine,
            max_context_tokens=settings.rollout.max_context_tokens,
            teacher=TeacherConfig.of(settings),
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
    """The generation engine of `config` (its `kind`'s registered builder) for the policy `model` (a Qwen35).

    kind=jax: an embedded JaxEngine holding `model`'s weights. kind=jax_grpc (alias grpc) / sglang: a client of
    running servers (launch/serve.py / launch/serve_sglang.py) that already serve the policy at `version`; weight
    pushes go through `weight_sync_dir` (default `{workdir}/weights`). Any other kind: the builder registered under
    it (module doc).
    """
    return resolve_engine(config.kind)(config, model, workdir=workdir, version=version)


@register_engine("jax")
def _jax_engine(config: EngineConfig, model: Any, *, workdir: str, version: int) -> GenerationEngine:
    """The embedded JaxEngine holding `model`'s weights."""
    from rltldr_jax.engines.jax_engine import JaxEngine

    del workdir
    return JaxEngine(
        model,
        max_batch=config.max_batch,
        max_len=config.max_context_tokens,
        weight_version=version,
        **config.jax_engine_options(),
    )


def _servers_check(launcher: str, *, http: bool) -> Callable[[Any], str | None]:
    """The check of a backend that is a client of running servers started by `launcher`: it needs their addresses
    (`engine.servers`) and, when pushes go through SGLang's HTTP API (`http`), their HTTP URLs too."""

    def check(engine: Any) -> str | None:
        if not _addresses(engine.servers):
            return f"kind={engine.kind} needs engine.servers=host:port,...; start them with {launcher}"
        if http and not _addresses(engine.http_servers):
            return f"kind={engine.kind} needs engine.http_servers (SGLang's --port URLs) for versioned weight pushes"
        return None

    return check


@register_engine("sglang", check=_servers_check("launch/serve_sglang.py (CUDA GPUs)", http=True))
def _sglang_servers(config: EngineConfig, model: Any, *, workdir: str, version: int) -> GenerationEngine:
    """A client of SGLang servers (launch/serve_sglang.py); versioned pushes over their HTTP ports."""
    return _server_client(config, model, workdir=workdir, version=version, weight_update="http")


@register_engine("jax_grpc", check=_servers_check("launch/serve.py", http=False))
def _jax_grpc_servers(config: EngineConfig, model: Any, *, workdir: str, version: int) -> GenerationEngine:
    """A client of launch/serve.py's gRPC servers (JaxEngines behind SGLang's gRPC service); pushes over gRPC."""
    return _server_client(config, model, workdir=workdir, version=version, weight_update="grpc")


def _server_client(
    config: EngineConfig, model: Any, *, workdir: str, version: int, weight_update: str
) -> GenerationEngine:
    """An SglangClient of `config.servers`, pushing weights with `weight_update` ("http": SGLang's HTTP ports)."""
    from rltldr_jax.engines.sglang_client import SglangClient

    if problem := engine_settings_error(config):  # (validation ran it already; a builder called directly too)
        raise ValueError(problem)
    servers = _addresses(config.servers)
    http = _addresses(config.http_servers) or None
    return SglangClient(
        servers,
        http_urls=http,
        weight_update="http" if weight_update == "http" else "grpc",
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

    The engine's `ensure_weights`: the embedded JaxEngine was built from `model` itself ("embedded", the default);
    a client of servers checks them and pushes the weights unless they prove (or, with `assume`, are trusted) to
    serve them (`SglangClient.ensure_weights`: "verified", "assumed" or "pushed").
    """
    return engine.ensure_weights(model, version, assume=assume)


def close_engine(engine: GenerationEngine | None) -> None:
    """Closes an engine (releasing its threads or channels); None is fine."""
    if engine is not None:
        engine.close()
