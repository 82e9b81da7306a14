"""Start SGLang generation servers for RL: native gRPC for generation, HTTP for versioned weight pushes.

    python launch/serve_sglang.py --model_path=/ckpt/Qwen3.5-9B --num_servers=4 --tp=2        # 8 GPUs
    python launch/serve_sglang.py --model_path=/ckpt/Qwen3.5-9B --num_servers=2 --dry_run     # print commands

Needs a CUDA GPU machine with SGLang >= 0.5.9 (the first release with Qwen 3.5) whose launcher has the native gRPC
server (`--grpc-port`; 0.5.23 has it): `pip install "sglang>=0.5.23"`.
SGLang does not run on CPU-only hosts (its kernels need the CUDA driver); there, or on TPUs, serve with
`launch/serve.py`, which speaks the same protocol.

Each server gets `tp` consecutive GPUs (CUDA_VISIBLE_DEVICES), an HTTP port and a gRPC port, and the flags RL
needs:
  --grpc-port            the native `sglang.runtime.v1.SglangService` next to HTTP: token ids in, token ids
                         and logprobs out (what SglangClient speaks)
  --grpc-response-timeout-secs 3600   one non-streamed completion is one chunk: allow long ones
  --skip-tokenizer-init  ids only: the trainer owns tokenization and the chat context
  --weight-version 0     integer version labels from the start; pushes set them through
                         POST /update_weights_from_disk {"weight_version": ...}
  --api-key KEY          only with $RLTLDR_ENGINE_API_KEY set: SGLang then requires the key (HTTP
                         `Authorization: Bearer KEY`; the trainer's client sends it from the same variable).
                         Use it with --host=0.0.0.0: a server loads any checkpoint path it is sent. The dry run
                         prints *** for the key.
Once every server answers its gRPC health check, the script prints the two config values to pass to
launch/train.py (`--config.engine.servers=...` and `--config.engine.http_servers=...`) and keeps running;
Ctrl-C (or SIGTERM) stops every server. Logs go to --log_dir/server_{i}.log.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

# = rltldr_jax.engines.sglang_proto.API_KEY_ENV (a test checks), not imported: that would import jax for --dry_run.
API_KEY_ENV = "RLTLDR_ENGINE_API_KEY"
MIN_SGLANG = "0.5.9"  # the first release with Qwen 3.5
# The native gRPC server (--grpc-port) arrived in 2026 (0.5.23 has it); older releases are refused by probing the flag.
GRPC_RESPONSE_TIMEOUT_S = 3600  # SGLang's per-chunk default is 300 s: one non-streamed long completion must fit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model_path", required=True, help="HF checkpoint directory (or hub name, if the GPU host is online)"
    )
    p.add_argument("--num_servers", type=int, default=1, help="servers to start; each takes --tp GPUs")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per server")
    p.add_argument("--first_gpu", type=int, default=0, help="index of the first GPU to use")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (0.0.0.0 to serve other hosts; then set $RLTLDR_ENGINE_API_KEY for an API key)",
    )
    p.add_argument("--http_port", type=int, default=30000, help="HTTP port of server 0 (server i: +i)")
    p.add_argument("--grpc_port", type=int, default=40000, help="gRPC port of server 0 (server i: +i)")
    p.add_argument(
        "--lora_rank",
        type=int,
        default=0,
        help="serve LoRA adapters up to this rank (the trainer's model.lora.rank; 0: none): SGLang --enable-lora "
        "--max-lora-rank R --lora-target-modules all --max-loras-per-batch 2 (the current adapter and the one a push "
        "replaces)",
    )
    p.add_argument("--dtype", default="bfloat16", help="SGLang --dtype")
    p.add_argument("--mem_fraction_static", type=float, default=0.85, help="SGLang --mem-fraction-static")
    p.add_argument("--context_length", type=int, help="SGLang --context-length (default: the model's)")
    p.add_argument("--log_dir", default="sglang_logs", help="one log file per server")
    p.add_argument("--timeout_s", type=float, default=1800, help="how long to wait for every server to become healthy")
    p.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    p.add_argument("extra", nargs="*", help="further SGLang flags, after --, e.g. -- --enable-memory-saver")
    args = p.parse_args(argv)
    if args.num_servers < 1 or args.tp < 1:
        p.error("--num_servers and --tp must be >= 1")
    if args.grpc_port < args.http_port + args.num_servers and args.http_port < args.grpc_port + args.num_servers:
        p.error("the HTTP and gRPC port ranges overlap; move --grpc_port")
    # Paths absolute where they enter (the servers may run elsewhere); a hub name that is no local path stays.
    args.log_dir = os.path.abspath(args.log_dir)
    if os.path.exists(args.model_path):
        args.model_path = os.path.abspath(args.model_path)
    return args


def server_commands(args: argparse.Namespace) -> list[tuple[dict[str, str], list[str]]]:
    """(extra environment, argv) of each server."""
    commands = []
    for i in range(args.num_servers):
        gpus = range(args.first_gpu + i * args.tp, args.first_gpu + (i + 1) * args.tp)
        argv = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            args.model_path,
            "--host",
            args.host,
            "--port",
            str(args.http_port + i),
            "--grpc-port",
            str(args.grpc_port + i),
            "--grpc-response-timeout-secs",
            str(GRPC_RESPONSE_TIMEOUT_S),
            "--skip-tokenizer-init",
            "--weight-version",
            "0",
            "--tp-size",
            str(args.tp),
            "--dtype",
            args.dtype,
            "--mem-fraction-static",
            str(args.mem_fraction_static),
        ]
        if args.context_length:
            argv += ["--context-length", str(args.context_length)]
        if args.lora_rank:
            argv += ["--enable-lora", "--max-lora-rank", str(args.lora_rank), "--lora-target-modules", "all"]
            argv += ["--max-loras-per-batch", "2"]
        if os.environ.get(API_KEY_ENV):
            argv += ["--api-key", os.environ[API_KEY_ENV]]
        commands.append(({"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, argv + list(args.extra)))
    return commands


def redacted(argv: list[str]) -> list[str]:
    """`argv` with the value of --api-key replaced by ***, for printing."""
    return ["***" if i > 0 and argv[i - 1] == "--api-key" else arg for i, arg in enumerate(argv)]


def addresses(args: argparse.Namespace) -> tuple[str, str]:
    """The config values engine.servers and engine.http_servers for these servers."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    grpc = ",".join(f"{host}:{args.grpc_port + i}" for i in range(args.num_servers))
    http = ",".join(f"http://{host}:{args.http_port + i}" for i in range(args.num_servers))
    return grpc, http


