"""The second round of the small-scale replication: the forge world (hidden rules over public kinds of items, four
evaluation tiers), controls that can fail, stable optimisation and a base policy that writes insights.

    python launch/replicate.py --config=configs/replicate_v2.py              # the pre-registered grid
    python launch/replicate.py --config=configs/replicate_v2.py:pilot        # pilots (seeds >= 100, valid only)
    python launch/train.py --config=configs/replicate_v2.py --ablation=grpo  # one arm as an ordinary run

What round one could not answer, and what this round changes (the design and its reasons; the pre-registration,
docs/replication/v2/preregistration.md, fixes the numbers reported):
- **A world whose splits test rules** (`envs/forge.py`): a gather of an item of a ruled kind needs that kind's
  tool; gated items occur in many recipes at varied lines of the plan; tier 1 = held-in tasks, tier 2 = held-out
  targets, tier 3 = held-out gated items of trained kinds (rule generalisation), tier 4 = a wholly held-out kind
  (a negative control, expected ~0); `valid` = held-in tasks for choosing a checkpoint (never a held-out tier).
- **Evaluation that measures**: fixed sets, the same for every seed (`eval.splits`, ordered by `env.seed`), every 5
  phases, no insights; the final value, the value at the evaluation chosen on `valid` and the area under the curve
  (`replication/measures.py`).
- **Controls that can fail**: `strict_control` (insights of the same form and length that name neither a tool nor a
  gated item), `shuffled_control` (real hidden rules of other kinds), GRPO with K = 64 and at a higher temperature,
  SFT on successful rollouts, SFTL;DR.
- **Optimisation chosen on pilots** (seed 100, on `valid`): among a KL-to-reference term with a decaying learning
  rate that starts where pretraining ended, and round one's constant 1e-3 without KL, the pilots chose the latter and
  150 phases (the preset's comments give the numbers).
- **A base policy that writes insights**: pretraining trains half of its made-up insights as targets
  (`pretrain.write_prob`) and phrases a share of its sentences in other wordings (`pretrain.reword_prob`), so L_SFT
  starts from a policy for which insight tokens are a learnt output.
- λ = 0.5 for `rltldr`, the paper's (§3.3); `lambda_0` and `lambda_0.03` (round one's default) test it.

Presets: `default` (the grid), `pilot` (the same, seeds >= 100, for choices made before the grid), `quick` (GRPO and
RLTL;DR on seed 0 from its shipped base policy, shorter: a demonstration in minutes, not part of the grid) and `smoke`
(tiny budgets, for the tests). `GRIDS[preset]` = (arms, seeds), the seeds either one tuple for every arm or arm ->
seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rltldr_jax.config import base
from rltldr_jax.config import replicate as round_one

#: The λ of the `rltldr` arm: the paper's (§3.3).
DEFAULT_LAMBDA = 0.5

#: Arm name -> (ablation of rltldr_jax/config/ablations.py or None, extra overrides). Applied after the preset.
#: One name per arm: no two arms share their settings.
ARMS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "rltldr": (None, {}),
    # Not pre-registered, not in the default grid (added after it started): `rltldr` training rank-8 LoRA adapters
    # (α = 16) on every projection instead of every weight, on rltldr's seeds, reported beside it. The grid's install
    # predates LoRA, so it runs from a later one in its own directory beside that install's rltldr on the same seeds
    # (`--arms=rltldr,rltldr_lora --out=runs/replicate_v2_lora`; docs/replication/v2/lora/README.md).
    "rltldr_lora": (None, {"model.lora.rank": 8}),
    # Insights of the form and token length of real ones that name neither a tool nor a gated item.
    "strict_control": (None, {"insight.source": "uninformative"}),
    # A real hidden rule of another kind than the task's plans gather: true of the world, not about this failure.
    "shuffled_control": (None, {"insight.source": "shuffled"}),
    "lambda_0": ("lambda_0", {}),
    "lambda_0.03": (None, {"loss.lam": 0.03}),
    "grpo": ("grpo", {}),
    # K = 64 attempts of one task per phase: the same attempts per phase and phases as every arm.
    "grpo_k64": ("grpo", {"rollout.tasks_per_phase": 1, "rollout.group_size": 64}),
    # Sampling at temperature 1.5; the importance ratio is taken against the tempered sampler's logprobs (an
    # off-policy correction), so the sampler-vs-trainer logprob check is off.
    "grpo_hot": ("grpo", {"rollout.temperature": 1.5, "train.max_logprob_gap": 0.0}),
    # Offline, on the successful rollouts of this seed's `rltldr` run (Table 2's strongest offline baseline).
    "sft_rollouts": ("sft_rollouts_all", {}),
    # Offline SFTL;DR (Table 2) on the (task, insight) pairs of this seed's `rltldr` run.
    "sftldr": ("sftldr", {}),
}

#: Arms added after the pre-registration: arm -> (the arm it is reported beside, what it is). results.md gives each
#: its own section (its differences from that arm on every tier), apart from the pre-registered analysis.
ADDED_ARMS: dict[str, tuple[str, str]] = {
    "rltldr_lora": (
        "rltldr",
        "`rltldr` training rank-8 LoRA adapters (α = 16, every projection) instead of every weight",
    ),
}

#: Arms whose runs are kept in another grid directory than the grid's: arm -> that directory's name, beside the
#: grid's `--out` (runs/replicate_v2_lora beside runs/replicate_v2). The report reads their finished runs from
#: there; the launcher refuses to run them in the grid's directory. `rltldr_lora` runs from a later install than the
#: grid's, with its own `rltldr` twin of seed 0 (not read into the grid's report).
ARM_DIRS: dict[str, str] = {"rltldr_lora": "replicate_v2_lora"}

#: The arms of the pre-registered grid (docs/replication/v2/preregistration.md), in the report's order.
PREREGISTERED_ARMS = tuple(a for a in ARMS if a not in ADDED_ARMS)

#: Seeds per arm of the grid: 20 for RLTL;DR and the strict control (the primary comparison), 10 for each λ arm and
#: the shuffled control, 3 for the arms expected at 0 (GRPO) and the offline baselines.
GRID_SEEDS: dict[str, tuple[int, ...]] = {
    "rltldr": tuple(range(20)),
    "strict_control": tuple(range(20)),
    "shuffled_control": tuple(range(10)),
    "lambda_0": tuple(range(10)),
    "lambda_0.03": tuple(range(10)),
    "grpo": tuple(range(3)),
    "grpo_k64": tuple(range(3)),
    "grpo_hot": tuple(range(3)),
    "sft_rollouts": tuple(range(3)),
    "sftldr": tuple(range(3)),
    "rltldr_lora": tuple(range(20)),  # (rltldr's)
}

#: preset -> (default arms, seeds: one tuple for every arm, or arm -> seeds).
GRIDS: dict[str, tuple[tuple[str, ...], tuple[int, ...] | Mapping[str, tuple[int, ...]]]] = {
    "default": (PREREGISTERED_ARMS, GRID_SEEDS),
    # Pilots: seeds >= 100 only (never a seed of the grid), choices made on `valid` alone.
    "pilot": (("rltldr",), (100,)),
    # The demonstration (minutes): GRPO and RLTL;DR on seed 0, whose base policy ships with the package.
    "quick": (("grpo", "rltldr"), (0,)),
    # Two arms with their own seeds, one offline arm (reads rltldr's rollouts of its seed).
    "smoke": (("grpo", "rltldr", "sftldr"), {"grpo": (0,), "rltldr": (0, 1), "sftldr": (1,)}),
}

#: Presets whose report has the pre-registered analysis section (`analysis`): the grid and its reduced forms, not the
#: one-seed demonstration.
ANALYSED_PRESETS = ("default", "pilot", "smoke")

#: preset -> runs at once (`--jobs`); 0: one per CPU core, at most 4.
JOBS: dict[str, int] = {"default": 0, "pilot": 0, "quick": 0, "smoke": 0}

#: preset -> sizes of the base policy's checks (replication/checks.py): Pass@64 = 0 is checked on every hard
#: training task (0 = the whole split).
CHECKS: dict[str, dict[str, int]] = {
    "default": {"iid_samples": 64, "num_tasks": 0},
    "pilot": {"iid_samples": 64, "num_tasks": 48},
    "quick": {"iid_samples": 64, "num_tasks": 32},
    "smoke": {"iid_samples": 2, "num_tasks": 2},
}

#: The evaluation sets, no insights, every `eval.every` phases, each logged as eval_<split>/ (tier 2 is also
#: env.eval_split, eval/: evaluated once, `train.evaluation.evaluate_all`).
EVAL_SPLITS = "valid,tier1,tier2,tier3,tier4"


def _default(c) -> None:
    round_one.PRESETS["default"](c)  # round one's small-scale settings (model, rollout, batch, engine, budgets)
    base.override(
        c,
        {
            "name": "replicate-v2",
            "env.name": "forge",
            "env.train_split": "train",
            "env.eval_split": "tier2",
            "loss.lam": DEFAULT_LAMBDA,
            # Chosen on pilot seed 100 (valid no-insight Pass@1, area under the curve; the rule fixed when the pilots
            # were set up): constant 1e-3 without KL (valid AUC 0.3 at 60 phases, 2.0 at 150) over 1.5e-4 -> 1.5e-5
            # with KL 0.05 (0.0 and 0.0), without KL (0.0) and 5e-4 -> 5e-5 with KL 0.05 (0.1). The KL term stays
            # built (`loss.terms` += kl, `loss.kl_coef`) for other runs.
            "optim.learning_rate": 1e-3,
            # 150 phases of 64 attempts: in the pilot valid rose only after ~80 phases (0.0 % at 60, 9.3 % at 150).
            "train.env_step_budget": 64 * 150,
            "eval.every": 5,
            "eval.num_tasks": 0,
            "eval.attempts_per_task": 2,
            "eval.train_num_tasks": 48,
            "eval.splits": EVAL_SPLITS,
            "eval.split_tasks": 0,
            "eval.select_on": "valid",
            # every evaluation's checkpoint kept (~3 MB each): the probes over training read them afterwards
            "train.checkpoint_every": 5,
            "train.keep_checkpoints": 100,
            # Chosen on pilot seed 100's base checks (docs/replication/v2/preregistration.md): at 2,000 steps (round
            # one's) the forge base used insights too little for the premise (with-insight Pass@1 1.5 %, sequential
            # Pass@8 10.4 %, public-rule tasks 38.5 %); at 4,000 10.7 %, 39.6 %, 47.9 %, i.i.d. Pass@64 still 0.
            "pretrain.steps": 4000,
            "pretrain.statement_prob": 0.15,
            "pretrain.write_prob": 0.5,
            "pretrain.reword_prob": 0.3,
        },
    )


def _pilot(c) -> None:
    _default(c)
    base.override(c, {"name": "replicate-v2-pilot"})


#: RL phases of the quick preset: what fits two minutes on a 2-core CPU (measured 2026-12-07 from a cold compilation
#: cache: 2.0 minutes with the base checks; 40 phases took 2.4).
QUICK_PHASES = 30


def _quick(c) -> None:
    # The grid's settings and seed 0's base policy (shipped with the package: no pretraining), for QUICK_PHASES phases
    # instead of 150, evaluated every 10 phases on the first `eval.split_tasks` tasks of each set instead of all. What
    # it can show in that time is exploration: the base policy's i.i.d. Pass@64 = 0 against sequential insights, and
    # RLTL;DR's training attempts succeeding (~10 % of them) where GRPO's never do. Not the no-insight gain: in the
    # grid, rltldr's held-in (tier 1) no-insight Pass@1 at phase 30 was 0.5 % on average over its 20 seeds (0 in 10 of
    # them) and ~4-5 % from phase 100 on.
    _default(c)
    base.override(
        c,
        {
            "name": "replicate-v2-quick",
            "train.env_step_budget": 64 * QUICK_PHASES,
            "eval.every": 10,
            "eval.split_tasks": 32,
            "eval.train_num_tasks": 32,
            "train.checkpoint_every": 10,
            "train.keep_checkpoints": 2,
        },
    )


def _smoke(c) -> None:
    _default(c)
    base.override(
        c,
        {
            "name": "replicate-v2-smoke",
            **round_one.SMOKE_SIZES,
            "eval.num_tasks": 2,
            "eval.split_tasks": 2,
            "train.checkpoint_every": 1,
        },
    )


PRESETS = {"default": _default, "pilot": _pilot, "quick": _quick, "smoke": _smoke}


def get_config(preset: str | None = None):
    """`preset`: default | pilot | quick | smoke."""
    return base.from_presets(PRESETS, preset, default="default")


def arm_config(preset: str | None, arm: str, seed: int, overrides: Mapping[str, Any] | None = None):
    """The resolved config of one run of the grid: the preset, then the arm (its ablation and overrides), then
    `seed` and `name`, then `overrides` (e.g. the command line's), validated, paths made absolute."""
    return round_one.resolve_arm(get_config, ARMS, preset, arm, seed, overrides)


def analysis(table, base) -> str:
    """The pre-registered analysis section of results.md (`replication/preregistered.py`): every number the
    pre-registration names, then each arm's per-tier means with 95 % intervals (selected, final, area under the
    curve)."""
    from rltldr_jax.replication import preregistered as pre

    arms = list(PREREGISTERED_ARMS)
    seeds = {arm: GRID_SEEDS[arm] for arm in arms}
    missing = pre.missing_runs(table, seeds)
    lost = sum(s not in table.get(arm, {}) for arm in arms for s in seeds[arm])
    complete = (
        "Every pre-registered run is in."
        if not missing
        else f"**Incomplete grid: {lost} of {sum(map(len, seeds.values()))} pre-registered runs missing** "
        f"({missing}); a number short of seeds says which in its decision."
    )
    parts = [
        "## Pre-registered analysis (docs/replication/v2/preregistration.md)",
        "",
        f"{complete} Differences in points of no-insight Pass@1; 95 % percentile-bootstrap intervals over seeds "
        "(10,000 resamples, numpy seed 0): a difference paired by seed, an arm's mean over its own seeds. Only each "
        "arm's pre-registered seeds count.",
        "",
        pre.analysis_markdown(pre.analyse(table, base, seeds)),
    ]
    pinned = pre.pinned(table, seeds)
    offline = [a for a in ("sft_rollouts", "sftldr") if a in pinned]
    unrecorded = [a for a in offline if not pre.by_seed(pinned, a, pre.column("tier1", "final"))]
    for measure in ("selected", "final", "auc"):
        parts += ["", f"### No-insight Pass@1 (%) per tier, {measure}: mean [95 % CI] over seeds", ""]
        parts.append(pre.arm_table(pinned, arms, measure))
    if offline:
        parts += [
            "",
            f"The offline arms ({', '.join(offline)}) are evaluated once, after training: their final, selected and "
            "area-under-the-curve values are that one evaluation."
            + (
                f" The grid's install kept only the tier-2 value of that evaluation for {', '.join(unrecorded)} "
                "(its other sets were measured but not written to summary.json, a bug fixed after the grid ran); "
                "their other cells are –."
                if unrecorded
                else ""
            ),
        ]
    for arm, (reference, what) in ADDED_ARMS.items():
        if arm not in table:
            continue
        parts += [
            "",
            f"## Not pre-registered: {arm} beside {reference}",
            "",
            f"{what}. Added after the grid started; differences in points, paired by seed, no decision.",
            "",
            pre.analysis_markdown(pre.beside(table, arm, reference)),
            "",
            pre.arm_table(table, [reference, arm]),
        ]
    return "\n".join(parts)
