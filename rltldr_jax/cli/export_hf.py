"""Export a training checkpoint as a complete HF model directory (transformers, SGLang and our launchers load it as is).

    python launch/export_hf.py --checkpoint_dir=runs/sapi-rltldr/checkpoints --out=/tmp/qwen_rltldr
    python launch/export_hf.py --checkpoint_dir=... --step=120 --out=... --dtype=float32
    python launch/export_hf.py --checkpoint_dir=... --out=... --config_json=/ckpt/qwen3_5_9b/config.json
    python launch/export_hf.py --checkpoint_dir=... --out=/tmp/adapter --adapter   # a LoRA run: a PEFT adapter
    python launch/export_hf.py --checkpoint_dir=... --out=/tmp/merged --merge      # ... or merged full weights

What an export contains (files 0644, a new directory 0755, so that servers running as another user read it):

- config.json: the architecture (`Qwen3_5ForCausalLM`, text layout), the written dtype, the BOS and EOS token ids;
- model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json above 5 GiB;
- the tokenizer the run trained with, as HF tokenizer files: tokenizer.json (the run's file, byte for byte; the
  built-in Qwen 3.5 tokenizer serialised), and tokenizer_config.json with the special tokens (EOS `<|im_end|>`, pad
  `<|endoftext|>`) and a chat template: the tokenizer's own files when it came with them (a hub model's), else the
  ChatML format of our contexts (`tokenization.CHAT_TEMPLATE`, thinking on or off as the run had it);
- generation_config.json: EOS `<|im_end|>` and `<|endoftext|>`, pad and BOS ids, and the run's sampling
  (`rollout.temperature`, `top_p`, `top_k` when on).

`--adapter` writes a PEFT adapter directory instead (adapter_config.json, adapter_model.safetensors, float32) with
the same tokenizer files (no generation_config.json: the base model's applies); `--merge` a LoRA run's full weights,
complete as above. So `AutoTokenizer.from_pretrained(OUT)` and `AutoModelForCausalLM.from_pretrained(OUT)` give our
ids and logits, and `launch/eval.py --checkpoint=OUT` or `--config.model.checkpoint=OUT` find the policy's tokenizer.

The run's tokenizer is the one its config, recorded with the checkpoint, names (`tokenizer`, else
`model.checkpoint`'s, else the built-in Qwen 3.5 one); `--tokenizer` gives another, or one for a checkpoint that
records no config (which is otherwise exported without tokenizer files, with a warning). A tokenizer with more ids
than the model's vocabulary is refused. The architecture is read from the checkpoint (the trainer records
`Qwen35Config.to_hf_dict()` at save time); --preset or --config_json give it for checkpoints saved without one (and
must agree with a recorded one). Only the parameters are read (verified against the checksums recorded at save time);
the optimizer state is not touched. An export replaces the weights, tokenizer files and generation config of an
existing --out as a whole (written next to it, then swapped in: never a mix of two exports); the directory's other
files, e.g. a README, are kept (an --adapter export replaces the whole directory).
"""

from __future__ import annotations

import argparse
import os
import sys

from rltldr_jax.config.base import absolute_path

DTYPES = ("bfloat16", "float32", "float16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--checkpoint_dir",
        required=True,
        type=absolute_path,
        help="the run's checkpoint directory (Checkpointer), local or gs://",
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step to export (default: the latest)")
    p.add_argument(
        "--out",
        required=True,
        type=absolute_path,
        help="output directory: config.json, model*.safetensors, tokenizer files, generation_config.json",
    )
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="dtype of the written tensors")
    p.add_argument(
        "--allow_nonfinite", action="store_true", help="export even if the weights hold NaN/inf (refused by default)"
    )
    kind = p.add_mutually_exclusive_group()
    kind.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run: write its adapters as a PEFT adapter directory (adapter_config.json + "
        "adapter_model.safetensors) that peft loads onto the base model",
    )
    kind.add_argument("--merge", action="store_true", help="a LoRA run: write full weights with the adapters merged in")
    p.add_argument(
        "--base_model", default="", help="with --adapter: the base model's hub id or directory, recorded in the adapter"
    )
    p.add_argument(
        "--tokenizer",
        default="",
        help="tokenizer.json, directory or hub id of the tokenizer to ship (default: the one the run trained with, "
        "recorded with the checkpoint)",
    )
    arch = p.add_mutually_exclusive_group()
    arch.add_argument(
        "--preset", help="architecture preset of rltldr_jax.models.presets, if the checkpoint records none"
    )
    arch.add_argument(
        "--config_json", type=absolute_path, help="HF config.json (or a directory holding one) giving the architecture"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import CheckpointMismatchError, export_hf
    from rltldr_jax.config.base import model_path
    from rltldr_jax.models import Qwen35Config, get_preset

    try:
        tokenizer = model_path(args.tokenizer, "tokenizer") if args.tokenizer else None
        config = None
        if args.preset:
            config = get_preset(args.preset)
        elif args.config_json:
            path = args.config_json
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            config = Qwen35Config.from_json_file(path)
        step = export_hf(
            args.checkpoint_dir,
            args.step,
            args.out,
            config=config,
            dtype=getattr(jnp, args.dtype),
            allow_nonfinite=args.allow_nonfinite,
            adapter="peft" if args.adapter else "merge" if args.merge else None,
            base_model=args.base_model,
            tokenizer=tokenizer,
        )
    except (FileNotFoundError, ValueError, CheckpointMismatchError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only or full output directory, ...
        where = f" {e.filename}" if e.filename else ""
        print(
            f"export_hf: error: cannot write the export to {args.out} ({e.strerror or e}:{where}); give an --out in a "
            "writable directory with enough free space",
            file=sys.stderr,
        )
        return 2
    what = "PEFT adapter, float32" if args.adapter else args.dtype + (", adapters merged" if args.merge else "")
    print(f"exported step {step} of {args.checkpoint_dir} to {args.out} ({what})")
    if not os.path.isfile(os.path.join(args.out, "tokenizer.json")):
        print(
            f"export_hf: warning: checkpoint step {step} records no run config, so {args.out} has no tokenizer files: "
            "transformers and our launchers need them; export again with --tokenizer=THE_RUNS_TOKENIZER",
            file=sys.stderr,
        )
    return 0


def run() -> None:
    """`rltldr-export-hf` (console script) and `python launch/export_hf.py`."""
    sys.exit(main())


if __name__ == "__main__":
    run()
