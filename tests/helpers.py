"""Builders the tests share: the `tiny` config and the one small Trainer run the end-to-end tests start from, and a
launcher run in its own process (`launch`).

Every test that builds a Trainer on the tiny preset starts from `tiny_run_config`, so that the suite compiles one
set of shapes (the engine's, the train step's) and the on-disk compilation cache of tests/conftest.py serves the
rest; a test overrides only the keys it checks.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import ml_collections
import numpy as np

from configs import sapi
from rltldr_jax.agent.step_examples import Example
from rltldr_jax.config import base
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.settings import Settings, settings_of
from rltldr_jax.train.batching import pack

#: One small phase of the tiny preset: 1 task, 2 attempts of at most 2 actions of a few tokens, trained in micro-batches
#: of the preset's shape (4 examples padded to 1024 tokens: one train-step program per loss configuration), and a
#: 1-task evaluation of 2 attempts. The filters are off so that a random policy's all-failure group (advantage 0)
#: still reaches the GRPO term: the importance ratio, clip fraction and logprob gap are measured, not 0/0.
TINY_RUN: dict[str, Any] = {
    "rollout.tasks_per_phase": 1,
    "rollout.group_size": 2,
    "rollout.exact_group_size": True,
    "rollout.max_steps": 2,
    "rollout.max_think_tokens": 4,
    "rollout.max_action_tokens": 8,
    "batch.ppo_epochs": 1,
    "eval.num_tasks": 1,
    "eval.attempts_per_task": 2,
    "loss.filter_zero_advantage": False,
    "loss.positive_ratio": 0.0,
}


#: The checkout's root (where `launch/` and `configs/` are).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_devices_xla_flags(n: int) -> str:
    """XLA_FLAGS for a process the tests start with `n` fake CPU devices: the suite's own flags (tests/conftest.py)
    kept, the device count added."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()


def launch(
    name: str, *flags: str, cwd: str | os.PathLike | None = None, timeout: float = 1800
) -> subprocess.CompletedProcess:
    """`python launch/{name}.py FLAGS` in its own process on the CPU (from `cwd`, default the checkout's root), as a
    user runs it: the exit status, stdout and stderr captured as text, never raised on."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", f"{name}.py"), *flags],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        check=False,
    )


def tiny_config(overrides: dict[str, Any] | None = None, *, validate: bool = True) -> ml_collections.ConfigDict:
    """configs/sapi.py:tiny with `overrides` (dotted keys), validated unless `validate=False`."""
    c = base.override(sapi.get_config("tiny"), dict(overrides or {}))
    return base.validate(c) if validate else c


def tiny_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """The `Settings` of `tiny_config(overrides)` (validated)."""
    return settings_of(tiny_config(overrides))


def tiny_run_config(
    workdir: str, phases: int = 1, overrides: dict[str, Any] | None = None
) -> ml_collections.ConfigDict:
    """`tiny_config` with `TINY_RUN`, in `workdir`, for `phases` phases; `overrides` last."""
    return tiny_config({"workdir": workdir, "train.max_phases": phases, **TINY_RUN, **(overrides or {})})


def tiny_run_settings(workdir: str, phases: int = 1, overrides: dict[str, Any] | None = None) -> Settings:
    """The `Settings` of `tiny_run_config` (what a `Trainer` takes)."""
    return settings_of(tiny_run_config(workdir, phases, overrides))


def step_example(advantage: float = 1.0, old_logprob_at_8: float = -2.0, length: int = 16) -> Example:
    """One example of `length` (16) tokens over a 256-token vocabulary: insight tokens at 4..7 (SFT targets), action
    tokens from 8 on (GRPO targets); sampler logprobs -2 (`old_logprob_at_8` at position 8)."""
    old = np.full(length, -2.0, np.float32)
    old[8] = old_logprob_at_8
    positions = np.arange(length)
    return Example(
        ids=(positions * 7 + 3).astype(np.int32) % 256,
        old_logprobs=old,
        action_mask=positions >= 8,
        insight_mask=(positions >= 4) & (positions < 8),
        advantage=advantage,
        task_id="t",
        attempt=1,
        step=0,
    )


def small_term_model():
    """A tiny random Qwen 3.5 with a 256-token vocabulary (4 layers): the loss-term tests' model."""
    return ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)


def small_term_batch():
    """Three seeded examples (actions in their second half, 4 insight tokens each, advantages -1, 0, 1) packed as 2
    micro-batches of 2 rows: the loss-term tests' batch."""
    r = np.random.default_rng(0)
    examples = []
    for i, n in enumerate([24, 31, 17]):
        pos = np.arange(n)
        examples.append(
            Example(
                ids=r.integers(1, 256, n).astype(np.int32),
                old_logprobs=np.where(pos >= n // 2, -r.uniform(3, 7, n), 0.0).astype(np.float32),
                action_mask=pos >= n // 2,
                insight_mask=(pos >= 2) & (pos < 6),
                advantage=float(i) - 1.0,
                task_id="t",
                attempt=i,
                step=0,
            )
        )
    (batch,) = pack(examples, micro_batch_size=2, grad_accum_steps=2, pad_to_multiple=16)
    return batch
