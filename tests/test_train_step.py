"""The optimizer step's guard against NaN/inf: a step with a non-finite loss or gradient norm changes nothing and is
reported; the update counts skipped steps and stops the run after `train.max_nonfinite_skips` in a row; clipping
at grad_clip_norm=0 is off. The loss coefficients are arguments of the compiled step, not constants."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import step_example, tiny_config

from rltldr_jax.agent.step_examples import Example
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.settings import build, settings_of
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.batching import pack
from rltldr_jax.train.loop import UpdateConfig, update_phase
from rltldr_jax.train.report import phase_line
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import LossConfig, NonFiniteError, NonFiniteGuard, make_optimizer, train_step

T = 16  # tokens per example


@pytest.fixture
def model():
    """A 4-layer tiny Qwen 3.5 with a 256-token vocabulary: the real step, compiled in seconds (one per test: the
    step donates its parameter buffers)."""
    return ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)


def _config(max_skips: int = 5, ppo_epochs: int = 1):
    # The examples' sampler logprobs are made up, not sampled: the logprob-gap guard would stop every phase.
    return tiny_config(
        {
            "batch.micro_batch_size": 1,
            "batch.grad_accum_steps": 1,
            "batch.pad_to_multiple": T,
            "batch.ppo_epochs": ppo_epochs,
            "train.max_nonfinite_skips": max_skips,
            "train.max_logprob_gap": 0.0,
        }
    )


def _update(model, config) -> ShardedUpdate:
    return ShardedUpdate(
        build(MeshConfig, settings_of(config).mesh),
        model,
        make_optimizer(1e-3),
        LossConfig(lam=0.5),
        micro_batch_size=config.batch.micro_batch_size,
    )


def _example(advantage: float = 1.0, old_logprob_at_8: float = -2.0) -> Example:
    """Insight tokens at 4..7 (SFT targets), action tokens at 8..15 (GRPO targets)."""
    return step_example(advantage, old_logprob_at_8, length=T)


def _host(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]


def test_a_nonfinite_step_leaves_parameters_and_optimizer_state_bitwise_unchanged(model):
    update = _update(model, _config())
    params, opt = _host(update.params), _host(update.opt_state)
    for bad in (_example(advantage=np.inf), _example(old_logprob_at_8=-np.inf)):
        (batch,) = pack([bad], micro_batch_size=1, grad_accum_steps=1, pad_to_multiple=T)
        metrics = update.step(batch)  # jitted with donated params and optimizer state, as in the trainer
        assert float(metrics["skipped_nonfinite"]) == 1.0
        assert not (np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"])))
        for before, after in zip(params + opt, _host(update.params) + _host(update.opt_state), strict=True):
            np.testing.assert_array_equal(before, after)
    (batch,) = pack([_example()], micro_batch_size=1, grad_accum_steps=1, pad_to_multiple=T)
    metrics = update.step(batch)
    assert float(metrics["skipped_nonfinite"]) == 0.0 and np.isfinite(float(metrics["loss"]))
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(params, _host(update.params), strict=True)) > 0
    assert all(np.all(np.isfinite(x)) for x in _host(update.params) + _host(update.opt_state))


def test_the_update_counts_skips_and_shows_them(model):
    """One good and one infinite-advantage example, one step each: one applied, one skipped, and the phase line
    shows the non-finite mean loss instead of hiding it."""
    update = _update(model, _config(max_skips=0))
    settings = UpdateConfig.of(settings_of(_config(max_skips=0)))
    metrics = update_phase(update, [_example(), _example(advantage=np.inf)], settings, phase=0, guard=NonFiniteGuard(0))
    assert metrics["optimizer_steps"] == 2.0 and metrics["skipped_nonfinite"] == 1.0
    assert not np.isfinite(metrics["loss"])
    line = phase_line(1, 20, {f"update/{k}": v for k, v in metrics.items()})
    assert "loss -inf" in line or "loss nan" in line or "loss inf" in line
    assert "1 steps SKIPPED" in line
    assert all(np.all(np.isfinite(x)) for x in _host(update.params))


def test_consecutive_skips_stop_the_update(model):
    """train.max_nonfinite_skips=2: the second skipped step in a row raises, the parameters still untouched."""
    config = _config(max_skips=2, ppo_epochs=3)
    update = _update(model, config)
    params = _host(update.params)
    guard = NonFiniteGuard(config.train.max_nonfinite_skips)
    with pytest.raises(
        NonFiniteError, match=r"2 optimizer steps in a row had a non-finite loss.*phase 4, optimizer step 2"
    ):
        update_phase(update, [_example(advantage=np.inf)], UpdateConfig.of(settings_of(config)), phase=3, guard=guard)
    assert guard.total == 2
    for before, after in zip(params, _host(update.params), strict=True):
        np.testing.assert_array_equal(before, after)


def test_the_guard_counts_only_skips_in_a_row():
    ok = {"skipped_nonfinite": 0.0, "loss": 1.0, "grad_norm": 1.0}
    skipped = {"skipped_nonfinite": 1.0, "loss": np.nan, "grad_norm": np.nan}
    guard = NonFiniteGuard(3)
    for m in (skipped, skipped, ok, skipped, skipped, ok):
        guard.record(m, "here")
    assert (guard.in_a_row, guard.total) == (0, 4)
    never = NonFiniteGuard(0)
    for _ in range(100):
        never.record(skipped, "here")
    assert never.total == 100
    with pytest.raises(NonFiniteError, match="raise train.max_nonfinite_skips"):
        for _ in range(3):
            guard.record(skipped, "here")


def test_grad_clip_norm_zero_means_no_clipping():
    """optim.grad_clip_norm=0 is valid and turns clipping off. With eps=1 Adam's first step is g / (|g| + 1): 10/11
    unclipped, 0.5 after clipping to norm 1."""
    tiny_config({"optim.grad_clip_norm": 0.0})
    params, grads = {"w": np.zeros(1, np.float32)}, {"w": np.full(1, 10.0, np.float32)}
    for clip, step in ((0.0, 10 / 11), (1.0, 0.5)):
        tx = make_optimizer(1.0, eps=1.0, grad_clip_norm=clip)
        updates, _ = tx.update(grads, tx.init(params), params)
        np.testing.assert_allclose(
            optax.apply_updates(params, updates)["w"], [-step], rtol=1e-4
        )  # float32 bias correction


@pytest.mark.slow  # 43 CPU s; across processes: test_compile_cache.py
def test_loss_coefficients_are_arguments_one_program_for_every_arm(model):
    """λ, grpo_coef, clip_eps and writer_sft_coef are traced (`LossConfig.traced`): the step compiled once serves
    every arm of a grid, and each call's loss is its own coefficients' (the same as the step compiled with them as
    constants, checked for one of them)."""
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1e-3)
    opt = tx.init(params)
    (batch,) = pack([_example(), _example(advantage=-0.5)], micro_batch_size=2, grad_accum_steps=1, pad_to_multiple=T)
    step = jax.jit(functools.partial(train_step, graphdef, tx=tx))  # params not donated: every call sees the same
    arms = [LossConfig(lam=0.0), LossConfig(lam=0.5), LossConfig(lam=0.1, grpo_coef=0.0, clip_eps=0.1)]
    losses = []
    for cfg in arms:
        _, _, metrics = step(params, opt, batch, loss_cfg=cfg.traced())
        grpo, sft = float(metrics["grpo_loss"]), float(metrics["sft_nll"])
        assert float(metrics["loss"]) == pytest.approx(cfg.grpo_coef * grpo + cfg.lam * sft, rel=1e-5)
        if cfg.lam == 0.5:  # (one arm: each program compiled with constants costs ~20 s on 2 cores)
            constant = jax.jit(functools.partial(train_step, graphdef, tx=tx, loss_cfg=cfg))(params, opt, batch)[2]
            assert float(metrics["loss"]) == pytest.approx(float(constant["loss"]), rel=1e-6, abs=1e-7)
        losses.append(float(metrics["loss"]))
    assert step._cache_size() == 1  # one compiled program for the three arms
    assert len(set(losses)) == 3 and sft > 0
