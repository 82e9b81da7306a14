"""Export a training checkpoint's parameters to an HF safetensors directory (transformers / SGLang load it).

The launcher is rltldr_jax/cli/export_hf.py (usage and flags: its docstring, or `--help`), installed as the
console script `rltldr-export-hf`."""

from rltldr_jax.cli.export_hf import main, run  # noqa: F401

if __name__ == "__main__":
    run()
