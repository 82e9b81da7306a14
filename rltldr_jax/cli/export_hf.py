"""Export a training checkpoint as a complete HF model directory (transformers, SGLang and our launchers load it as is).

    python launch/export_hf.py --checkpoint=runs/sapi-rltldr/checkpoints --out=/tmp/qwen_rltldr
    python launch/export_hf.py --checkpoint=... --step=120 --out=... --dtype=float32
    python launch/export_hf.py --checkpoint=... --out=... --config_json=/ckpt/qwen3_5_9b/config.json
    python launch/export_hf.py --checkpoint=... --out=/tmp/adapter --adapter   # a LoRA run: a PEFT adapter
    python launch/export_hf.py --checkpoint=... --out=/tmp/merged --merge      # ... or merged full weights

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
files, e.g. a README, are kept (an --adapter export replaces the whole directory). `--checkpoint` was
`--checkpoint_dir` before this release (still accepted, with a notice).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from absl import app, flags

from rltldr_jax.cli.common import as_main, define_alias, notice_renamed, parse_flags, quiet_logging
from rltldr_jax.config.base import absolute_path

DTYPES = ("bfloat16", "float32", "float16")
#: Renamed flags: old -> new (both accepted; the old one with a notice).
RENAMED = {"checkpoint_dir": "checkpoint"}


def define_flags(fv: flags.FlagValues) -> None:
    """The launcher's flags, on `fv`: `run` defines them on absl's global `flags.FLAGS` (so `--help` lists them),
    `parse_args` on a FlagValues of its own. Importing this module defines nothing, so it coexists in one process
    (a test session) with other launchers that have flags of the same names (`--checkpoint`, `--out`, `--preset`)."""
    flags.DEFINE_string(
        "checkpoint", None, "The run's checkpoint directory (Checkpointer), local or gs://. Required.", flag_values=fv
    )
    flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).", flag_values=fv)
    flags.DEFINE_string(
        "out",
        None,
        "Output directory: config.json, model*.safetensors, tokenizer files, generation_config.json. Required.",
        flag_values=fv,
    )
    flags.DEFINE_enum("dtype", "bfloat16", DTYPES, "Dtype of the written tensors.", flag_values=fv)
    flags.DEFINE_bool(
        "allow_nonfinite", False, "Export even if the weights hold NaN/inf (refused by default).", flag_values=fv
    )
    flags.DEFINE_bool(
        "adapter",
        False,
        "A LoRA run: write its adapters as a PEFT adapter directory (adapter_config.json + "
        "adapter_model.safetensors) that peft loads onto the base model. Not with --merge.",
        flag_values=fv,
    )
    flags.DEFINE_bool("merge", False, "A LoRA run: write full weights with the adapters merged in.", flag_values=fv)
    flags.DEFINE_string(
        "base_model",
        "",
        "With --adapter: the base model's hub id or directory, recorded in the adapter.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "tokenizer",
        "",
        "tokenizer.json, directory or hub id of the tokenizer to ship (default: the one the run trained with, recorded "
        "with the checkpoint).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "preset",
        None,
        "Architecture preset of rltldr_jax.models.presets, if the checkpoint records none.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "config_json", None, "HF config.json (or a directory holding one) giving the architecture.", flag_values=fv
    )
    for old, new in RENAMED.items():
        define_alias(old, new, fv)


def arguments(fv: flags.FlagValues) -> SimpleNamespace:
    """The parsed flags of `fv`, one attribute each, checked where they enter (paths made absolute); anything wrong
    exits with one line."""
    own = flags.FlagValues()
    define_flags(own)
    args = SimpleNamespace(**{name: fv[name].value for name in own if name not in RENAMED})
    for required in ("checkpoint", "out"):
        if not getattr(args, required):
            sys.exit(f"error: give --{required} (see --help)")
    if args.adapter and args.merge:
        sys.exit("error: give --adapter or --merge, not both")
    if args.preset and args.config_json:
        sys.exit("error: give --preset or --config_json, not both")
    args.checkpoint, args.out = absolute_path(args.checkpoint), absolute_path(args.out)
    args.config_json = absolute_path(args.config_json) if args.config_json else None
    return args


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    """`arguments` of the flags `argv` (default: this process's command line), parsed on a FlagValues of their own,
    so that calls (tests) can follow one another in one process. A flag absl cannot parse exits with one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    fv = flags.FlagValues()
    define_flags(fv)
    notice_renamed([sys.argv[0], *argv])
    try:
        fv([sys.argv[0], *argv])
    except flags.Error as e:
        sys.exit(f"error: {e}")
    return arguments(fv)


def main(argv: list[str] | None = None) -> int:
    """Exports as the flags `argv` say (in-process: a private parse, `parse_args`); returns the exit status."""
    return export(parse_args(argv))


def export(args: SimpleNamespace) -> int:
    """The export of parsed flags: 0, or 2 with one line on stderr."""
    quiet_logging()  # orbax logs every checkpoint operation at INFO through absl
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
            args.checkpoint,
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
    print(f"exported step {step} of {args.checkpoint} to {args.out} ({what})")
    if not os.path.isfile(os.path.join(args.out, "tokenizer.json")):
        print(
            f"export_hf: warning: checkpoint step {step} records no run config, so {args.out} has no tokenizer files: "
            "transformers and our launchers need them; export again with --tokenizer=THE_RUNS_TOKENIZER",
            file=sys.stderr,
        )
    return 0


def run() -> None:
    """`rltldr-export-hf` (console script) and `python launch/export_hf.py`."""
    define_flags(flags.FLAGS)
    as_main(__name__)
    app.run(lambda argv: sys.exit(export(arguments(flags.FLAGS))), flags_parser=parse_flags)


if __name__ == "__main__":
    run()
