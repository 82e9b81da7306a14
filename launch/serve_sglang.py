"""Start SGLang generation servers for RL: native gRPC for generation, HTTP for versioned weight pushes.

The launcher is rltldr_jax/cli/serve_sglang.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-serve-sglang`."""

from rltldr_jax.cli.serve_sglang import main, run  # noqa: F401

if __name__ == "__main__":
    run()
