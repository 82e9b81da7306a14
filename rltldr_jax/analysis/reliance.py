"""Insight reliance (E.5, Figure 6): how much a successful insight-conditioned attempt depends on its insights.

Xia et al. (2026) define ρ(τ; q, h) = log π(τ | q + h) − log π(τ | q); the paper averages it "over correct
trajectories with insights in context and normalized by trajectory length", and reports +0.009 averaged over the
first half of training and +0.034 over the second. Here, for one saved attempt τ that succeeded with insights in
context:

    ρ(τ) = Σ_steps Σ_action tokens [log π(a_t | context with the insights) − log π(a_t | context without)] / n

where each step's context is rebuilt exactly as for training (`agent.step_examples.attempt_examples`: the task, the
insight messages, the earlier steps without think traces, then the step's think + action), "without" drops only
the insight messages, the action tokens are those the policy sampled in the step (forced `</think>` excluded;
the same `action_mask` as the GRPO loss) and n is their count over all steps. The log-probs are teacher-forced
(`models.sequence_logprobs`).

Per phase, the mean over its attempts; the halves of training (`rollouts.phase_split`) average the per-phase
means (the curve of Figure 6 averaged over each half).

Which policy scores: the paper's curve presumably uses the policy of the time. `insight_reliance` takes either
one model (e.g. the final checkpoint: then the curve shows how the *final* policy relies on early vs late
insights) or a function phase → model (`per_phase_policy`: the training checkpoint that sampled each phase, for
a run that kept them, i.e. `train.keep_checkpoints` at least the number of phases).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rltldr_jax.agent.step_examples import attempt_examples
from rltldr_jax.analysis.rollouts import (
    RolloutRecord,
    new_figure,
    phase_split,
    save_figure,
    write_csv,
    write_summary_csv,
)
from rltldr_jax.models import Qwen35, sequence_logprobs
from rltldr_jax.tokenization import ContextBuilder

Policy = Qwen35 | Callable[[int], Qwen35 | None]

# ----------------------------------------------------------------------------------------------------
# Teacher-forced scoring
# ----------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def _token_logprobs(graphdef: nnx.GraphDef, params: nnx.State, ids: jax.Array, chunk: int) -> jax.Array:
    """[B, T] ids → [B, T] float32 log π(ids[t] | ids[:t]) (0 at t = 0)."""
    return sequence_logprobs(nnx.merge(graphdef, params), ids, chunk=chunk)[0]


def masked_logprob_sums(
    model: Qwen35,
    rows: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    batch_size: int = 4,
    min_length: int = 256,
    chunk: int = 512,
) -> np.ndarray:
    """Σ_t mask[t] · log π(ids[t] | ids[:t]) for each row, batched.

    Args:
      rows: (ids [T_i] int, mask [T_i] bool) per row.
      batch_size: rows per forward pass (a last partial batch is padded with empty rows).
      min_length: rows are right-padded to the next power of two >= this (causal: padding never changes a
        position), so a run compiles at most log2(longest / min_length) + 1 shapes.
      chunk: positions per log-softmax step (peak memory [batch_size, chunk, vocab] float32).

    Returns:
      [N] float64 sums.
    """
    graphdef, params = nnx.split(model)
    out = np.zeros(len(rows), np.float64)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))  # similar lengths share a batch
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        t = max(min_length, 1 << (max(len(rows[i][0]) for i in idx) - 1).bit_length())
        ids = np.zeros((batch_size, t), np.int32)
        mask = np.zeros((batch_size, t), bool)
        for r, i in enumerate(idx):
            n = len(rows[i][0])
            ids[r, :n], mask[r, :n] = rows[i][0], rows[i][1]
        lp = np.asarray(_token_logprobs(graphdef, params, jnp.asarray(ids), min(chunk, t)), np.float64)
        sums = np.where(mask, lp, 0.0).sum(axis=1)
        out[idx] = sums[: len(idx)]
    return out


def attempt_rows(
    record: RolloutRecord, builder: ContextBuilder, *, with_insights: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (ids [T], action_mask [T]) per step of the attempt, its context with or without its insights."""
    attempt = record.attempt if with_insights else dataclasses.replace(record.attempt, insights=())
    return [(e.ids, e.action_mask) for e in attempt_examples(attempt, 0.0, builder)]


