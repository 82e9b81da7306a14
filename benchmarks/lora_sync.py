"""Weight sync of a LoRA policy, full vs adapter: what one phase's push costs (export + load), side by side.

    python benchmarks/lora_sync.py                                 # qwen3_5_0_8b and qwen3_5_2b, rank 16, this CPU
    python benchmarks/lora_sync.py --presets=qwen3_5_0_8b --rank=64 --repeat=3

A LoRA run can push its policy to generation servers two ways each phase:

- **full**: merge the adapters into the base (`lora.merged`), export the whole model as HF safetensors in bf16
  (`save_pretrained`, what `engine.weight_sync_dir` receives today), and a server loads it (`load_pretrained`:
  what launch/serve.py's `UpdateWeightsFromDisk` does; SGLang's `update_weights_from_disk` reads the same files);
- **adapter**: export only the adapters as a PEFT directory (`lora.save_adapter`) and a server attaches them to the
  base it already holds (`lora.load_adapter`; SGLang's `/load_lora_adapter` reads the same files).

Both are timed on the same model, the same disk, in one process, taking turns (`common.best_of`), after a warm-up
each; the bytes written are the files' sizes. The base is random (no weights are downloaded): timings do not depend
on the values. The base is held in bf16, as a LoRA run would hold it; adapters in fp32.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import jax.numpy as jnp
from common import best_of

from rltldr_jax.models import ModelSpec, get_preset, load_pretrained, lora, save_pretrained


def _bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def measure(preset: str, rank: int, repeat: int, workdir: str) -> dict[str, float]:
    """(seconds and bytes) of a full and an adapter push of `preset` with rank-`rank` adapters on every projection."""
    spec = ModelSpec(get_preset(preset), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    model = lora.attach(spec.build(seed=0), lora.LoraSpec(rank=rank, alpha=2.0 * rank))
    full_dir, adapter_dir = os.path.join(workdir, "full"), os.path.join(workdir, "adapter")
    save_pretrained(lora.without_adapters(model), os.path.join(workdir, "base"))  # what a server holds already
    server_base = load_pretrained(os.path.join(workdir, "base"), dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)

    def export_full():
        save_pretrained(lora.merged(model), full_dir, dtype=jnp.bfloat16)

    def load_full():
        load_pretrained(full_dir, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)

    def export_adapter():
        lora.save_adapter(model, adapter_dir)

    def load_adapter():
        lora.load_adapter(lora.without_adapters(server_base), adapter_dir)

    export_full()
    export_adapter()
    t = best_of([export_full, export_adapter, load_full, load_adapter], repeat)
    return {
        "export_full_s": t[0],
        "export_adapter_s": t[1],
        "load_full_s": t[2],
        "load_adapter_s": t[3],
        "full_bytes": _bytes(full_dir),
        "adapter_bytes": _bytes(adapter_dir),
        "trainable": lora.adapter_count(model),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="qwen3_5_0_8b,qwen3_5_2b", help="comma-separated model presets")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    p.add_argument("--repeat", type=int, default=2, help="timed rounds (best of)")
    p.add_argument("--dir", default=None, help="where to write the exports (default: a temporary directory)")
    args = p.parse_args()
    print(f"LoRA rank {args.rank} on every attention/DeltaNet/MLP projection; base bf16; best of {args.repeat}")
    print("| preset | trainable | full: MB | export s | load s | adapter: MB | export s | load s | full / adapter |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in [s.strip() for s in args.presets.split(",") if s.strip()]:
        workdir = tempfile.mkdtemp(prefix="lora_sync-", dir=args.dir)
        try:
            r = measure(preset, args.rank, args.repeat, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        full = r["export_full_s"] + r["load_full_s"]
        adapter = r["export_adapter_s"] + r["load_adapter_s"]
        print(
            f"| {preset} | {r['trainable'] / 1e6:.1f}M | {r['full_bytes'] / 1e6:.0f} | {r['export_full_s']:.2f} | "
            f"{r['load_full_s']:.2f} | {r['adapter_bytes'] / 1e6:.1f} | {r['export_adapter_s']:.2f} | "
            f"{r['load_adapter_s']:.2f} | {full / adapter:.1f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
