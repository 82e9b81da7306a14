"""The base policy's checks before RL (paper App. B and E.8), on the frozen pretrained checkpoint.

    checks, curves = base_checks(config)      # config.model.checkpoint = the pretrained policy
    checks["iid_pass@64"]                     # i.i.d. Pass@64 on the hard training tasks: must be 0
    checks["sequential_pass@1_insight"]       # success of attempts with insights in context
    write_curves(curves, out_dir)             # Fig. 11: i.i.d. / latest insight / sequential insights

The paper asks to check, before training, that the policy cannot solve the split on its own (Pass@128 = 0 there,
§4.1) and that insights help it (App. B, Fig. 11). Here both are measured with the real collector, engine and
rule-based insight writer: i.i.d. attempts without insights (as GRPO samples them), and sequential chains whose
later attempts see the insights written after the earlier failures (`analysis.insight_curves`). Also measured,
without insights and with the evaluation's protocol: the base policy's no-insight Pass@1 on the held-in and
held-out tasks (the step-0 point of every arm's curves) and on tasks the public plan solves (does pretraining
work at all?).
"""

from __future__ import annotations

from rltldr_jax.agent.eval_set import attempt_records, eval_tasks, split_eval_tasks
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.analysis.insight_curves import CurveResult, curve_tasks, insight_curves
from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine
from rltldr_jax.metrics import insight_advantage
from rltldr_jax.settings import Settings, replace
from rltldr_jax.tokenization import context_builder
from rltldr_jax.train.evaluation import evaluate, policy_for_eval
from rltldr_jax.train.setup import env_maker, policy_tokenizer


def base_checks(
    config: Settings,
    *,
    iid_samples: int = 64,
    max_k: int = 8,
    num_tasks: int = 48,
    easy_split: str = "train_easy",
    progress: bool = False,
) -> tuple[dict[str, float], dict[str, CurveResult]]:
    """Measures the frozen policy of `config.model.checkpoint` (see the module docstring).

    Args:
      config: a resolved replication config (its insight writer, rollout budgets and evaluation protocol are used).
      iid_samples: i.i.d. attempts per hard task (Pass@k for k up to this).
      max_k: attempts per task of the sequential and latest-insight chains.
      num_tasks: hard training tasks measured (and easy tasks for the sanity check).
      easy_split: a split the public rules solve; "" skips that check.
      progress: progress bars of every collection ("base checks", then "evaluation": `progress.phase_label`).

    Returns:
      (checks, curves): `checks` holds `iid_pass@1`, `iid_pass@{max_k}`, `iid_pass@{iid_samples}`,
      `latest_pass@{max_k}`, `sequential_pass@{max_k}`, `sequential_pass@1_insight` (success of the attempts
      with insights in context), `insight_advantage` (App. D.2), `heldin_pass@1` / `heldout_pass@1` (the evaluation
      at step 0), `{split}_pass@1` for every set of `eval.splits` (a world's tiers) and `easy_pass@1`; `curves` the
      three modes' Pass@k curves (k <= max_k).
    """
    model, _, _ = policy_for_eval(config, config.model.checkpoint)
    tokenizer = policy_tokenizer(config)
    builder = context_builder(config, tokenizer)
    make_env = env_maker(config)
    engine = policy_engine(EngineConfig.of(config), model, workdir=config.workdir or ".")
    checks: dict[str, float] = {}
    try:
        writer = InsightWriter.of(config, tokenizer, engine)
        tasks = curve_tasks(config, num_tasks=num_tasks)
        iid = insight_curves(
            engine,
            builder,
            config,
            tasks=tasks,
            make_env=make_env,
            writer=writer,
            modes="iid",
            max_k=iid_samples,
            progress=progress,
        )["iid"]
        curves = insight_curves(
            engine,
            builder,
            config,
            tasks=tasks,
            make_env=make_env,
            writer=writer,
            modes="latest,sequential",
            max_k=max_k,
            progress=progress,
        )
        curves = {"iid": _truncated(iid, max_k), **curves}
        checks |= {
            "iid_pass@1": float(iid.pass_at_k[0]),
            f"iid_pass@{max_k}": float(iid.pass_at_k[max_k - 1]),
            f"iid_pass@{iid_samples}": float(iid.pass_at_k[-1]),
        }
        for mode in ("latest", "sequential"):
            checks[f"{mode}_pass@{max_k}"] = float(curves[mode].pass_at_k[-1])
        records = attempt_records(curves["sequential"].phase)
        with_insight = [r.success for r in records if r.had_insights]
        checks["sequential_pass@1_insight"] = (
            float(sum(with_insight) / len(with_insight)) if with_insight else float("nan")
        )
        checks["insight_advantage"] = insight_advantage(records)
        held_out, _ = evaluate(engine, builder, config, make_env=make_env, tag=0, progress=progress)
        held_in, _ = evaluate(
            engine,
            builder,
            config,
            make_env=make_env,
            tag=0,
            tasks=eval_tasks(config, on_train_split=True),
            prefix="eval_train",
            progress=progress,
        )
        checks["heldout_pass@1"] = held_out["eval/pass@1/all"]
        checks["heldin_pass@1"] = held_in["eval_train/pass@1/all"]
        for split, tasks in split_eval_tasks(config).items():  # eval.splits: a world's tiers, before any RL
            measured, _ = evaluate(
                engine, builder, config, make_env=make_env, tag=0, tasks=tasks, prefix=split, progress=progress
            )
            checks[f"{split}_pass@1"] = measured[f"{split}/pass@1/all"]
        if easy_split:
            easy = replace(config, {"env.eval_split": easy_split, "eval.num_tasks": num_tasks})
            easy_eval = evaluate(engine, builder, easy, make_env=make_env, tag=0, progress=progress)
            checks["easy_pass@1"] = easy_eval[0]["eval/pass@1/all"]
    finally:
        close_engine(engine)
    return checks, curves


def _truncated(result: CurveResult, max_k: int) -> CurveResult:
    """An i.i.d. curve cut to k <= max_k (its estimator uses all N samples)."""
    import dataclasses

    return dataclasses.replace(result, pass_at_k=result.pass_at_k[:max_k], mean_insights=result.mean_insights[:max_k])