# ----------------------------------------------------------------------------------------------------
# The analysis
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttemptReliance:
    """One successful insight-conditioned attempt: summed action log-probs with and without its insights."""

    task_id: str
    phase: int
    attempt: int
    n_insights: int
    n_tokens: int
    logp_with: float
    logp_without: float

    @property
    def reliance(self) -> float:
        """(log π(τ | q + h) − log π(τ | q)) / n_tokens."""
        return (self.logp_with - self.logp_without) / self.n_tokens


@dataclasses.dataclass(frozen=True)
class RelianceResult:
    """E.5.

    Attributes:
      attempts: every scored attempt.
      per_phase: (phase, mean reliance, attempts) per phase with scored attempts, ascending.
      split: phases < split are the first half (`phase_split` over all records).
      first_half, second_half: the mean of the per-phase means of each half (NaN if a half has none).
      n_first, n_second: attempts scored in each half.
      skipped_phases: phases with eligible attempts but no policy (`per_phase_policy` found no checkpoint).
    """

    attempts: tuple[AttemptReliance, ...]
    per_phase: tuple[tuple[int, float, int], ...]
    split: float
    first_half: float
    second_half: float
    n_first: int
    n_second: int
    skipped_phases: tuple[int, ...] = ()

    def summary(self) -> dict[str, float | int | str]:
        return {
            "first_half": self.first_half,
            "second_half": self.second_half,
            "n_first_half": self.n_first,
            "n_second_half": self.n_second,
            "split_phase": self.split,
            "skipped_phases": " ".join(map(str, self.skipped_phases)),
        }


def _means(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else math.nan


def insight_reliance(
    records: Sequence[RolloutRecord],
    policy: Policy,
    builder: ContextBuilder,
    *,
    max_per_phase: int | None = None,
    seed: int = 0,
    batch_size: int = 4,
    min_length: int = 256,
    chunk: int = 512,
) -> RelianceResult:
    """Insight reliance of the successful insight-conditioned attempts, per phase and per half of training.

    Args:
      records: the run's records (all of them: the halves are split over the whole phase range).
      policy: the scoring model, or phase → model (None skips the phase), called once per phase in order.
      builder: the run's ContextBuilder (same tokenizer, thinking mode and insight scaffold as training).
      max_per_phase: score at most this many attempts per phase (a seeded random subset); None = all.
      seed: the subset's seed.
      batch_size, min_length, chunk: see `masked_logprob_sums`.
    """
    split = phase_split(records)
    by_phase: dict[int, list[RolloutRecord]] = {}
    for r in records:
        if r.success and r.with_insights and r.attempt.steps:
            by_phase.setdefault(r.phase, []).append(r)
    scored: list[AttemptReliance] = []
    skipped = []
    for phase in sorted(by_phase):
        chosen = by_phase[phase]
        if max_per_phase is not None and len(chosen) > max_per_phase:
            pick = np.random.default_rng([seed, phase]).choice(len(chosen), max_per_phase, replace=False)
            chosen = [chosen[i] for i in sorted(pick)]
        model = policy if isinstance(policy, nnx.Module) else policy(phase)
        if model is None:
            skipped.append(phase)
            continue
        rows, owner = [], []
        for k, r in enumerate(chosen):
            for with_insights in (True, False):
                steps = attempt_rows(r, builder, with_insights=with_insights)
                rows += steps
                owner += [(k, with_insights)] * len(steps)
        sums = masked_logprob_sums(model, rows, batch_size=batch_size, min_length=min_length, chunk=chunk)
        logp = np.zeros((len(chosen), 2), np.float64)  # [:, 0] with, [:, 1] without
        tokens = np.zeros(len(chosen), np.int64)
        for (k, with_insights), s, (_, mask) in zip(owner, sums, rows, strict=True):
            logp[k, 0 if with_insights else 1] += s
            if with_insights:
                tokens[k] += int(mask.sum())
        for k, r in enumerate(chosen):
            if tokens[k]:
                a = r.attempt
                scored.append(
                    AttemptReliance(r.task_id, phase, a.index, len(a.insights), int(tokens[k]), logp[k, 0], logp[k, 1])
                )
    per_phase = []
    for phase in sorted({a.phase for a in scored}):
        values = [a.reliance for a in scored if a.phase == phase]
        per_phase.append((phase, float(np.mean(values)), len(values)))
    first = [m for p, m, _ in per_phase if p < split]
    second = [m for p, m, _ in per_phase if p >= split]
    return RelianceResult(
        tuple(scored),
        tuple(per_phase),
        split,
        _means(first),
        _means(second),
        sum(n for p, _, n in per_phase if p < split),
        sum(n for p, _, n in per_phase if p >= split),
        tuple(skipped),
    )


# ----------------------------------------------------------------------------------------------------
# Policies and the run's context settings
# ----------------------------------------------------------------------------------------------------


def _on_default_device(model: Qwen35) -> Qwen35:
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))


