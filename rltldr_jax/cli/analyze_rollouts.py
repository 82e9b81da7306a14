"""Analyse a training run's saved rollouts: tables (CSV) and plots (PNG) of the paper's appendix analyses.

    python launch/analyze_rollouts.py --run=runs/sapi-rltldr                       # evolution, revisits, categories
    python launch/analyze_rollouts.py --run=runs/sapi-rltldr --analysis=revisits --out=/tmp/revisits
    python launch/analyze_rollouts.py --run=runs/sapi-rltldr --analysis=reliance \\
        --checkpoint=runs/sapi-rltldr/checkpoints            # latest step; or checkpoints:120, or an HF directory
    python launch/analyze_rollouts.py --run=... --analysis=reliance --checkpoint=runs/X/checkpoints \\
        --reliance_policy=per_phase

Reads `{run}/rollouts/phase_*.jsonl` (written when `rollout.save_rollouts=True`, the default). Analyses
(`rltldr_jax.analysis`): `evolution` (E.4, insight dissimilarity within vs across visits), `revisits` (E.2,
success at first vs last visit), `categories` (Table 5), `reliance` (E.5, needs the policy: `--checkpoint`);
`all` runs the first three, and reliance too when `--checkpoint` is given. Each writes NAME.csv (summary) and
NAME.png, plus a per-item CSV, into `--out` (default `{run}/analysis`).

Reliance rebuilds the training contexts, so it needs the run's tokenizer and thinking mode: by default those
recorded with the run's checkpoints (`config.tokenizer` / `config.model.checkpoint`, `config.rollout.thinking`),
else the HF checkpoint's tokenizer.json, else the built-in Qwen 3.5 tokenizer and thinking on; `--tokenizer`
and `--thinking` override.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from rltldr_jax.cli.common import as_main, define_model_path, define_path, parse_flags

ANALYSES = ("evolution", "revisits", "categories", "reliance")

_RUN = define_path("run", None, "The run's workdir (holding rollouts/phase_*.jsonl), e.g. runs/sapi-rltldr.")
_ANALYSIS = flags.DEFINE_enum("analysis", "all", (*ANALYSES, "all"), "Which analysis to run.")
_OUT = define_path("out", None, "Output directory for the CSVs and PNGs (default: {run}/analysis).")
_CHECKPOINT = define_model_path(
    "checkpoint",
    None,
    "Reliance: the policy, an HF directory or hub id, or a run's checkpoints DIR[:STEP] (default: latest step).",
)
_POLICY = flags.DEFINE_enum(
    "reliance_policy",
    "fixed",
    ("fixed", "per_phase"),
    "Reliance: score every phase with --checkpoint (fixed), or each phase with the training checkpoint that "
    "sampled it (per_phase; --checkpoint must be a run's checkpoints directory that kept them).",
)
_TOKENIZER = define_model_path(
    "tokenizer", None, "Reliance: tokenizer.json, directory or hub id (default: the run's).", what="tokenizer"
)
_THINKING = flags.DEFINE_bool("thinking", None, "Reliance: thinking-mode contexts (default: the run's, else on).")
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", ("float32", "bfloat16"), "Reliance: activation dtype of the forward pass."
)
_MAX_PER_PHASE = flags.DEFINE_integer(
    "max_per_phase", 0, "Reliance: score at most this many attempts per phase (0 = all)."
)
_BATCH = flags.DEFINE_integer("batch_size", 4, "Reliance: contexts per forward pass.")
_UNIQUE = flags.DEFINE_bool("unique_insights", False, "Categories: count each distinct insight of a task once.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the permutation test's Monte Carlo draws and of --max_per_phase.")


def _fmt(summary: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())


def _builder(checkpoint: str):
    """The run's ContextBuilder: tokenizer and thinking mode from the flags, else the recorded config; the insight
    scaffold of the recorded insight content (`tokenization.insight_scaffold`: SGE runs insert their summaries
    under their own)."""
    from rltldr_jax.analysis.reliance import recorded_run_config
    from rltldr_jax.checkpoint import split_step
    from rltldr_jax.tokenization import ContextBuilder, insight_scaffold, load_tokenizer

    directory = split_step(checkpoint)[0]
    recorded = recorded_run_config(directory) or recorded_run_config(os.path.join(_RUN.value, "checkpoints"))
    tokenizer = _TOKENIZER.value
    if tokenizer is None:
        candidates = [recorded.get("tokenizer"), (recorded.get("model") or {}).get("checkpoint"), directory]
        tokenizer = next(
            (
                c
                for c in candidates
                if c and os.path.exists(os.path.join(c, "tokenizer.json") if os.path.isdir(c) else c)
            ),
            None,
        )
    thinking = _THINKING.value
    if thinking is None:
        thinking = bool((recorded.get("rollout") or {}).get("thinking", True))
    content = (recorded.get("insight") or {}).get("content", "hint")
    print(
        f"reliance contexts: tokenizer {tokenizer or 'built-in Qwen 3.5'}, thinking={thinking}, "
        f"insight content {content}"
    )
    return ContextBuilder(load_tokenizer(tokenizer), thinking=thinking, insight_scaffold=insight_scaffold(content))


def _reliance(records, out: str) -> list[str]:
    import jax.numpy as jnp

    from rltldr_jax.analysis.reliance import (
        insight_reliance,
        load_policy,
        per_phase_policy,
        write_reliance,
    )
    from rltldr_jax.checkpoint import split_step

    if not _CHECKPOINT.value:
        raise ValueError(
            "--analysis=reliance needs the policy: --checkpoint=runs/X/checkpoints[:STEP] or an HF directory"
        )
    dtype = getattr(jnp, _DTYPE.value)
    builder = _builder(_CHECKPOINT.value)
    if _POLICY.value == "per_phase":
        directory, step = split_step(_CHECKPOINT.value)
        if step is not None:
            raise ValueError(f"--reliance_policy=per_phase picks a step per phase; drop the ':{step}' of --checkpoint")
        policy = per_phase_policy(directory, compute_dtype=dtype)
        print(f"reliance policy: per phase, from {directory}")
    else:
        policy, what = load_policy(_CHECKPOINT.value, compute_dtype=dtype)
        print(f"reliance policy: {what}")
    result = insight_reliance(
        records, policy, builder, max_per_phase=_MAX_PER_PHASE.value or None, seed=_SEED.value, batch_size=_BATCH.value
    )
    if not result.attempts:
        print("reliance: no successful attempt with insights in context to score")
    print(f"reliance: {_fmt(result.summary())}")
    return write_reliance(result, out)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --run=runs/sapi-rltldr")
    if not _RUN.value:
        raise app.UsageError("--run is required: the run's workdir, e.g. --run=runs/sapi-rltldr")
    from rltldr_jax.cli.common import quiet_logging

    quiet_logging()  # orbax logs every checkpoint lookup at INFO through absl
    from rltldr_jax.agent.rollout_files import load_rollouts, rollouts_dir
    from rltldr_jax.analysis import rollouts as ro

    out = _OUT.value or os.path.join(_RUN.value, "analysis")
    wanted = (
        [_ANALYSIS.value] if _ANALYSIS.value != "all" else [*ANALYSES[:3], *(["reliance"] if _CHECKPOINT.value else [])]
    )
    try:
        records = load_rollouts(_RUN.value)
    except (FileNotFoundError, ValueError) as e:
        print(f"analyze_rollouts: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(records)} attempts in {len({r.phase for r in records})} phases from {rollouts_dir(_RUN.value)}")
    written: list[str] = []
    failed: list[str] = []
    for name in wanted:
        try:
            if name == "evolution":
                result = ro.insight_evolution(records)
                written += ro.write_evolution(result, out)
            elif name == "revisits":
                result = ro.revisited_tasks(records, seed=_SEED.value)
                written += ro.write_revisits(result, out)
            elif name == "categories":
                result = ro.insight_categories(records, unique=_UNIQUE.value)
                written += ro.write_categories(result, out)
            else:
                written += _reliance(records, out)
                continue
            print(f"{name}: {_fmt(result.summary())}")
        except (FileNotFoundError, ValueError) as e:
            print(f"analyze_rollouts: {name}: error: {e}", file=sys.stderr)
            if _ANALYSIS.value != "all":
                return 2
            failed.append(name)
    if _ANALYSIS.value == "all" and not _CHECKPOINT.value:
        print("reliance: skipped (it needs the policy: --checkpoint=runs/X/checkpoints[:STEP] or an HF directory)")
    print(f"wrote {len(written)} files to {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def run() -> None:
    """`rltldr-analyze-rollouts` (console script) and `python launch/analyze_rollouts.py`."""
    as_main(__name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
