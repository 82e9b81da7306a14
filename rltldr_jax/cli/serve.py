"""Serve a Qwen 3.5 policy with the embedded JaxEngine over SGLang's native gRPC service.

    python launch/serve.py --checkpoint=/ckpt/qwen3_5_0_8b --port=40000 --max_batch=32 --max_len=8192
    python launch/serve.py --checkpoint=Qwen/Qwen3.5-0.8B --port=40000     # a hub id: its snapshot in the HF cache
    python launch/serve.py --preset=tiny --port=0 --port_file=/tmp/port   # random tiny model, free port

One process per accelerator host (or per CPU box). The trainer reaches every server with `SglangClient`
(`engine.kind=jax_grpc`, `engine.servers=host:port,...`) exactly as it reaches SGLang servers, and pushes new
weights with `UpdateWeightsFromDisk` into a directory the server can read. The server warms up (compiles
prefill and decode) before it reports ready; it prints `serving on HOST:PORT` and, with --port_file, writes
the bound port there. SIGTERM/SIGINT aborts running requests and stops (during start-up: one line, exit status
143 / 130).

A server loads any checkpoint path it can read when asked (`UpdateWeightsFromDisk`), so it binds 127.0.0.1 by
default. On a cluster, bind every interface with `--host=0.0.0.0` and give the server and the trainer one shared
key, as SGLang's `--api-key`: `export RLTLDR_ENGINE_API_KEY=...` where each runs (or `--api_key` here, also spelled
`--api-key`, which `ps` shows); every RPC without it is refused (UNAUTHENTICATED). The key is never printed or
logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import sys
from types import SimpleNamespace

from absl import flags

from rltldr_jax.cli.common import as_main, define_alias, quiet_logging, run_launcher, use_compile_cache
from rltldr_jax.config.base import absolute_path, model_path
from rltldr_jax.engines.jax_engine import DEFAULT_DECODE_GROUP, DEFAULT_DECODE_STEPS, decode_group_error
from rltldr_jax.engines.sglang_proto import API_KEY_ENV
from rltldr_jax.models.hub import HubError

DTYPES = ("float32", "bfloat16")
#: Old flag names still accepted for one release: old -> new (`--help` lists them; using one prints a notice).
RENAMED = {"model_path": "checkpoint"}
#: SGLang's spellings of our flags, accepted too (absl flag names take no dashes): rewritten before parsing.
SGLANG_SPELLINGS = {"--api-key": "--api_key"}


def define_flags(fv: flags.FlagValues) -> None:
    """The launcher's flags, on `fv`: `run` defines them on absl's global `flags.FLAGS` (so that common.parse_flags
    parses them and `--help` lists them), `parse_args` on a FlagValues of its own. Importing this module defines
    nothing, so it coexists in one process (a test session) with other launchers that have flags of the same names
    (`--checkpoint`, `--preset`, `--dtype`)."""
    flags.DEFINE_string(
        "checkpoint",
        None,
        "The policy to serve: an HF safetensors directory (config.json + model*.safetensors), or a hub id "
        "org/name[@revision] (its snapshot in the local HF cache, downloaded if needed; an existing local path wins). "
        "This or --preset.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "preset",
        None,
        "Random weights of a preset of rltldr_jax.models.presets (e.g. tiny), for tests and demos. This or "
        "--checkpoint.",
        flag_values=fv,
    )
    flags.DEFINE_integer("seed", 0, "Initialisation seed with --preset.", flag_values=fv)
    flags.DEFINE_string(
        "host",
        "127.0.0.1",
        "Address to bind: this host only by default; 0.0.0.0 for every interface (clusters: with an API key).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "api_key",
        None,
        "Shared key every RPC must carry (SGLang's --api-key, also accepted); default: $RLTLDR_ENGINE_API_KEY, which "
        "the trainer's client sends (prefer the variable: a flag shows in ps).",
        flag_values=fv,
    )
    flags.DEFINE_integer("port", 40000, "gRPC port; 0 picks a free one.", flag_values=fv)
    flags.DEFINE_string(
        "port_file",
        None,
        "Write the bound port to this file once ready (with --http_port: 'GRPC HTTP').",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "http_port",
        None,
        "Also serve SGLang's HTTP POST /update_weights_from_disk here (0: a free port).",
        flag_values=fv,
    )
    flags.DEFINE_integer("max_batch", 8, "Sequences decoded concurrently.", flag_values=fv)
    flags.DEFINE_integer(
        "decode_steps", DEFAULT_DECODE_STEPS, "Decode steps per device call (JaxEngine's doc).", flag_values=fv
    )
    flags.DEFINE_integer(
        "decode_group",
        DEFAULT_DECODE_GROUP,
        "Slots per decode call; must divide --max_batch (--decode_group=MAX_BATCH: one call over all slots).",
        flag_values=fv,
    )
    flags.DEFINE_bool(
        "batched_prefill",
        False,
        "Prefill requests admitted together as one padded batch (faster with many concurrent prompts; results then "
        "vary at float rounding with batch composition); default: each alone, bit-reproducible.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "prefill_chunk",
        128,
        "Tokens per prefill call, aligned from position 0 (a power of two >= 16); not with --batched_prefill.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "prefix_cache_mb",
        1024,
        "MiB of prefix cache (decode states at --prefill_chunk prompt boundaries, reused by requests sharing a prompt "
        "prefix; bit-identical results); 0 = off; not with --batched_prefill.",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "weights_dtype",
        None,
        DTYPES,
        "Dtype of the engine's weight matrices (default: --dtype); bfloat16 halves the bytes per decode step (float32 "
        "accumulation).",
        flag_values=fv,
    )
    flags.DEFINE_integer("max_len", 4096, "Prompt + completion tokens per sequence.", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", DTYPES, "Parameter and compute dtype.", flag_values=fv)
    flags.DEFINE_integer("weight_version", 0, "Version label of the initial weights.", flag_values=fv)
    flags.DEFINE_bool("no_warmup", False, "Skip compiling before reporting ready.", flag_values=fv)
    flags.DEFINE_string(
        "compile_cache_dir",
        None,
        "JAX's persistent compilation cache, a private directory (rltldr_jax/compile_cache.py); default: "
        "$JAX_COMPILATION_CACHE_DIR, else ~/.cache/rltldr_jax/xla; '' = none.",
        flag_values=fv,
    )
    flags.DEFINE_bool("allow_nonfinite", False, "Serve --checkpoint even if its weights hold NaN/inf.", flag_values=fv)
    for old, new in RENAMED.items():
        if fv is flags.FLAGS:
            define_alias(old, new)  # the launchers' convention: listed by --help, a notice when used
        else:
            flags.DEFINE_alias(old, new, flag_values=fv)


def with_sglang_spellings(argv: list[str]) -> list[str]:
    """`argv` (flags only, no program name) with SGLang's spellings (`--api-key KEY`, `--api-key=KEY`) rewritten to
    ours; what follows a `--` is left as it is."""
    out, flags_end = [], False
    for arg in argv:
        if not flags_end:
            name, sep, value = arg.partition("=")
            arg = SGLANG_SPELLINGS.get(name, name) + sep + value
        flags_end = flags_end or arg == "--"
        out.append(arg)
    return out


def arguments(fv: flags.FlagValues) -> SimpleNamespace:
    """The parsed flags of `fv`, one attribute each, checked and resolved where they enter: the API key from the
    environment when no flag gives it, paths made absolute, a hub id as --checkpoint resolved to its local snapshot.
    Anything wrong exits with one line (`error: ...`, no usage block: the launchers' convention)."""
    own = flags.FlagValues()
    define_flags(own)  # (their names: `fv` may hold absl's own flags too)
    args = SimpleNamespace(**{name: fv[name].value for name in own if name not in RENAMED})
    if args.checkpoint and args.preset:
        sys.exit("error: give --checkpoint or --preset, not both")
    if not args.checkpoint and not args.preset:
        sys.exit(
            "error: give --checkpoint=DIR (an HF checkpoint directory or hub id) or --preset=NAME (random weights)"
        )
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    args.weights_dtype = args.weights_dtype or ""  # JaxEngine: "" = the compute dtype
    args.port_file = absolute_path(args.port_file) if args.port_file else None
    if args.compile_cache_dir is not None:  # ("" = no cache: stays "")
        args.compile_cache_dir = absolute_path(args.compile_cache_dir)
    if args.checkpoint:
        try:
            args.checkpoint = model_path(args.checkpoint)
        except HubError as e:
            sys.exit(f"error: --checkpoint: {e}")
    problem = argument_error(args)
    if problem:
        sys.exit(f"error: {problem}")
    return args


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    """`arguments` of the flags `argv` (default: this process's command line), parsed on a FlagValues of their own:
    nothing of absl's global state is touched, so calls (tests) can follow one another in one process. A flag absl
    cannot parse exits with one line. (The launcher itself parses with `run`, which also answers `--help`.)"""
    fv = flags.FlagValues()
    define_flags(fv)
    try:
        fv([sys.argv[0], *with_sglang_spellings(sys.argv[1:] if argv is None else argv)])
    except flags.Error as e:
        sys.exit(f"error: {e}")
    return arguments(fv)


def argument_error(args: SimpleNamespace) -> str | None:
    """What is wrong with the parsed flags, None if nothing: each would otherwise start a server that cannot work
    (`--max_batch=0` reports healthy and never answers) or fail later with a traceback."""
    for flag in ("port", "http_port"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value <= 65535:
            return f"--{flag} must be in [0, 65535] (0 picks a free port), got {value}"
    if args.max_batch < 1:
        return f"--max_batch must be >= 1, got {args.max_batch}"
    if args.decode_steps < 1:
        return f"--decode_steps must be >= 1, got {args.decode_steps}"
    if (problem := decode_group_error(args.max_batch, args.decode_group, prefix="--")) is not None:
        return problem
    if args.max_len < 2:
        return f"--max_len must be >= 2 (a prompt token and a new one), got {args.max_len}"
    if args.api_key is not None and not args.api_key.strip():
        return f"--api_key is empty; give a key or leave it (and {API_KEY_ENV}) unset"
    if args.weight_version < 0:
        return f"--weight_version must be >= 0, got {args.weight_version}"
    if args.prefix_cache_mb < 0:
        return f"--prefix_cache_mb must be >= 0 (0 = off), got {args.prefix_cache_mb}"
    if args.prefill_chunk < 16 or args.prefill_chunk & (args.prefill_chunk - 1):
        return f"--prefill_chunk must be a power of two >= 16, got {args.prefill_chunk}"
    if args.checkpoint and not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        return f"--checkpoint {args.checkpoint!r} has no config.json; give an HF checkpoint directory"
    return None


def exposure_warning(args: SimpleNamespace) -> str | None:
    """A warning when the server is reachable from other hosts without an API key, else None."""
    if args.api_key:
        return None
    try:
        if ipaddress.ip_address(args.host).is_loopback:
            return None
    except ValueError:  # a host name
        if args.host == "localhost":
            return None
    return (
        f"warning: serving on {args.host} without an API key: any host that reaches this port can generate and make "
        f"this server load weights from any path it can read; set {API_KEY_ENV} here and where the trainer runs"
    )


def build_engine(args: SimpleNamespace):
    import jax.numpy as jnp

    from rltldr_jax.engines import JaxEngine
    from rltldr_jax.models import ModelSpec, get_preset, load_pretrained
    from rltldr_jax.models.fingerprint import weights_fingerprint

    dtype = getattr(jnp, args.dtype)
    if args.checkpoint:
        try:
            model = load_pretrained(
                args.checkpoint, dtype=dtype, compute_dtype=dtype, allow_nonfinite=args.allow_nonfinite
            )
        except ValueError as e:  # a corrupt or mismatching checkpoint: one line, no traceback
            sys.exit(f"error: {e}")
    else:
        try:
            config = get_preset(args.preset)
        except (KeyError, ValueError) as e:
            sys.exit(f"error: {e}")
        model = ModelSpec(config, dtype=dtype, param_dtype=dtype).build(seed=args.seed)
    fingerprint = weights_fingerprint(model)  # of the stacked model, as the trainer computes it
    engine = JaxEngine(
        model,
        max_batch=args.max_batch,
        max_len=args.max_len,
        weight_version=args.weight_version,
        batch_invariant=not args.batched_prefill,
        prefill_chunk=args.prefill_chunk,
        prefix_cache_bytes=int(args.prefix_cache_mb * 2**20),
        weights_dtype=args.weights_dtype,
        decode_steps=args.decode_steps,
        decode_group=args.decode_group,
    )
    return engine, dtype, fingerprint, model


def warm_up(engine) -> None:
    """Compiles decode and the prefill of every batch bucket (1, 2, 4, ..., max_batch; only 1 is used without
    --batched_prefill) at the shortest prompt bucket, and the full prefill chunk, so that the first requests are not
    slow; other prompt buckets compile on first use."""
    from rltldr_jax.engines import GenerationRequest, SamplingParams

    n = 1
    while n <= engine.max_batch:
        engine.generate_many([GenerationRequest((0,), SamplingParams(max_new_tokens=2, seed=i)) for i in range(n)])
        n *= 2
    if engine.batch_invariant and engine.max_len > engine.prefill_chunk + 2:  # the [1, C] chunk of longer prompts
        engine.generate_many([GenerationRequest((0,) * (engine.prefill_chunk + 1), SamplingParams(max_new_tokens=1))])


async def serve(args: SimpleNamespace) -> None:
    from rltldr_jax.engines.server import EngineService, start_http_admin, start_server

    engine, dtype, fingerprint, model = build_engine(args)
    try:
        if not args.no_warmup:
            warm_up(engine)
        service = EngineService(
            engine,
            model_path=args.checkpoint or f"preset:{args.preset}",
            param_dtype=dtype,
            fingerprint=fingerprint,
            api_key=args.api_key,
            base=model,
        )
        warning = exposure_warning(args)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        server, port = await start_server(service, args.host, args.port)
        loop = asyncio.get_running_loop()
        ports, http = str(port), None
        if args.http_port is not None:
            http = start_http_admin(service, loop, args.host, args.http_port)
            ports += f" {http.server_address[1]}"
            print(f"HTTP admin on {args.host}:{http.server_address[1]}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if args.port_file:
            tmp = args.port_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(ports)
            os.replace(tmp, args.port_file)  # readers never see a half-written file
        print(f"serving on {args.host}:{port}" + (" (API key required)" if args.api_key else ""), flush=True)
        await stop.wait()
    finally:
        # Running requests finish with reason "abort". On a signal during start-up (`run_launcher`: one line, exit
        # status 143 / 130) this also ends the engine thread before the process exits: one still in a device call
        # at exit aborts the process (SIGABRT, a fatal-error dump).
        engine.close()
    if http is not None:
        http.shutdown()
    await server.stop(grace=2.0)


def main(argv: list[str]) -> None:
    """Serves until SIGTERM/SIGINT: `run`'s main, given the command line's flags parsed on `flags.FLAGS`."""
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}; options are flags, e.g. --checkpoint=DIR")
    args = arguments(flags.FLAGS)
    quiet_logging()  # the server's INFO lines (weights updated, ...) as plain timestamped lines on stderr
    use_compile_cache(args.compile_cache_dir, key="--compile_cache_dir")  # a restarted server compiles nothing again
    asyncio.run(serve(args))


def run() -> None:
    """`rltldr-serve` (console script) and `python launch/serve.py`."""
    define_flags(flags.FLAGS)
    sys.argv[1:] = with_sglang_spellings(sys.argv[1:])
    as_main(__name__)
    run_launcher(main)


if __name__ == "__main__":
    run()
