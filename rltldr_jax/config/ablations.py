"""Every baseline and ablation of the paper as a named set of config overrides.

    python launch/train.py --config=configs/sapi.py --ablation=lambda_0.01
    python launch/train.py --config=configs/sapi.py:tiny --ablation=grpo --config.seed=1
    python launch/train.py --list_ablations

Precedence: the preset, then the ablation, then `--config.KEY=VALUE` flags. Each entry names the row of the
paper it reproduces (arXiv 2609.37633, Tables 1-3, 8, 9 and Fig. 4) and the paper's number.
Entries with `mode="sft"` are the offline SFT baselines of Table 2 and run with `launch/sft.py`.

Where the paper leaves a choice open, the entry's note says what is done here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from rltldr_jax.config import base
from rltldr_jax.settings import Settings, settings_of


@dataclasses.dataclass(frozen=True)
class Ablation:
    """A named variation of the default RLTL;DR run.

    Attributes:
      name: the `--ablation` value.
      paper: the paper row(s) it reproduces, with the reported number.
      overrides: dotted config keys and their values.
      note: what is implemented where the paper is brief.
    """

    name: str
    paper: str
    overrides: Mapping[str, Any]
    note: str = ""


def _fig4_ratio(ratio: float) -> Ablation:
    # Fig. 4: x = GRPO weight / insight-SFT weight = 1/λ with the GRPO coefficient fixed at 1; ratio 0 is the
    # pure SFTL;DR run (no GRPO). The figure's x values exist only as an image: this grid contains the paper's
    # three λ points (0.5 → 2, 0.1 → 10, 0.01 → 100) and fills in around them.
    if ratio == 0:
        overrides: dict[str, Any] = {"loss.grpo_coef": 0.0, "loss.lam": 1.0}
    else:
        overrides = {"loss.grpo_coef": 1.0, "loss.lam": 1.0 / ratio}
    return Ablation(
        f"fig4_ratio_{ratio:g}",
        f"Fig. 4, GRPO/SFT weight ratio {ratio:g}",
        overrides,
        "Fig. 4's x values are only in the image; the grid 0, 0.5, 1, 2, 5, 10, 100 covers λ = 0.5, 0.1, 0.01.",
    )


_ENTRIES: tuple[Ablation, ...] = (
    # --- Baselines (§4.1, Table 1) ----------------------------------------------------------------------
    Ablation("rltldr", "Table 1/2 RLTL;DR (λ = 0.5): SAPI-hard eval 18.9 %", {}, "The defaults; listed for symmetry."),
    Ablation(
        "grpo",
        "Table 1 GRPO: i.i.d.-style attempts, no insights (heldout SAPI 57.8 %)",
        {"insight.schedule": "never", "loss.lam": 0.0},
        "Attempts are still collected per task in phases (same throughput); no insight is written or inserted.",
    ),
    Ablation(
        "sge",
        "Table 1 SGE, strategy-guided exploration (Szot et al. 2026, arXiv 2603.02045): heldout SAPI 57.7 %",
        {"insight.content": "strategy", "insight.after": "any", "loss.lam": 0.0},
        "As §4.1 describes the baseline: after every attempt, failed or successful, the insight writer's JSON "
        "`summary` of it (no diagnosis of what went wrong) is inserted under '==> Summary of a previous Attempt n "
        "... <== Try a different strategy than this one: ' (tokenization.py SGE_SCAFFOLD) by the same schedule; no "
        "SFT loss; positive-ratio filtering stays on (A.3.2). Szot et al.'s own method also has the policy write a "
        "strategy before acting, mixed-temperature sampling and strategy reflection; those are not part of the "
        "baseline as the RLTL;DR paper runs it and are not implemented.",
    ),
    Ablation(
        "rltf_sd",
        "Table 1 RLTF-SD (Song et al. 2026, arXiv 2602.02482): heldout SAPI 53.0 %",
        {"loss.insight_rollouts": "self_distill", "loss.lam": 0.0},
        "Same sequential attempts and insights as RLTL;DR (RLTF's critique c₀ = our insight, its second turn = our "
        "insight-conditioned attempt). RLTF-SD trains π(y₁ | x₀): insight-conditioned attempts are trained in the "
        "context *without* insights by an advantage-weighted likelihood with no importance ratio "
        "(`detach_ratio`), advantage r − mean reward of the task's no-insight attempts in the phase (RLTF's "
        "first-turn baseline; the group mean when there are none); no-insight attempts keep the PPO ratio with "
        "the same baseline. No insight SFT (λ = 0).",
    ),
    # --- Table 2: loss terms and offline SFT ----------------------------------------------------------
    Ablation("lambda_0.01", "Table 2 RLTL;DR λ = 0.01: eval 14.0 %", {"loss.lam": 0.01}),
    Ablation("lambda_0", "Table 2 RLTL;DR λ = 0: eval 13.2 %", {"loss.lam": 0.0}),
    Ablation(
        "no_grpo",
        "Table 2 RLTL;DR, no GRPO loss, only L_SFT: eval 17.0 %",
        {"loss.grpo_coef": 0.0},
        "E.3: this run needed about 25 % more environment steps (1.25 epochs).",
    ),
    Ablation(
        "sft_rollouts_all",
        "Table 2 SFT on all 3.5k full rollouts: eval 20.9 %",
        {"mode": "sft", "sft.data": "rollouts", "sft.num_rollouts": 0},
        "NLL of the actions of successful attempts of a saved RLTL;DR run; insights in context, not trained on; "
        "10 epochs.",
    ),
    Ablation(
        "sft_rollouts_1k",
        "Table 2 SFT on 1k rollouts: eval 21.0 %",
        {"mode": "sft", "sft.data": "rollouts", "sft.num_rollouts": 1000},
    ),
    Ablation(
        "sft_rollouts_100",
        "Table 2 SFT on 100 rollouts: eval 20.8 %",
        {"mode": "sft", "sft.data": "rollouts", "sft.num_rollouts": 100},
    ),
    Ablation(
        "sftldr",
        "Table 2 SFTL;DR on insights: eval 16.8 %",
        {"mode": "sft", "sft.data": "insights"},
        "Trains π(f_1..f_I | task) on the (task, insights) of the saved rollouts, nothing else.",
    ),
    Ablation(
        "sftldr_dedup",
        "Table 2 SFTL;DR on insights, deduplicated: eval 16.9 %",
        {"mode": "sft", "sft.data": "insights", "sft.deduplicate": True},
        "Unique (task, insight) pairs (4k in the paper), each trained alone.",
    ),
    # --- Table 3: insight content, generator, amount ----------------------------------------------------
    Ablation(
        "content_diagnostic", "Table 3 content: diagnostic paragraph (eval 18.6 %)", {"insight.content": "feedback"}
    ),
    Ablation(
        "content_summary_diagnostic",
        "Table 3 content: summary + diagnostic paragraph (eval 16.0 %)",
        {"insight.content": "summary_feedback"},
    ),
    Ablation(
        "content_summary_diagnostic_code",
        "Table 3 content: summary + diagnostic + corrected code (eval 17.3 %)",
        {"insight.content": "summary_feedback_code"},
    ),
    Ablation(
        "generator_nonthinking", "Table 3 generator: student, non-thinking (eval 19.8 %)", {"insight.thinking": False}
    ),
    Ablation(
        "generator_no_failed_tests",
        "Table 3 generator: student, no info about failed unit tests (eval 10.0 %)",
        {"insight.show_failed_tests": False},
    ),
    Ablation(
        "teacher_nonthinking",
        "Table 3 generator: GLM 5.2 non-thinking, n_fb = 16 (eval 20.5 %)",
        {"insight.source": "teacher", "insight.thinking": False},
        "Needs --config.insight.teacher.servers (or .checkpoint): the teacher runs in its own engine.",
    ),
    Ablation(
        "teacher_thinking",
        "Table 3 generator: GLM 5.2 thinking, n_fb = 16 (eval 20.2 %)",
        {"insight.source": "teacher", "insight.thinking": True},
        "Needs --config.insight.teacher.servers (or .checkpoint).",
    ),
    Ablation(
        "teacher_nonthinking_nfb1",
        "Table 3 generator: GLM 5.2 non-thinking, n_fb = 1 (eval 22.7 %)",
        {"insight.source": "teacher", "insight.thinking": False, "insight.max_insights": 1},
        "Needs --config.insight.teacher.servers (or .checkpoint).",
    ),
    Ablation(
        "teacher_thinking_nfb1",
        "Table 3 generator: GLM 5.2 thinking, n_fb = 1 (eval 20.3 %)",
        {"insight.source": "teacher", "insight.thinking": True, "insight.max_insights": 1},
        "Needs --config.insight.teacher.servers (or .checkpoint).",
    ),
    *(
        Ablation(
            f"insights_{n}",
            f"Table 3 amount: {n} insight{'s' if n > 1 else ''} (eval {e})",
            {"insight.max_insights": n},
        )
        for n, e in ((1, "18.9 %"), (2, "19.3 %"), (4, "17.8 %"), (8, "20.3 %"), (16, "19.2 %, the default"))
    ),
    # --- Table 8: insight-generator SFT (RLTF-FM) and self-play insight SFT ----------------------------
    Ablation(
        "rltf_fm",
        "Table 8 RLTF-FM: 6.2 % no-insight success over the first 80 updates",
        {"loss.lam": 0.0, "loss.writer_sft_coef": 0.5},
        "SFT on π(f | τ): the writer's prompt (task, shortened rollout, failed tests; A.1) followed by an answer that "
        "is exactly the insight sentence, target = the insight tokens (writer_mask; the writer's think trace and JSON "
        "wrapper are not trained, so the term mirrors L_SFT's target). Actor-side L_SFT off. Weight 0.5, the same as "
        "λ (the paper gives none). RLTF's FM trains the critique given the first turn, which is this.",
    ),
    Ablation(
        "selfplay_insight_sft",
        "Table 8 self-play insight SFT: 7.7 % (crashed at update 75)",
        {"loss.lam": 0.0, "loss.writer_sft_coef": 0.5, "loss.writer_sft_filter": "next_success"},
        "As rltf_fm, only on insights after which the next attempt of the task succeeded.",
    ),
    Ablation("rltldr_rltf_fm", "Table 8 RLTL;DR + RLTF-FM: 15.0 %", {"loss.writer_sft_coef": 0.5}),
    Ablation(
        "rltldr_selfplay_insight_sft",
        "Table 8 RLTL;DR + self-play insight SFT: 15.7 %",
        {"loss.writer_sft_coef": 0.5, "loss.writer_sft_filter": "next_success"},
    ),
    # --- Table 9: insertion schedule, advantages, off-policy, std -------------------------------------
    Ablation(
        "threshold_0.1_lambda_0.1",
        "Table 9 insert if <= 0.1 running success, λ = 0.1: 14.2 %",
        {"insight.threshold": 0.1, "loss.lam": 0.1},
    ),
    Ablation(
        "threshold_0.33_lambda_0.1",
        "Table 9 insert if <= 0.33, λ = 0.1: 15.3 %",
        {"insight.threshold": 0.33, "loss.lam": 0.1},
    ),
    Ablation(
        "threshold_0.5_lambda_0.1",
        "Table 9 insert if <= 0.5, λ = 0.1: 17.1 %",
        {"insight.threshold": 0.5, "loss.lam": 0.1},
    ),
    Ablation(
        "first10_lambda_0.1",
        "Table 9 insert if <= 3 of the first 10 rollouts successful, λ = 0.1: 19.2 %",
        {"insight.schedule": "first_k", "insight.first_k": 10, "insight.first_k_max_successes": 3, "loss.lam": 0.1},
    ),
    Ablation(
        "split_advantages",
        "Table 9 split advantages: 18.9 %",
        {"loss.split_advantages": True},
        "Insight-conditioned and unconditioned attempts of a task form two separate GRPO groups.",
    ),
    Ablation(
        "off_policy",
        "Table 9 off-policy training (insights removed at update time + importance sampling): 9.6 %",
        {"loss.insight_rollouts": "off_policy"},
        "Insight-conditioned attempts are trained with their insights removed from every step's context; the old "
        "logprobs stay the sampler's (with insights), so the PPO ratio is π_θ(y | task) / π_old(y | task + insights). "
        "L_SFT (λ = 0.5) keeps its signal through insights-only examples (task + insights, one per step of such an "
        "attempt), since no insight remains in the rollout contexts; the paper does not say how it kept L_SFT.",
    ),
    Ablation("std_normalize", "Table 9 GRPO-style std normalization: 17.0 %", {"loss.std_normalize": True}),
    # --- Fig. 4: the 1/λ sweep -------------------------------------------------------------------------
    *(_fig4_ratio(r) for r in (0, 0.5, 1, 2, 5, 10, 100)),
)

ABLATIONS: dict[str, Ablation] = {a.name: a for a in _ENTRIES}
assert len(ABLATIONS) == len(_ENTRIES), "duplicate ablation names"


def apply(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Applies the ablation `name` to `config` in place and returns it; an unknown name lists the known ones."""
    if name not in ABLATIONS:
        raise base.ConfigError(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}")
    return base.override(config, dict(ABLATIONS[name].overrides))


def resolve(
    config: ml_collections.ConfigDict, ablation: str | None = None, cli_overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Preset config → ablation → command-line overrides → validation (the launchers' precedence), then every path
    key made absolute against the current directory (`base.absolute_paths`): the run's `Settings`, which every library
    part takes (`Trainer(settings)`, `run_sft(settings)`, ...).

    `config` already holds the command-line overrides (config_flags applies them on load); they are applied
    again after the ablation so that an ablation never clobbers what the user set explicitly.
    """
    if ablation:
        apply(config, ablation)
        base.override(config, dict(cli_overrides or {}))
    return settings_of(base.absolute_paths(base.validate(config)))


def describe() -> str:
    """One line per ablation: name, paper row."""
    width = max(map(len, ABLATIONS))
    return "\n".join(f"{a.name:<{width}}  {a.paper}" for a in ABLATIONS.values())
