"""Serve a Qwen 3.5 policy with the embedded JaxEngine over SGLang's native gRPC service.

    python launch/serve.py --model_path=/ckpt/qwen3_5_0_8b --port=40000 --max_batch=32 --max_len=8192
    python launch/serve.py --model_path=Qwen/Qwen3.5-0.8B --port=40000     # a hub id: its snapshot in the HF cache
    python launch/serve.py --preset=tiny --port=0 --port_file=/tmp/port   # random tiny model, free port

One process per accelerator host (or per CPU box). The trainer reaches every server with `SglangClient`
(`engine.kind=jax_grpc`, `engine.servers=host:port,...`) exactly as it reaches SGLang servers, and pushes new
weights with `UpdateWeightsFromDisk` into a directory the server can read. The server warms up (compiles
prefill and decode) before it reports ready; it prints `serving on HOST:PORT` and, with --port_file, writes
the bound port there. SIGTERM/SIGINT aborts running requests and stops.

A server loads any checkpoint path it can read when asked (`UpdateWeightsFromDisk`), so it binds 127.0.0.1 by
default. On a cluster, bind every interface with `--host=0.0.0.0` and give the server and the trainer one shared
key, as SGLang's `--api-key`: `export RLTLDR_ENGINE_API_KEY=...` where each runs (or `--api_key` here, which `ps`
shows); every RPC without it is refused (UNAUTHENTICATED). The key is never printed or logged.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys

from rltldr_jax.cli.common import use_compile_cache
from rltldr_jax.config.base import absolute_path, model_path
from rltldr_jax.engines.jax_engine import DEFAULT_DECODE_GROUP, DEFAULT_DECODE_STEPS, decode_group_error
from rltldr_jax.engines.sglang_proto import API_KEY_ENV
from rltldr_jax.models.hub import HubError

DTYPES = ("float32", "bfloat16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model_path",
        help="HF safetensors checkpoint directory (config.json + model*.safetensors), or a hub id org/name[@revision] "
        "(its snapshot in the local HF cache, downloaded if needed; an existing local path wins)",
    )
    src.add_argument(
        "--preset", help="random weights of a preset of rltldr_jax.models.presets (e.g. tiny), for tests and demos"
    )
    p.add_argument("--seed", type=int, default=0, help="initialisation seed with --preset")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind: this host only by default; 0.0.0.0 for every interface (clusters: with an API key)",
    )
    p.add_argument(
        "--api_key",
        "--api-key",
        default=None,
        help="shared key every RPC must carry (SGLang's --api-key); default: $RLTLDR_ENGINE_API_KEY, which the "
        "trainer's client sends (prefer the variable: a flag shows in ps)",
    )
    p.add_argument("--port", type=int, default=40000, help="gRPC port; 0 picks a free one")
    p.add_argument(
        "--port_file",
        type=absolute_path,
        help="write the bound port to this file once ready (with --http_port: 'GRPC HTTP')",
    )
    p.add_argument(
        "--http_port", type=int, help="also serve SGLang's HTTP POST /update_weights_from_disk here (0: free port)"
    )
    p.add_argument("--max_batch", type=int, default=8, help="sequences decoded concurrently")
    p.add_argument(
        "--decode_steps", type=int, default=DEFAULT_DECODE_STEPS, help="decode steps per device call (engine doc)"
    )
    p.add_argument(
        "--decode_group",
        type=int,
        default=DEFAULT_DECODE_GROUP,
        help="slots per decode call; must divide --max_batch (--decode_group=MAX_BATCH: one call over all slots)",
    )
    p.add_argument(
        "--batched_prefill",
        action="store_true",
        help="prefill requests admitted together as one padded batch (faster with many concurrent prompts; "
        "results then vary at float rounding with batch composition); default: each alone, bit-reproducible",
    )
    p.add_argument(
        "--prefill_chunk",
        type=int,
        default=128,
        help="tokens per prefill call, aligned from position 0 (a power of two >= 16); not with --batched_prefill",
    )
    p.add_argument(
        "--prefix_cache_mb",
        type=float,
        default=1024,
        help="MiB of prefix cache (decode states at --prefill_chunk prompt boundaries, reused by requests sharing "
        "a prompt prefix; bit-identical results); 0 = off; not with --batched_prefill",
    )
    p.add_argument(
        "--weights_dtype",
        choices=("", *DTYPES),
        default="",
        help="dtype of the engine's weight matrices ('' = --dtype); bfloat16 halves the bytes per decode step "
        "(float32 accumulation)",
    )
    p.add_argument("--max_len", type=int, default=4096, help="prompt + completion tokens per sequence")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="parameter and compute dtype")
    p.add_argument("--weight_version", type=int, default=0, help="version label of the initial weights")
    p.add_argument("--no_warmup", action="store_true", help="skip compiling before reporting ready")
    p.add_argument(
        "--compile_cache_dir",
        type=absolute_path,
        default=None,
        help="JAX's persistent compilation cache, a private directory (rltldr_jax/compile_cache.py); default: "
        "$JAX_COMPILATION_CACHE_DIR, else ~/.cache/rltldr_jax/xla; '' = none",
    )
    p.add_argument("--allow_nonfinite", action="store_true", help="serve --model_path even if its weights hold NaN/inf")
    args = p.parse_args(argv)
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    if args.model_path:  # where the path enters: a hub id becomes its local snapshot directory
        try:
            args.model_path = model_path(args.model_path)
        except HubError as e:
            sys.exit(f"error: --model_path: {e}")
    problem = argument_error(args)
    if problem:  # one line, no usage block: the launchers' convention (rltldr_jax/cli/common.py)
        sys.exit(f"error: {problem}")
    return args


def argument_error(args: argparse.Namespace) -> str | None:
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
    if args.model_path and not os.path.isfile(os.path.join(args.model_path, "config.json")):
        return f"--model_path {args.model_path!r} has no config.json; give an HF checkpoint directory"
    return None


def exposure_warning(args: argparse.Namespace) -> str | None:
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


def build_engine(args: argparse.Namespace):
    import jax.numpy as jnp

    from rltldr_jax.engines import JaxEngine
    from rltldr_jax.models import ModelSpec, get_preset, load_pretrained
    from rltldr_jax.models.fingerprint import weights_fingerprint

    dtype = getattr(jnp, args.dtype)
    if args.model_path:
        try:
            model = load_pretrained(
                args.model_path, dtype=dtype, compute_dtype=dtype, allow_nonfinite=args.allow_nonfinite
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


async def serve(args: argparse.Namespace) -> None:
    from rltldr_jax.engines.server import EngineService, start_http_admin, start_server

    engine, dtype, fingerprint, model = build_engine(args)
    if not args.no_warmup:
        warm_up(engine)
    service = EngineService(
        engine,
        model_path=args.model_path or f"preset:{args.preset}",
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
    engine.close()  # running requests finish with reason "abort"
    if http is not None:
        http.shutdown()
    await server.stop(grace=2.0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    use_compile_cache(args.compile_cache_dir, key="--compile_cache_dir")  # a restarted server compiles nothing again
    asyncio.run(serve(args))


def run() -> None:
    """`rltldr-serve` (console script) and `python launch/serve.py`."""
    main()


if __name__ == "__main__":
    run()