def load_policy(path: str, *, compute_dtype: Any = jnp.float32) -> tuple[Qwen35, str]:
    """The scoring model of `path`: an HF directory, or a training run's checkpoints `DIR[:STEP]` (default the
    latest step), on the default device. Returns (model, what was loaded)."""
    from rltldr_jax.checkpoint import load_model

    model, what = load_model(path, compute_dtype=compute_dtype)
    return _on_default_device(model), what


def per_phase_policy(checkpoint_dir: str, *, compute_dtype: Any = jnp.float32) -> Callable[[int], Qwen35 | None]:
    """phase → the training checkpoint that sampled it: the latest saved step <= phase (step s holds the weights
    after s updates, which sampled phase s); None when there is none (phase 0 never has one, and the trainer
    keeps only the newest `train.keep_checkpoints`). One model is held at a time; call in ascending phase order."""
    from rltldr_jax.checkpoint import Checkpointer

    with Checkpointer(checkpoint_dir, keep=None, async_save=False, create=False) as ckpt:
        steps = ckpt.all_steps()
    if not steps:
        raise FileNotFoundError(f"no saved checkpoint steps in {checkpoint_dir!r} (expected runs/X/checkpoints)")
    held: dict[int, Qwen35] = {}

    def policy(phase: int) -> Qwen35 | None:
        usable = [s for s in steps if s <= phase]
        if not usable:
            return None
        step = usable[-1]
        if step not in held:
            held.clear()
            held[step] = load_policy(f"{checkpoint_dir}:{step}", compute_dtype=compute_dtype)[0]
        return held[step]

    return policy


def recorded_run_config(checkpoint_dir: str) -> dict[str, Any]:
    """The training config recorded with a run's latest checkpoint (`meta["config"]`); {} if there is none (also
    for an HF directory)."""
    from rltldr_jax.checkpoint import Checkpointer

    if not os.path.isdir(checkpoint_dir) or os.path.isfile(os.path.join(checkpoint_dir, "config.json")):
        return {}  # none, or an HF directory
    with Checkpointer(checkpoint_dir, keep=None, async_save=False, create=False) as ckpt:
        if ckpt.latest_step() is None:
            return {}
        return dict(ckpt.read_state()[2].get("config") or {})


# ----------------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------------


def write_reliance(result: RelianceResult, out_dir: str | os.PathLike) -> list[str]:
    """reliance.csv (summary), reliance_attempts.csv (one row per attempt), reliance.png (Figure 6)."""
    paths = [
        write_summary_csv(os.path.join(out_dir, "reliance.csv"), result.summary()),
        write_csv(
            os.path.join(out_dir, "reliance_attempts.csv"),
            ("task_id", "phase", "attempt", "n_insights", "n_tokens", "logp_with", "logp_without", "reliance"),
            [
                (a.task_id, a.phase, a.attempt, a.n_insights, a.n_tokens, a.logp_with, a.logp_without, a.reliance)
                for a in result.attempts
            ],
        ),
    ]
    fig = new_figure(6.0, 3.5)
    ax = fig.add_subplot()
    if result.per_phase:
        phases, means, _ = zip(*result.per_phase, strict=True)
        ax.plot(phases, means, marker="o", ms=3, lw=1, label="per phase")
        boundary = math.ceil(result.split) - 0.5  # between the last phase of the first half and the next
        halves = ((min(phases) - 0.5, boundary, result.first_half), (boundary, max(phases) + 0.5, result.second_half))
        for a, b, v in halves:
            if not math.isnan(v) and b > a:
                ax.hlines(v, a, b, colors="tab:red", lw=2, label="half mean" if a < boundary else None)
        ax.legend(loc="best")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set(
        xlabel="phase",
        ylabel="reliance (nats / action token)",
        title=f"Insight reliance: {result.first_half:+.3g} → {result.second_half:+.3g}",
    )
    paths.append(save_figure(fig, os.path.join(out_dir, "reliance.png")))
    return paths
