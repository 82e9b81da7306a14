"""A loss term added from outside the package (examples/entropy_bonus.py): its math by hand, one phase of a tiny
run through the real Trainer with it on, and with coefficient 0 the same step as without it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import small_term_batch, small_term_model, tiny_config, tiny_run_settings

from examples.entropy_bonus import entropy_bonus
from rltldr_jax.config import base
from rltldr_jax.loss_terms import DEFAULT_TERMS, LOSS_TERMS, TermInputs, combine
from rltldr_jax.settings import settings_of
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.step import LossConfig, make_optimizer, train_step

WITH_BONUS = (*DEFAULT_TERMS, "entropy_bonus")


def test_entropy_bonus_math_by_hand():
    entropy = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = jnp.array([[True, False, True], [False, True, False]])
    total, count, aux = entropy_bonus(TermInputs(jnp.zeros((2, 3)), entropy, {}), mask, LossConfig())
    assert float(total) == -9.0 and float(count) == 3.0 and aux == {}
    # Normalised by the *global* count (here 6 action tokens over the whole batch) and weighted: 0.1 * -9 / 6.
    loss = combine({"entropy_bonus": total}, {"entropy_bonus": jnp.float32(6)}, {"entropy_bonus": 0.1})
    np.testing.assert_allclose(float(loss), -0.15, rtol=1e-6)
    assert float(combine({"entropy_bonus": total}, {"entropy_bonus": 0.0}, {"entropy_bonus": 0.1})) == 0.0


def test_registering_adds_the_coefficient_key_and_validation_knows_the_term():
    assert LOSS_TERMS["entropy_bonus"].coef == "entropy_coef"
    c = tiny_config({"loss.terms": ",".join(WITH_BONUS), "loss.entropy_coef": 0.01})
    cfg = LossConfig.of(settings_of(c).loss)
    assert cfg.terms == WITH_BONUS and cfg.coef("entropy_coef") == 0.01 and cfg.coef("lam") == c.loss.lam
    with pytest.raises(base.ConfigError, match="unregistered loss term.*'nope'"):
        tiny_config({"loss.terms": "grpo,nope"})


@pytest.fixture(scope="module")
def model():
    return small_term_model()


@pytest.mark.slow  # 45 CPU s; the extension itself: the entropy-bonus phase below
def test_coefficient_zero_is_the_step_without_the_term(model):
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1e-3)
    opt = tx.init(params)
    batch = small_term_batch()
    step = jax.jit(functools.partial(train_step, graphdef, tx=tx))
    without = step(params, opt, batch, loss_cfg=LossConfig().traced())
    off = LossConfig(terms=WITH_BONUS, extra={"entropy_coef": 0.0}).traced()
    with_zero = step(params, opt, batch, loss_cfg=off)
    for key, value in without[2].items():
        np.testing.assert_array_equal(np.asarray(with_zero[2][key]), np.asarray(value), err_msg=key)
    for a, b in zip(jax.tree.leaves(with_zero[:2]), jax.tree.leaves(without[:2]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Its metric is the mean of −H over the action tokens; on, it changes the loss by coef × that (same program).
    bonus = float(with_zero[2]["entropy_bonus"])
    assert bonus == pytest.approx(-float(without[2]["entropy"]), rel=1e-6) and bonus < 0
    on = step(params, opt, batch, loss_cfg=LossConfig(terms=WITH_BONUS, extra={"entropy_coef": 0.5}).traced())
    assert float(on[2]["loss"]) == pytest.approx(float(without[2]["loss"]) + 0.5 * bonus, rel=1e-5, abs=1e-6)
    assert step._cache_size() == 2  # the default terms' program, and one for the terms with the bonus


def test_one_phase_of_a_tiny_run_with_the_entropy_bonus(tmp_path):
    config = tiny_run_settings(
        str(tmp_path / "run"), 1, {"loss.terms": ",".join(WITH_BONUS), "loss.entropy_coef": 0.01}
    )
    trainer = Trainer(config)
    try:
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    assert "update/entropy_bonus" in metrics and "update/entropy_bonus_tokens" in metrics
    assert np.isfinite(metrics["update/entropy_bonus"]) and metrics["update/entropy_bonus"] != 0
    assert metrics["update/entropy_bonus"] == pytest.approx(-metrics["update/entropy"], rel=1e-5)
