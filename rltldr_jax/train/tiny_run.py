"""The `tiny` preset's demonstration run that the Colab notebooks share (`configs/sapi.py:tiny`, every checkpoint
kept, checkpoint 0 = the initial policy), so each notebook can make it when it runs alone on a fresh runtime.

    config = tiny_run_config("runs/colab-tiny")            # the settings (test_mode=True: seconds, for the tests)
    history, final_eval = train_tiny_run(config)           # trains it phase by phase (Trainer.run_phase)
    steps = ensure_tiny_run("runs/colab-tiny")             # its checkpoint steps; trained first if it has none

Its policy is a tiny random Qwen 3.5 with the real 248k-token vocabulary: it never solves a task (what moves is
L_SFT lowering the NLL of the inserted insights); about 8 minutes on 2 CPU cores, seconds in test mode.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from rltldr_jax.settings import Settings

#: Test mode (`RLTLDR_NOTEBOOK_TEST=1`, tests/test_notebooks.py): one task per phase, two attempts, two phases, a few
#: tokens per step: every step runs, nothing meaningful is learnt.
TEST_OVERRIDES: dict[str, Any] = {
    "train.max_phases": 2,
    "rollout.tasks_per_phase": 1,
    "rollout.group_size": 2,
    "rollout.exact_group_size": True,
    "rollout.max_steps": 2,
    "rollout.max_think_tokens": 4,
    "rollout.max_action_tokens": 8,
    "batch.ppo_epochs": 1,
    "batch.micro_batch_size": 2,
    "batch.pad_to_multiple": 512,
    "eval.num_tasks": 1,
    "eval.attempts_per_task": 2,
    # keep the all-failure group so its actions reach the GRPO term (ratio and clip fraction are measured)
    "loss.filter_zero_advantage": False,
    "loss.positive_ratio": 0.0,
}


def tiny_run_config(workdir: str, *, test_mode: bool = False) -> Settings:
    """`configs/sapi.py:tiny` in `workdir`, keeping every checkpoint (`train.keep_checkpoints`: the phases + the
    initial one), validated; `test_mode` adds `TEST_OVERRIDES`."""
    from rltldr_jax.config import base, load
    from rltldr_jax.settings import settings_of

    config = load("configs/sapi.py:tiny")  # what --config=configs/sapi.py:tiny loads (from the repository root)
    base.override(config, {"workdir": os.path.abspath(workdir), **(TEST_OVERRIDES if test_mode else {})})
    base.override(config, {"train.keep_checkpoints": config.train.max_phases + 1})
    return settings_of(base.validate(config))


def phase_line(phase: int, env_steps: int, metrics: dict[str, float], seconds: float) -> str:
    """One phase as the notebooks print it: attempts, environment steps so far, Pass@1, SFT NLL, time."""
    return (
        f"phase {phase}: {metrics['rollout/counts/attempts']:.0f} attempts, {env_steps} environment steps so far, "
        f"Pass@1 {metrics['rollout/pass@1/all']:.3f}, SFT NLL {metrics.get('update/sft_nll', math.nan):.3f} "
        f"({seconds:.0f} s)"
    )


def train_tiny_run(
    config: Settings, *, resume: bool = False, echo: Callable[[str], None] = print
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Trains `config` phase by phase: checkpoint 0 (the initial policy) first, then `Trainer.run_phase()` until the
    budget is spent (evaluating every `eval.every` phases), a final held-out evaluation, `close()`. A fresh run
    (`resume=False`) first removes an earlier run in the workdir. Returns (each phase's metrics with its `phase`,
    the final evaluation's metrics); `echo` gets one line per phase and the final Pass@1."""
    from rltldr_jax.train.loop import Trainer

    if not resume and os.path.isdir(config.workdir):
        shutil.rmtree(config.workdir)  # a fresh run: checkpoints of an earlier run would clash with the new ones
    history: list[dict[str, float]] = []
    trainer = Trainer(config, resume=resume)
    try:
        if trainer.phase == 0:
            trainer.save()  # checkpoint 0: the initial policy (notebook 2 compares it with the trained one)
        while not trainer.done():
            t0 = time.time()
            metrics = trainer.run_phase()
            history.append({"phase": trainer.phase, **metrics})
            echo(phase_line(trainer.phase, trainer.env_steps, metrics, time.time() - t0))
            if config.eval.every and trainer.phase % config.eval.every == 0:
                trainer.evaluate()
        final_eval = trainer.evaluate()
        echo(f"held-out Pass@1 after {trainer.phase} phases: {final_eval['eval/pass@1/all']:.3f}")
    finally:
        trainer.close()
    return history, final_eval


def checkpoint_steps(workdir: str) -> list[int]:
    """The checkpoint steps of the run in `workdir` (empty when it has none)."""
    from rltldr_jax.checkpoint import Checkpointer

    checkpoints = os.path.join(os.path.abspath(workdir), "checkpoints")
    if not os.path.isdir(checkpoints):
        return []
    with Checkpointer(checkpoints, keep=None, async_save=False, create=False) as saved:
        return saved.all_steps()


def ensure_tiny_run(workdir: str, *, test_mode: bool = False, echo: Callable[[str], None] = print) -> list[int]:
    """The checkpoint steps of the run in `workdir`, training the tiny run there first when it has no checkpoint
    (any run with checkpoints is used as it is: point the notebooks at a longer run for real numbers). What
    notebooks 2 and 3 call, so each runs on its own, on a fresh runtime."""
    steps = checkpoint_steps(workdir)
    if steps:
        return steps
    echo(f"no run in {workdir}: training the tiny run here first (about 8 minutes on 2 CPU cores)")
    train_tiny_run(tiny_run_config(workdir, test_mode=test_mode), echo=echo)
    return checkpoint_steps(workdir)
