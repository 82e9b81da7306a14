"""Δθ between two checkpoints (the paper's Table 7): ‖Δθ‖₁, ‖Δθ‖₂, share beyond bf16 precision, Gini of
|Δθ|, top-1% share of Δθ², globally and per module kind.

    python launch/delta_theta.py --base_checkpoint=Qwen/Qwen3.5-9B --checkpoint=runs/sapi-rltldr/checkpoints
    python launch/delta_theta.py --base_checkpoint=runs/x/checkpoints:0 --checkpoint=runs/x/checkpoints:120 --out=t7.csv
    python launch/delta_theta.py --base_checkpoint=/ckpt/qwen3_5_9b --checkpoint=/tmp/qwen_rltldr --out=table7.json

Δθ = θ_checkpoint − θ_base: give the original policy as --base_checkpoint (the >bf16 threshold is relative to it),
the trained one as --checkpoint (their names before this release, --a and --b, still work). Each side is an HF
safetensors directory (config.json + model*.safetensors, e.g. from launch/export_hf.py or the released
checkpoint), a hub id `org/name[@revision]` (its snapshot in the local HF cache, downloaded if needed: an existing
local path of that name wins), or a training run's Checkpointer directory, `DIR[:STEP]` (default: the latest step).
Tensors are compared one at a time (an orbax side holds one stacked parameter), so two 9B checkpoints never sit in
memory together. Definitions and the error bounds of Gini / top share: rltldr_jax/analysis/delta_theta.py.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from rltldr_jax.cli.common import as_main, define_alias, define_model_path, define_path, parse_flags

_A = define_model_path(
    "base_checkpoint", None, "The original policy θ_base: HF directory or hub id, or Checkpointer DIR[:STEP]."
)
_B = define_model_path("checkpoint", None, "The trained policy θ_checkpoint: the same kinds as --base_checkpoint.")
define_alias("a", "base_checkpoint")
define_alias("b", "checkpoint")
_OUT = define_path("out", None, "Also write the table to this .csv or .json file.")
_PRESET = flags.DEFINE_string("preset", None, "Architecture preset for orbax checkpoints saved without a model config.")
_CONFIG_JSON = define_path("config_json", None, "HF config.json (or its directory), for the same.")
_BINS = flags.DEFINE_integer("bins_per_octave", 1024, "Histogram resolution (a power of two); Gini error ≤ 1/(8·this).")
_QUIET = flags.DEFINE_bool("quiet", False, "No per-tensor progress lines on stderr.")


def run_comparison(
    a: str, b: str, *, out: str | None, preset: str | None, config_json: str | None, bins_per_octave: int, quiet: bool
) -> int:
    """The CLI without flag parsing: prints the table; 0 on success, 2 (with a message on stderr) on an error."""
    from rltldr_jax.analysis.delta_theta import (
        DeltaThetaError,
        compare,
        format_table,
        write_rows,
    )
    from rltldr_jax.models import Qwen35Config, get_preset

    try:
        if out is not None and not out.endswith((".csv", ".json")):
            raise ValueError(f"--out={out!r}: the file must end in .csv or .json")
        if preset and config_json:
            raise ValueError("give --preset or --config_json, not both")
        config = None
        if preset:
            config = get_preset(preset)
        elif config_json:
            path = os.path.join(config_json, "config.json") if os.path.isdir(config_json) else config_json
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no config file {path!r}")
            with open(path, encoding="utf-8") as f:
                config = Qwen35Config.from_hf_dict(json.load(f))
        progress = None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        report = compare(a, b, config=config, bins_per_octave=bins_per_octave, progress=progress)
    except (DeltaThetaError, FileNotFoundError, ValueError) as e:
        print(f"delta_theta: error: {e}", file=sys.stderr)
        return 2
    rows = report.rows()
    print(f"Δθ = θ_checkpoint − θ_base\n  base = {report.a}\n  checkpoint = {report.b}")
    print(format_table(rows))
    if out:
        meta = {"a": report.a, "b": report.b, "bins_per_octave": bins_per_octave, "definition": "delta = b - a"}
        write_rows(out, rows, meta=meta)
        print(f"wrote {out}")
    return 0


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(
            f"unexpected arguments {argv[1:]}; options are flags, e.g. --base_checkpoint=PATH --checkpoint=PATH"
        )
    if not _A.value or not _B.value:
        sys.exit("error: give both --base_checkpoint (the original policy) and --checkpoint (the trained one)")
    from rltldr_jax.cli.common import quiet_logging

    quiet_logging()  # orbax logs every restore at INFO through absl
    sys.exit(
        run_comparison(
            _A.value,
            _B.value,
            out=_OUT.value,
            preset=_PRESET.value,
            config_json=_CONFIG_JSON.value,
            bins_per_octave=_BINS.value,
            quiet=_QUIET.value,
        )
    )


def run() -> None:
    """`rltldr-delta-theta` (console script) and `python launch/delta_theta.py`."""
    as_main(__name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
