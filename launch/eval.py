"""Evaluate a policy on held-out tasks: a fixed number of attempts per task, no insights; macro Pass@1 and Pass@K.

    python launch/eval.py --config=configs/sapi.py:tiny                                  # the run's latest checkpoint
    python launch/eval.py --config=configs/sapi.py:tiny --checkpoint=runs/sapi-tiny/checkpoints:2
    python launch/eval.py --config=configs/sapi.py --checkpoint=/ckpt/qwen3_5_9b --config.engine.kind=jax
    python launch/eval.py --config=configs/sapi.py --config.engine.servers=h1:30000 --config.engine.http_servers=...

The config gives the environment (`env.eval_split`), the number of tasks and attempts (`eval.num_tasks`,
`eval.attempts_per_task`, 8 in the paper) and the rollout budgets; `--config.KEY=VALUE` overrides as in
launch/train.py. `--checkpoint` is an HF directory or a training checkpoint directory (`DIR[:STEP]`, default the
latest step); without it, the latest checkpoint of the config's workdir, else `model.checkpoint`, else the
preset's random initialisation (tiny only). With engine.kind=grpc|sglang the servers must already be running; the
weights are pushed to them first (as the trainer does). Writes `{workdir}/eval/eval_{name}.json` (or `--out`)
with every metric and the per-task successes, and prints the headline numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # configs/ is a directory of the repository, not an installed package

from configs import ablations, base  # noqa: E402
from launch.common import parse_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(REPO_ROOT, "configs", "sapi.py"), "Config file, with an optional :preset.", lock_config=True
)
_ABLATION = flags.DEFINE_string("ablation", None, "A named baseline/ablation of configs/ablations.py (its eval settings).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "HF directory, or a training checkpoint directory DIR[:STEP].")
_OUT = flags.DEFINE_string("out", None, "Where to write the JSON (default {workdir}/eval/eval_{checkpoint}.json).")


def _policy(config, checkpoint: str | None):
    """(model, description, training step or None) of the policy to evaluate."""
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import Checkpointer, load_model, split_step
    from rltldr_jax.models import ModelSpec, get_preset
    from rltldr_jax.train.loop import workdir_of

    dtype = getattr(jnp, config.model.dtype)
    if checkpoint is None:
        run = os.path.join(workdir_of(config), "checkpoints")
        if os.path.isdir(run) and Checkpointer(run, keep=None, async_save=False, create=False).latest_step() is not None:
            checkpoint = run
        elif config.model.checkpoint:
            checkpoint = config.model.checkpoint
    if checkpoint is not None:
        model, what = load_model(checkpoint, compute_dtype=dtype, param_dtype=getattr(jnp, config.model.param_dtype))
        directory, step = split_step(checkpoint)
        if step is None and not os.path.isfile(os.path.join(directory, "config.json")):
            step = Checkpointer(directory, keep=None, async_save=False, create=False).latest_step()
        return model, what, step
    if config.model.preset != "tiny":
        raise ValueError(
            f"nothing to evaluate: no checkpoint in {workdir_of(config)}/checkpoints and no model.checkpoint; give "
            "--checkpoint=DIR (an HF directory or a run's checkpoints, DIR:STEP for a given step)"
        )
    spec = ModelSpec(get_preset("tiny"), dtype=dtype, param_dtype=getattr(jnp, config.model.param_dtype))
    return spec.build(seed=config.seed), "the tiny preset's random initialisation", None


def run(config, checkpoint: str | None, out: str | None) -> dict:
    """Evaluates and writes the JSON; returns it."""
    from rltldr_jax.engines.factory import policy_engine
    from rltldr_jax.envs import make_env
    from rltldr_jax.tokenization import ContextBuilder, load_tokenizer
    from rltldr_jax.train.evaluation import evaluate
    from rltldr_jax.train.loop import workdir_of

    model, what, step = _policy(config, checkpoint)
    tokenizer = load_tokenizer(config.tokenizer or (config.model.checkpoint or None))
    builder = ContextBuilder(tokenizer, thinking=config.rollout.thinking)
    workdir = workdir_of(config)
    engine = policy_engine(config, model, workdir=workdir)
    try:
        if config.engine.kind != "jax":
            engine.update_weights(model, engine.weight_version + 1)  # serve exactly the evaluated weights
        e = config.env
        t0 = time.time()
        metrics, result = evaluate(
            # The sampling seeds of the trainer's own evaluation after phase `step`: evaluating training checkpoint N
            # here repeats the in-training evaluation after phase N (exactly, with one task at a time).
            engine, builder, config, tag=step or 0, progress=sys.stderr.isatty(),
            make_env=lambda: make_env(e.name, step_timeout_s=e.step_timeout_s, memory_limit_mb=e.memory_limit_mb),
        )  # fmt: skip
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    per_task = {tid: [a.success for a in group] for tid, group in result.groups().items()}
    report = {
        "policy": what, "env": config.env.name, "split": config.env.eval_split,
        "attempts_per_task": config.eval.attempts_per_task, "seconds": round(time.time() - t0, 1),
        "metrics": metrics, "per_task": per_task,
    }  # fmt: skip
    if out is None:
        tag = os.path.basename(os.path.normpath(checkpoint.replace(":", "_"))) if checkpoint else "latest"
        out = os.path.join(workdir, "eval", f"eval_{tag}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=float)
    k = config.eval.attempts_per_task
    print(f"{what}: {len(per_task)} tasks × {k} attempts of {config.env.name}/{config.env.eval_split}")
    print(f"  macro Pass@1 = {metrics['eval/pass@1/all']:.4f}   macro Pass@{k} = {metrics[f'eval/pass@{k}/all']:.4f}")
    print(f"  written to {out}")
    return report


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --checkpoint=DIR")
    try:
        config = ablations.resolve(_CONFIG.value, _ABLATION.value, config_flags.get_override_values(flags.FLAGS["config"]))
    except base.ConfigError as e:
        sys.exit(f"error: {e}")
    import logging

    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        run(config, _CHECKPOINT.value, _OUT.value)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
