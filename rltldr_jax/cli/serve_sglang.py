"""Start SGLang generation servers for RL: native gRPC for generation, HTTP for versioned weight pushes.

    python launch/serve_sglang.py --checkpoint=/ckpt/Qwen3.5-9B --num_servers=4 --tp=2        # 8 GPUs
    python launch/serve_sglang.py --checkpoint=/ckpt/Qwen3.5-9B --num_servers=2 --dry_run     # print commands
    python launch/serve_sglang.py --checkpoint=/ckpt/Qwen3.5-9B -- --enable-memory-saver    # SGLang's own flags

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

import importlib.metadata
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from absl import flags

# = rltldr_jax.engines.sglang_proto.API_KEY_ENV (a test checks), not imported: that would import jax for --dry_run.
API_KEY_ENV = "RLTLDR_ENGINE_API_KEY"
MIN_SGLANG = "0.5.9"  # the first release with Qwen 3.5
# The native gRPC server (--grpc-port) arrived in 2026 (0.5.23 has it); older releases are refused by probing the flag.
GRPC_RESPONSE_TIMEOUT_S = 3600  # SGLang's per-chunk default is 300 s: one non-streamed long completion must fit
#: Old flag names still accepted for one release: old -> new (`--help` lists them; using one prints a notice).
RENAMED = {"model_path": "checkpoint"}
#: The flags that print `help_text` and exit 0, as on every launcher (rltldr_jax.cli.common.HELP_FLAGS, and
#: --helpfull: this launcher has no flags beyond its own).
HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def define_flags(fv: flags.FlagValues) -> None:
    """The launcher's flags, on `fv` (a FlagValues of its own: absl's global flags.FLAGS stays untouched, so that
    importing this module next to another launcher, in a test session, defines nothing twice)."""
    flags.DEFINE_string(
        "checkpoint",
        None,
        "The policy to serve (required): an HF checkpoint directory, or a hub id org/name[@revision] that SGLang "
        "resolves on the GPU host (which then needs the network or the model in its HF cache).",
        flag_values=fv,
    )
    flags.DEFINE_integer("num_servers", 1, "Servers to start; each takes --tp GPUs.", flag_values=fv)
    flags.DEFINE_integer("tp", 1, "Tensor-parallel GPUs per server.", flag_values=fv)
    flags.DEFINE_integer("first_gpu", 0, "Index of the first GPU to use.", flag_values=fv)
    flags.DEFINE_string(
        "host",
        "127.0.0.1",
        "Bind address (0.0.0.0 to serve other hosts; then set $RLTLDR_ENGINE_API_KEY for an API key).",
        flag_values=fv,
    )
    flags.DEFINE_integer("http_port", 30000, "HTTP port of server 0 (server i: +i).", flag_values=fv)
    flags.DEFINE_integer("grpc_port", 40000, "gRPC port of server 0 (server i: +i).", flag_values=fv)
    flags.DEFINE_integer(
        "lora_rank",
        0,
        "Serve LoRA adapters up to this rank (the trainer's model.lora.rank; 0: none): SGLang --enable-lora "
        "--max-lora-rank R --lora-target-modules all --max-loras-per-batch 2 (the current adapter and the one a push "
        "replaces).",
        flag_values=fv,
    )
    flags.DEFINE_string("dtype", "bfloat16", "SGLang --dtype.", flag_values=fv)
    flags.DEFINE_float("mem_fraction_static", 0.85, "SGLang --mem-fraction-static.", flag_values=fv)
    flags.DEFINE_integer("context_length", None, "SGLang --context-length (default: the model's).", flag_values=fv)
    flags.DEFINE_string(
        "log_dir", "sglang_logs", "Directory of the servers' logs, one file per server.", flag_values=fv
    )
    flags.DEFINE_float("timeout_s", 1800, "How long to wait for every server to become healthy.", flag_values=fv)
    flags.DEFINE_bool("dry_run", False, "Print the commands and the config values, and exit.", flag_values=fv)
    for old, new in RENAMED.items():
        flags.DEFINE_alias(old, new, flag_values=fv)


def help_text(fv: flags.FlagValues) -> str:
    """What `--help` prints, laid out as on every launcher (rltldr_jax.cli.common.help_text, not imported here: it
    imports jax): the docstring (usage examples), this launcher's flags with their help and defaults, the renamed
    ones."""
    (module,) = fv.flags_by_module_dict()  # (this one: `define_flags` defined them all)
    listing = fv.module_help(module).strip().split("\n", 1)[1]
    listing = "\n".join(line for line in listing.splitlines() if not any(line.startswith(f"  --{a}:") for a in RENAMED))
    renamed = "\n".join(f"  --{old} -> --{new}" for old, new in sorted(RENAMED.items()))
    return (
        f"{(__doc__ or '').strip()}\n\nflags:\n{listing}\n\n"
        f"renamed (old names still accepted for one release):\n{renamed}\n"
    )


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    """The flags of `argv` (default: this process's command line), parsed with the launchers' conventions but
    without importing rltldr_jax.cli.common (it imports jax, which --dry_run must not need): `--help` prints
    `help_text` and exits 0, a renamed flag prints a notice, anything wrong exits with one line (`error: ...`, no
    usage block). What follows `--` is passed on to SGLang (`extra`). Each call parses on a FlagValues of its own."""
    argv = sys.argv[1:] if argv is None else list(argv)
    flag_args = argv[: argv.index("--")] if "--" in argv else argv
    fv = flags.FlagValues()
    define_flags(fv)
    if any(arg in HELP_FLAGS for arg in flag_args):
        sys.stdout.write(help_text(fv))
        sys.exit(0)
    for arg in flag_args:
        name = arg.split("=", 1)[0]
        for old, new in RENAMED.items():
            if name == f"--{old}":
                print(f"notice: --{old} is now --{new} (the old name goes in the next release)", file=sys.stderr)
    try:
        extra = fv([sys.argv[0], *argv])[1:]
    except flags.UnrecognizedFlagError as e:
        sys.exit(f"error: {e}; SGLang's own flags go after --, e.g. -- --enable-memory-saver")
    except flags.Error as e:
        sys.exit(f"error: {e}")
    args = SimpleNamespace(**{name: fv[name].value for name in fv if name not in RENAMED}, extra=extra)
    if not args.checkpoint:
        sys.exit("error: give --checkpoint=DIR: the HF checkpoint directory (or hub id) the servers serve")
    if args.num_servers < 1 or args.tp < 1:
        sys.exit(f"error: --num_servers and --tp must be >= 1, got {args.num_servers} and {args.tp}")
    if args.grpc_port < args.http_port + args.num_servers and args.http_port < args.grpc_port + args.num_servers:
        last = args.num_servers - 1
        sys.exit(
            f"error: the HTTP ports {args.http_port}-{args.http_port + last} and the gRPC ports "
            f"{args.grpc_port}-{args.grpc_port + last} of {args.num_servers} servers overlap; move --grpc_port"
        )
    # Paths absolute where they enter (the servers may run elsewhere); a hub id that is no local path stays.
    args.log_dir = os.path.abspath(args.log_dir)
    if os.path.exists(args.checkpoint):
        args.checkpoint = os.path.abspath(args.checkpoint)
    return args


def server_commands(args: SimpleNamespace) -> list[tuple[dict[str, str], list[str]]]:
    """(extra environment, argv) of each server."""
    commands = []
    for i in range(args.num_servers):
        gpus = range(args.first_gpu + i * args.tp, args.first_gpu + (i + 1) * args.tp)
        argv = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            args.checkpoint,
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


def addresses(args: SimpleNamespace) -> tuple[str, str]:
    """The config values engine.servers and engine.http_servers for these servers."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    grpc = ",".join(f"{host}:{args.grpc_port + i}" for i in range(args.num_servers))
    http = ",".join(f"http://{host}:{args.http_port + i}" for i in range(args.num_servers))
    return grpc, http


def check_environment(args: SimpleNamespace) -> None:
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
    """Starts the servers the flags of `argv` (default: the command line) describe and waits on them; with
    --dry_run, prints their commands and the config values instead."""
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
