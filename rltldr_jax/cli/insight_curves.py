"""Insight exploration curves (App. E.8, Figures 11/12): Pass@k of a frozen policy against the number of attempts
(and insights in context), for i.i.d. attempts, the latest insight only, and all insights so far.

    python launch/insight_curves.py --config=configs/sapi.py:tiny --max_k=4 --num_tasks=4      # random tiny weights
    python launch/insight_curves.py --config=configs/sapi.py --checkpoint=/ckpt/qwen3_5_9b --max_k=16
    python launch/insight_curves.py --config=configs/sapi.py --checkpoint=runs/sapi-rltldr/checkpoints:120 \\
        --modes=latest,sequential --task_ids=hard_tasks.txt --out=/tmp/curves

The config flags are those of launch/train.py (`--config=FILE[:PRESET]`, `--ablation=NAME`, `--config.KEY=VALUE`,
`--dry_run`; parsed by rltldr_jax/cli/common.py): rollout budgets and sampling, the insight writer (`insight.source`,
content, budgets; `insight.max_insights` is n_fb of the sequential mode) and the engine (`engine.kind`; with
jax_grpc/sglang the servers must already serve the `--checkpoint` weights). `--checkpoint` is an HF directory (or a
hub id `org/name[@revision]`) or a run's checkpoint directory `DIR[:STEP]` (default `model.checkpoint`; random weights
for the tiny preset).

Writes into `--out` (default `{workdir}/insight_curves`): insight_curves.csv (mode, k, pass_at_k, n_tasks,
mean_insights), insight_curves_attempts.csv (one row per attempt) and insight_curves.png; with
`--save_rollouts`, also rollouts_{mode}.jsonl (the training rollouts' format). Paper, base Qwen 3.5 9B at k = 16:
sequential ~57 %, latest ~38 %, i.i.d. ~6 % on Pass@128 ~ 0 tasks (Fig. 11); ~66/54/13 % (Fig. 12).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from rltldr_jax.cli.common import (
    as_main,
    define_config_flags,
    define_model_path,
    define_path,
    describe,
    parse_flags,
    quiet_logging,
    resolve_config,
    use_compile_cache,
    with_pretrained,
)

_CONFIG, _ABLATION = define_config_flags("A named baseline/ablation of rltldr_jax/config/ablations.py.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config and exit.")
_CHECKPOINT = define_model_path(
    "checkpoint",
    None,
    "The frozen policy: an HF directory or hub id, or a run's checkpoints DIR[:STEP] (default: model.checkpoint).",
)
_MODES = flags.DEFINE_string("modes", "iid,latest,sequential", "Comma-separated modes: iid, latest, sequential.")
_MAX_K = flags.DEFINE_integer("max_k", 16, "Attempts per task of the chain modes; the largest k of every curve.")
_IID_SAMPLES = flags.DEFINE_integer("iid_samples", None, "Attempts per task of iid (>= max_k; default max_k).")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", None, "Tasks (default: eval.num_tasks; 0 = the whole split).")
_SPLIT = flags.DEFINE_string("split", None, "Task split (default: env.train_split, as in the paper).")
_TASK_IDS = define_path("task_ids", None, "A file with one task id per line: only these tasks (e.g. Pass@128 = 0).")
_OUT = define_path("out", None, "Output directory (default: {workdir}/insight_curves).")
_SAVE_ROLLOUTS = flags.DEFINE_bool("save_rollouts", False, "Also write every mode's attempts as rollouts_{mode}.jsonl.")


def _read_ids(path: str) -> list[str]:
    if not os.path.isfile(path):
        sys.exit(f"error: --task_ids={path!r} is not a file (one task id per line)")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def _policy(config, checkpoint: str | None):
    """(model, description, tokenizer path or None) of the frozen policy."""
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import load_model
    from rltldr_jax.models import ModelSpec, get_preset

    dtype, param_dtype = getattr(jnp, config.model.dtype), getattr(jnp, config.model.param_dtype)
    path = checkpoint or config.model.checkpoint
    tokenizer = config.tokenizer or config.model.checkpoint or None
    if path:
        model, what = load_model(
            path, compute_dtype=dtype, param_dtype=param_dtype, allow_nonfinite=config.model.allow_nonfinite
        )
        if not config.tokenizer and os.path.isfile(os.path.join(path, "tokenizer.json")):
            tokenizer = path
        return model, what, tokenizer
    if config.model.preset != "tiny":
        raise ValueError(
            f"model.preset={config.model.preset} needs --checkpoint (an HF directory or runs/X/checkpoints[:STEP]) "
            "or model.checkpoint; only the tiny preset runs on random weights"
        )
    model = ModelSpec(get_preset("tiny"), dtype=dtype, param_dtype=param_dtype).build(seed=config.seed)
    return model, f"random tiny weights (seed {config.seed})", tokenizer


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --max_k=8")
    config = resolve_config(_CONFIG, _ABLATION)
    if _DRY_RUN.value:
        print(describe(config))
        return
    quiet_logging()
    use_compile_cache(config.compile.cache_dir)
    config = with_pretrained(config)
    from rltldr_jax.agent.insight import InsightWriter
    from rltldr_jax.agent.rollout_files import save_phase
    from rltldr_jax.analysis import insight_curves as ic
    from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine, teacher_engine
    from rltldr_jax.tokenization import context_builder, load_tokenizer
    from rltldr_jax.train.setup import env_maker, workdir_of

    try:
        modes = ic.parse_modes(_MODES.value)
        if _MAX_K.value < 1:
            raise ValueError(f"--max_k must be >= 1, got {_MAX_K.value}")
        if _IID_SAMPLES.value is not None and _IID_SAMPLES.value < _MAX_K.value:
            raise ValueError(f"--iid_samples={_IID_SAMPLES.value} must be >= --max_k={_MAX_K.value}")
        task_ids = _read_ids(_TASK_IDS.value) if _TASK_IDS.value else None
        tasks = ic.curve_tasks(config, split=_SPLIT.value, num_tasks=_NUM_TASKS.value, task_ids=task_ids)
        model, what, tokenizer_path = _policy(config, _CHECKPOINT.value)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    out = _OUT.value or os.path.join(workdir_of(config), "insight_curves")
    os.makedirs(out, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_path)
    builder = context_builder(config, tokenizer)
    print(f"policy: {what}; {len(tasks)} tasks; modes {', '.join(modes)}; max_k={_MAX_K.value}; out {out}")

    engine_config = EngineConfig.of(config)
    engine = policy_engine(engine_config, model, workdir=out)
    teacher, teacher_tokenizer = (None, None)
    try:
        writer = None
        if any(m != "iid" for m in modes):
            teacher, teacher_tokenizer = teacher_engine(engine_config)
            writer = InsightWriter.of(config, tokenizer, engine, teacher, teacher_tokenizer)

        def report(r: ic.CurveResult) -> None:
            points = ", ".join(f"@{k}={100 * r.pass_at_k[k - 1]:.1f}%" for k in sorted({1, min(5, r.max_k), r.max_k}))
            print(f"{r.mode:>10}: Pass{points} over {r.n_tasks} tasks; {r.phase.parse_failures} insight parse failures")
            if _SAVE_ROLLOUTS.value:
                save_phase(os.path.join(out, f"rollouts_{r.mode}.jsonl"), ic.CURVE_PHASE, r.phase)

        results = ic.insight_curves(
            engine,
            builder,
            config,
            tasks=tasks,
            writer=writer,
            modes=modes,
            max_k=_MAX_K.value,
            iid_samples=_IID_SAMPLES.value,
            progress=sys.stderr.isatty(),
            on_mode=report,
            make_env=env_maker(config),
        )
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    finally:
        close_engine(engine)
        close_engine(teacher)
    for path in ic.write_curves(results, out):
        print(f"wrote {path}")


def run() -> None:
    """`rltldr-insight-curves` (console script) and `python launch/insight_curves.py`."""
    as_main(__name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
