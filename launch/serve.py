"""Serve a Qwen 3.5 policy with the embedded JaxEngine over SGLang's native gRPC service.

The launcher is rltldr_jax/cli/serve.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-serve`."""

from rltldr_jax.cli.serve import main, run  # noqa: F401

if __name__ == "__main__":
    run()
