"""The small-scale replication: a policy pretrained from scratch in the crafting world with hidden rules.

    python launch/replicate.py --config=configs/replicate.py:quick        # grpo vs rltldr, 3 seeds, minutes on a CPU
    python launch/replicate.py --config=configs/replicate.py              # the full grid, 3 seeds, hours on 2 cores
    python launch/train.py --config=configs/replicate.py --ablation=grpo  # one arm as an ordinary run

Every arm is an ordinary RLTL;DR run of the paper's code path (Qwen 3.5 architecture, `ContextBuilder` with the
paper's insight messages, the embedded `JaxEngine`, collector and insertion schedule, `phase_examples`, the
`Trainer`, evaluation) at a small size: the world is `rltldr_jax/envs/craft.py`, the policy a `replicate_*` preset
pretrained from scratch on the world's public-rule demonstrations (`pretrain.*`, cached), the insight writer the
`rule` insight source (a deterministic stand-in for an LLM insight writer, reading the verifier's failed test).

What differs from the paper's settings (Table 4), and why:
- one action per attempt (the whole plan as one code block; thinking off), so a phase is cheap on a CPU;
- learning rate 1e-3 (a 0.25M-parameter model trained from scratch, not a 9B one at 3e-6);
- n_fb = 4 insights (a task here has at most two distinct failures, so longer lists only repeat them);
- exactly K = 8 attempts per task (`rollout.exact_group_size`), so every run is a deterministic function of its
  seed and `--resume` reproduces it;
- evaluation on held-in training tasks as well as on held-out targets, 4 attempts per task, no insights.

The experiment file is `configs/replicate.py` (`get_config`); this module holds what it shares with
launch/replicate.py, the benchmarks and the notebooks.

Presets: `default` (the full grid: `replicate_xs`, 3 seeds), `quick` (the same pretraining, 30 phases of RL, seeds
0-2, grpo and rltldr only: what the README's first command runs), `gpu` (`replicate_m`, 10 seeds, for one GPU) and
`smoke` (tiny budgets, for the tests). `GRIDS` holds each preset's default arms and seeds; `ARMS` maps an arm name
to the overrides that define it (an ablation of rltldr_jax/config/ablations.py where one exists).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rltldr_jax.config import ablations, base

#: The λ of the `rltldr` arm. Not the paper's 0.5 (that is the `lambda_0.5` arm): chosen before the grid ran, from
#: the third-party toy replication's best λ (0.03; its λ = 0.5 destroyed the policy) and one pilot run of ours in
#: which λ = 0.5 learned nothing in 20 phases where λ = 0 did. The grid's λ sweep tests the choice.
DEFAULT_LAMBDA = 0.03

#: Arm name -> (ablation of rltldr_jax/config/ablations.py or None, extra overrides). Applied after the preset.
ARMS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "rltldr": (None, {"loss.lam": DEFAULT_LAMBDA}),
    "lambda_0": ("lambda_0", {}),
    "lambda_0.03": (None, {"loss.lam": 0.03}),
    "lambda_0.1": (None, {"loss.lam": 0.1}),
    "lambda_0.5": (None, {"loss.lam": 0.5}),
    "sft_only": ("no_grpo", {}),
    "uninformative_insights": (None, {"insight.source": "uninformative"}),
    # Offline SFTL;DR (Table 2) on the (task, insight) pairs collected by this seed's `rltldr` run.
    "sftldr": ("sftldr", {}),
    # The declarative-pretraining experiment (not in the default grid): 30 % of the pretraining demonstrations state
    # true public rules of their plan as insights, trained as targets, so that "task -> rule sentence" is a learnt
    # skill before RL asks L_SFT to teach hidden ones. Compare with lambda_0 / lambda_0.5.
    "declarative_lambda_0": (None, {"pretrain.statement_prob": 0.3, "loss.lam": 0.0}),
    "declarative_lambda_0.5": (None, {"pretrain.statement_prob": 0.3, "loss.lam": 0.5}),
}

#: The arms of the full grid (the declarative ones run on request: --arms=...).
CORE_ARMS = (
    "grpo",
    "rltldr",
    "lambda_0",
    "lambda_0.03",
    "lambda_0.1",
    "lambda_0.5",
    "sft_only",
    "sftldr",
    "uninformative_insights",
)

#: preset -> (default arms, default seeds) of `launch/replicate.py`.
GRIDS: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "default": (CORE_ARMS, (0, 1, 2)),
    # Three seeds (the grid's 0, 1, 2, whose base policies ship with the package): one seed is one draw, and with
    # sequence packing (batch.pack_rows) seed 0 alone ended at 0.0 % no-insight train Pass@1 after peaking at 10 %.
    "quick": (("grpo", "rltldr"), (0, 1, 2)),
    "gpu": (CORE_ARMS, tuple(range(10))),
    "smoke": (("grpo", "rltldr"), (0,)),
}


#: preset -> how many pieces of the grid (a seed's base checks, a run) `launch/replicate.py` runs at once, each in
#: its own process (`--jobs` overrides it). 0: one per CPU core, at most 4 (XLA's CPU programs at these shapes keep
#: about one core busy each; a run's results do not depend on it); the gpu preset's runs share one device: one at a
#: time.
JOBS: dict[str, int] = {"default": 0, "quick": 0, "gpu": 1, "smoke": 0}


#: preset -> sizes of the base policy's checks (replication/checks.py): i.i.d. attempts per hard training task (the
#: split must have Pass@64 = 0), and how many tasks.
CHECKS: dict[str, dict[str, int]] = {
    "default": {"iid_samples": 64, "num_tasks": 48},
    "quick": {"iid_samples": 64, "num_tasks": 32},
    "gpu": {"iid_samples": 64, "num_tasks": 120},
    "smoke": {"iid_samples": 2, "num_tasks": 2},
}


def _default(c) -> None:
    base.override(
        c,
        {
            "name": "replicate",
            "env.name": "craft",
            "model.preset": "replicate_xs",
            "model.dtype": "float32",
            "model.param_dtype": "float32",
            "model.remat": False,
            "rollout.tasks_per_phase": 8,
            "rollout.group_size": 8,
            "rollout.max_steps": 1,
            "rollout.thinking": False,
            "rollout.max_think_tokens": 0,
            "rollout.max_action_tokens": 96,
            "rollout.max_context_tokens": 512,
            "rollout.exact_group_size": True,
            "insight.source": "rule",
            "insight.thinking": False,
            "insight.max_think_tokens": 0,
            "insight.max_action_tokens": 64,
            "insight.max_insights": 4,
            "loss.lam": DEFAULT_LAMBDA,
            "optim.learning_rate": 1e-3,
            "batch.ppo_epochs": 2,
            "batch.micro_batch_size": 16,
            "batch.grad_accum_steps": 1,
            "batch.pad_to_multiple": 64,
            # 16 examples per optimizer step as before, packed into rows of 512, 2 rows per micro-batch: one compiled
            # train step, ~3x fewer positions computed than one example per row padded to 256-384 (batching.pack).
            "batch.pack_rows": 2,
            "mesh.data": -1,
            "mesh.fsdp": 1,
            "engine.kind": "jax",
            "engine.max_batch": 64,
            "train.env_step_budget": 64 * 60,
            "train.max_phases": 0,
            "train.checkpoint_every": 20,
            "train.keep_checkpoints": 2,
            "eval.every": 10,
            "eval.num_tasks": 40,
            "eval.train_num_tasks": 40,
            "eval.attempts_per_task": 4,
            "sft.epochs": 10,
            "sft.learning_rate": 1e-3,
            "pretrain.steps": 2000,
            "pretrain.batch_size": 32,
            "pretrain.learning_rate": 3e-3,
        },
    )


def _quick(c) -> None:
    _default(c)
    # The default's pretrained policy (shared through the cache), less RL. Shorter pretraining breaks the premise:
    # at 1,200 steps the base policy's i.i.d. Pass@64 on the hard tasks was 3 %, and GRPO learnt from it.
    # 30 phases: in the full grid (3 seeds) rltldr's no-insight train Pass@1 was 27.5 / 1.3 / 23.1 % at phase 20 and
    # 43.8 / 25.6 / 19.4 % at phase 30; the quick run had 20 phases until seed 0 ended at 0.0 % there once the engine's
    # numerics changed (block-skipping attention, chunked prefill), so 20 phases sit at the edge of emergence.
    base.override(c, {"name": "replicate-quick", "train.env_step_budget": 64 * 30, "eval.every": 5})


def _gpu(c) -> None:
    _default(c)
    base.override(
        c,
        {
            "name": "replicate-gpu",
            "model.preset": "replicate_m",
            "pretrain.steps": 4000,
            "pretrain.batch_size": 64,
            "optim.learning_rate": 3e-4,
            "train.env_step_budget": 64 * 100,
            "eval.num_tasks": 120,
            "eval.train_num_tasks": 120,
        },
    )


#: The smoke preset's budgets (tiny: for the tests), also the second round's smoke preset's. One pretraining step:
#: each step of a pool has its own length bucket, so its own compiled program (`train/pretrain.py`), and compiling
#: is most of a smoke run's CPU (four steps took ~4 compilations, ~75 of the ~210 CPU seconds of a smoke grid).
SMOKE_SIZES = {
    "model.preset": "replicate_xs",
    "pretrain.steps": 1,
    "pretrain.batch_size": 4,
    "rollout.tasks_per_phase": 2,
    "rollout.group_size": 2,
    "train.env_step_budget": 4,
    "eval.every": 0,
    "eval.num_tasks": 2,
    "eval.train_num_tasks": 2,
    "eval.attempts_per_task": 1,
    "sft.epochs": 1,
    "batch.micro_batch_size": 4,
    "engine.max_batch": 8,
}


def _smoke(c) -> None:
    _default(c)
    base.override(c, {"name": "replicate-smoke", **SMOKE_SIZES})


PRESETS = {"default": _default, "quick": _quick, "gpu": _gpu, "smoke": _smoke}


def get_config(preset: str | None = None):
    """`preset`: default | quick | gpu | smoke."""
    return base.from_presets(PRESETS, preset, default="default")


def arm_config(preset: str | None, arm: str, seed: int, overrides: Mapping[str, Any] | None = None):
    """The resolved config of one run of the grid: the preset, then the arm (its ablation and overrides), then
    `seed` and `name`, then `overrides` (e.g. the command line's), validated, paths made absolute."""
    return resolve_arm(get_config, ARMS, preset, arm, seed, overrides)


def resolve_arm(
    get_config: Callable[[str | None], Any],
    arms: Mapping[str, tuple[str | None, Mapping[str, Any]]],
    preset: str | None,
    arm: str,
    seed: int,
    overrides: Mapping[str, Any] | None = None,
):
    """`arm_config` of a replication module: `get_config(preset)`, then `arms[arm]` (an ablation of
    rltldr_jax/config/ablations.py or None, and overrides), then `seed` and `name`, then `overrides`, resolved."""
    if arm not in arms:
        raise base.ConfigError(f"unknown arm {arm!r}; choose from {', '.join(arms)}")
    c = get_config(preset)
    ablation, extra = arms[arm]
    if ablation:
        ablations.apply(c, ablation)
    base.override(c, {**extra, "seed": seed, "name": arm, **dict(overrides or {})})
    return ablations.resolve(c)


def grid_configs(
    grid: Any, preset: str, arms: Sequence[str], seeds: Sequence[int], overrides: Mapping[str, Any]
) -> dict[tuple[str, int], Any]:
    """(arm, seed) -> resolved config of a grid module's `preset`: `arms` on `seeds` (every arm), or without `seeds`
    on the preset's (`GRIDS[preset][1]`: one tuple for every arm, or arm -> seeds; an arm it does not list gets its
    longest list); plus the `rltldr` run of every seed an offline arm (mode sft) reads the rollouts of."""
    default_seeds = grid.GRIDS[preset][1]

    def seeds_of(arm: str) -> list[int]:
        if seeds:
            return list(seeds)
        if isinstance(default_seeds, Mapping):
            return list(default_seeds.get(arm) or max(default_seeds.values(), key=len))
        return list(default_seeds)

    configs = {(arm, seed): grid.arm_config(preset, arm, seed, overrides) for arm in arms for seed in seeds_of(arm)}
    offline = {seed for (arm, seed), c in configs.items() if c.mode == "sft"}
    configs |= {
        ("rltldr", seed): grid.arm_config(preset, "rltldr", seed, overrides)
        for seed in sorted(offline)
        if ("rltldr", seed) not in configs
    }
    return configs


def grid_analysis(grid: Any, preset: str) -> Any:
    """A grid module's pre-registered analysis section of results.md (its `analysis`), for the presets it describes
    (`ANALYSED_PRESETS`; every preset when it names none): a demonstration preset's one seed is no grid to analyse."""
    if preset not in getattr(grid, "ANALYSED_PRESETS", (preset,)):
        return None
    return getattr(grid, "analysis", None)