def check_environment(args: argparse.Namespace) -> None:
    """Exits with the reason and the fix when SGLang cannot run here."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(
            'error: SGLang is not installed. On a CUDA GPU machine: pip install "sglang>=0.5.23". Without a CUDA GPU, '
            "serve with launch/serve.py (same protocol)."
        )
    from packaging.version import Version

    if Version(version) < Version(MIN_SGLANG):
        sys.exit(f'error: SGLang {version} has no Qwen 3.5; pip install "sglang>=0.5.23"')
    help_text = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True, check=False
    )
    if "--grpc-port" not in help_text.stdout:
        sys.exit(f'error: SGLang {version} has no native gRPC server (--grpc-port); pip install "sglang>=0.5.23"')
    if shutil.which("nvidia-smi") is None:
        sys.exit(
            "error: no CUDA GPU here (nvidia-smi not found); SGLang needs one. Use launch/serve.py on CPU or TPU hosts."
        )
    listed = (
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout.strip().splitlines()
    )
    needed = args.first_gpu + args.num_servers * args.tp
    if len(listed) < needed:
        sys.exit(
            f"error: {args.num_servers} servers × tp {args.tp} from GPU {args.first_gpu} need {needed} GPUs; "
            f"found {len(listed)}"
        )


def wait_healthy(
    grpc_addresses: list[str], processes: list[subprocess.Popen], timeout_s: float, log_files: list[str]
) -> None:
    """Polls each server's gRPC HealthCheck until all are healthy; exits if one dies or time runs out."""
    import grpc

    from rltldr_jax.engines import sglang_proto as pb

    deadline = time.monotonic() + timeout_s
    pending = dict(enumerate(grpc_addresses))
    while pending:
        for i, address in list(pending.items()):
            if processes[i].poll() is not None:
                sys.exit(f"error: server {i} exited with code {processes[i].returncode}; see {log_files[i]}")
            try:
                with grpc.insecure_channel(address) as channel:
                    stub = pb.Stub(channel, api_key=os.environ.get(API_KEY_ENV) or None)
                    if stub.HealthCheck(pb.HealthCheckRequest(), timeout=5).healthy:
                        del pending[i]
            except grpc.RpcError:
                pass
        if pending and time.monotonic() > deadline:
            sys.exit(
                f"error: servers {sorted(pending)} not healthy after {timeout_s:.0f} s; see {', '.join(log_files)}"
            )
        time.sleep(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    commands = server_commands(args)
    grpc_addresses, http_urls = addresses(args)
    if args.dry_run:
        for env, argv_i in commands:
            print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(redacted(argv_i)))
        print(
            f"--config.engine.kind=sglang --config.engine.servers={grpc_addresses} "
            f"--config.engine.http_servers={http_urls}"
        )
        return
    check_environment(args)
    os.makedirs(args.log_dir, exist_ok=True)
    processes, log_files = [], []
    for i, (env, argv_i) in enumerate(commands):
        log_files.append(os.path.join(args.log_dir, f"server_{i}.log"))
        with open(log_files[-1], "w") as log:
            processes.append(subprocess.Popen(argv_i, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT))

    def stop(*_, code: int = 0):
        for p in processes:
            if p.poll() is None:
                p.terminate()
        for p in processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        sys.exit(code)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait_healthy(grpc_addresses.split(","), processes, args.timeout_s, log_files)
    print(
        f"{args.num_servers} SGLang servers ready. Train with:\n  --config.engine.kind=sglang "
        f"--config.engine.servers={grpc_addresses} --config.engine.http_servers={http_urls}",
        flush=True,
    )
    while all(p.poll() is None for p in processes):
        time.sleep(5)
    dead = [i for i, p in enumerate(processes) if p.poll() is not None]
    print(f"servers {dead} exited; stopping the others (see {args.log_dir})", file=sys.stderr)
    stop(code=1)


def run() -> None:
    """`rltldr-serve-sglang` (console script) and `python launch/serve_sglang.py`."""
    main()


if __name__ == "__main__":
    run()
