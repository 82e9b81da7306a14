"""Evaluate a policy on held-out tasks: a fixed number of attempts per task, no insights; macro Pass@1 and Pass@K.

    python launch/eval.py --config=configs/sapi.py:tiny                                  # the run's latest checkpoint
    python launch/eval.py --config=configs/sapi.py:tiny --checkpoint=runs/sapi-tiny/checkpoints:2
    python launch/eval.py --config=configs/sapi.py --checkpoint=/ckpt/qwen3_5_9b --config.engine.kind=jax
    python launch/eval.py --config=configs/sapi.py --config.engine.servers=h1:30000 --config.engine.http_servers=...

The config gives the environment (`env.eval_split`), the number of tasks and attempts (`eval.num_tasks`,
`eval.attempts_per_task`, 8 in the paper) and the rollout budgets; `--config.KEY=VALUE` overrides as in
launch/train.py. `--checkpoint` is an HF directory (or a hub id `org/name[@revision]`, as `model.checkpoint`) or a
training checkpoint directory (`DIR[:STEP]`, default the latest step); without it, the latest checkpoint of the
config's workdir, else `model.checkpoint`, else the base policy of `pretrain.*` (pretrained first if it is not
cached: the only case that pretrains), else the preset's random initialisation (tiny only). The policy is evaluated
with its own tokenizer: an HF directory's tokenizer.json, or the tokenizer a training checkpoint's run used (recorded
with it); a checkpoint whose architecture or tokenizer differs from the policy the config names (`tokenizer`,
`model.checkpoint`, or pretraining) is refused in one line, as is a damaged checkpoint (its checksums). With
engine.kind=jax_grpc|sglang the servers must already be running; the weights are pushed to them first (as the trainer
does). Writes `{workdir}/eval/eval_{name}.json` (or `--out`) with every metric and the per-task successes, and prints
the headline numbers.
"""

from __future__ import annotations

import sys

from absl import app

from rltldr_jax.cli.common import (
    as_main,
    check_runnable,
    define_config_flags,
    define_model_path,
    define_path,
    parse_flags,
    quiet_logging,
    resolve_config,
    use_compile_cache,
)

_CONFIG, _ABLATION = define_config_flags(
    "A named baseline/ablation of rltldr_jax/config/ablations.py (its eval settings)."
)
_CHECKPOINT = define_model_path(
    "checkpoint", None, "HF directory or hub id org/name[@revision], or a training checkpoint directory DIR[:STEP]."
)
_OUT = define_path("out", None, "Where to write the JSON (default {workdir}/eval/eval_{checkpoint}.json).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --checkpoint=DIR")
    config = resolve_config(_CONFIG, _ABLATION)
    check_runnable(config, weights=False)  # the servers of engine.kind, before any weights load
    quiet_logging()
    use_compile_cache(config.compile.cache_dir)
    from rltldr_jax.train.evaluation import evaluate_checkpoint

    try:
        evaluate_checkpoint(config, _CHECKPOINT.value, _OUT.value)  # (pretrains only a base policy it evaluates)
    except (ValueError, OSError) as e:  # a mismatched or damaged checkpoint, a read-only --out, ...
        sys.exit(f"error: {e}")


def run() -> None:
    """`rltldr-eval` (console script) and `python launch/eval.py`."""
    as_main(__name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
