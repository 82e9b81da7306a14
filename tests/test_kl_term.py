"""The KL-to-reference loss term `kl` (not in the paper; the second replication round's stabiliser): Schulman's k3
estimator by hand, exactly 0 with its gradient when the policy is the reference, the coefficient read from the `Loss`
field `loss.kl_coef`, the step refusing to run without the reference, and a tiny run through the real Trainer whose
reference stays the initial policy, through an update and a resume."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import small_term_batch, small_term_model, tiny_config, tiny_run_settings

from rltldr_jax.config import base
from rltldr_jax.loss_terms import DEFAULT_TERMS, LOSS_TERMS, TermInputs, combine
from rltldr_jax.losses import kl_loss
from rltldr_jax.settings import settings_of
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.loop import Trainer
from rltldr_jax.train.setup import ShardedUpdate, build_policy
from rltldr_jax.train.step import LossConfig, make_optimizer, train_step

WITH_KL = (*DEFAULT_TERMS, "kl")

LN2 = math.log(2.0)
# Per token r = ref - logprob: ln 2, -ln 2, 0, 1 on the mask; off the mask a huge r (and a -inf) that must not count.
LOGPROBS = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.0, -0.25]], np.float32)
REF = LOGPROBS + np.array([[LN2, -LN2, 50.0], [0.0, 1.0, -np.inf]], np.float32)
MASK = np.array([[True, True, False], [True, True, False]])


def test_k3_by_hand():
    """k3 = exp(r) - r - 1: (2 - ln 2 - 1) + (1/2 + ln 2 - 1) + 0 + (e - 1 - 1) = e - 1.5 over 4 tokens; the k1 sum
    Σ -r = -1; the gradient in log π_θ is 1 - exp(r): -1, 1/2, 0, 1 - e, and 0 off the mask."""
    k = kl_loss(jnp.asarray(LOGPROBS), jnp.asarray(REF), jnp.asarray(MASK))
    np.testing.assert_allclose(float(k.loss_sum), math.e - 1.5, rtol=1e-6)
    assert float(k.count) == 4.0
    np.testing.assert_allclose(float(k.k1_sum), -1.0, rtol=1e-6)
    grad = jax.grad(lambda lp: kl_loss(lp, jnp.asarray(REF), jnp.asarray(MASK)).loss_sum)(jnp.asarray(LOGPROBS))
    np.testing.assert_allclose(np.asarray(grad), [[-1.0, 0.5, 0.0], [0.0, 1.0 - math.e, 0.0]], rtol=1e-6, atol=1e-7)
    # No gradient reaches the reference.
    ref_grad = jax.grad(lambda ref: kl_loss(jnp.asarray(LOGPROBS), ref, jnp.asarray(MASK)).loss_sum)(jnp.asarray(REF))
    assert not np.any(np.asarray(ref_grad))


def test_the_registered_term_and_its_metrics():
    term = LOSS_TERMS["kl"]
    assert (term.mask, term.coef, term.needs_ref, term.metric_name, term.tokens_metric_name) == (
        "action",
        "kl_coef",
        True,
        "kl",
        "kl_tokens",
    )
    assert "kl" not in DEFAULT_TERMS and not any(LOSS_TERMS[n].needs_ref for n in DEFAULT_TERMS)
    inputs = TermInputs(jnp.asarray(LOGPROBS), jnp.zeros((2, 3)), {}, jnp.asarray(REF))
    total, count, aux = term.fn(inputs, jnp.asarray(MASK), LossConfig())
    assert {k: float(v) for k, v in term.extra_metrics(aux, count).items()} == pytest.approx({"kl_k1": -0.25})
    # Normalised by the global action-token count (here 8) and weighted: 0.05 * (e - 1.5) / 8.
    loss = combine({"kl": total}, {"kl": jnp.float32(8)}, {"kl": 0.05})
    np.testing.assert_allclose(float(loss), 0.05 * (math.e - 1.5) / 8, rtol=1e-6)
    with pytest.raises(ValueError, match="needs the reference logprobs"):
        term.fn(inputs._replace(ref_logprobs=None), jnp.asarray(MASK), LossConfig())


def test_equal_logprobs_give_exactly_zero_and_no_gradient():
    lp = jnp.asarray(LOGPROBS)
    k, grad = jax.value_and_grad(lambda x: kl_loss(x, lp, jnp.asarray(MASK)).loss_sum)(lp)
    assert float(k) == 0.0 and not np.any(np.asarray(grad))


def test_the_coefficient_is_the_loss_field_kl_coef():
    c = tiny_config({"loss.terms": ",".join(WITH_KL), "loss.kl_coef": 0.05})
    loss = settings_of(c).loss
    assert loss.kl_coef == 0.05 and "kl_coef" not in loss.extra  # a field, not an extra key
    cfg = LossConfig.of(loss)
    assert cfg.terms == WITH_KL and cfg.extra == {"kl_coef": 0.05} and cfg.coef("kl_coef") == 0.05 and cfg.needs_ref
    default = LossConfig.of(settings_of(tiny_config()).loss)
    assert default.extra == {} and not default.needs_ref  # the default step's arguments are unchanged
    assert settings_of(tiny_config()).loss.kl_coef == 0.0
    with pytest.raises(base.ConfigError, match=r"loss\.kl_coef=-0\.1 is outside \[0\.0, inf\)"):
        tiny_config({"loss.terms": ",".join(WITH_KL), "loss.kl_coef": -0.1})


@pytest.fixture(scope="module")
def model():
    return small_term_model()


#: The step's KL when params == reference: 0 up to float32 rounding. The policy's forward pass (under autodiff) and
#: the reference's (without) are compiled apart, so their logprobs may differ in the last bit (~1e-7 nats); k3 is
#: second order in that difference (~1e-14), its gradient first order (~1e-6 in norm, against ~5 for the loss).
ROUNDING_KL, ROUNDING_K1, ROUNDING_GRAD = 1e-12, 1e-6, 1e-5


def test_the_step_with_the_policy_as_reference(model):
    """With params == reference the KL is 0 and adds no gradient, to float32 rounding: the kl term alone gives a
    (near-)zero gradient (SGD at lr 1 moves nothing beyond rounding), and with the default terms it changes neither
    the loss nor the update. The trained policy against the initial one has a positive KL, and the step refuses to run
    without the reference."""
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1.0, name="sgd", grad_clip_norm=0.0)
    opt = tx.init(params)
    batch = small_term_batch()
    step = jax.jit(functools.partial(train_step, graphdef, tx=tx))
    alone = LossConfig(terms=("kl",), extra={"kl_coef": 1.0}).traced()
    new, _, m = step(params, opt, batch, loss_cfg=alone, ref_params=params)
    assert 0.0 <= float(m["kl"]) < ROUNDING_KL and abs(float(m["kl_k1"])) < ROUNDING_K1
    assert float(m["grad_norm"]) < ROUNDING_GRAD
    assert float(m["kl_tokens"]) == float(jnp.sum(batch.action_mask)) == 37.0
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=ROUNDING_GRAD)

    without = step(params, opt, batch, loss_cfg=LossConfig().traced())
    on = LossConfig(terms=WITH_KL, extra={"kl_coef": 0.05}).traced()
    with_kl = step(params, opt, batch, loss_cfg=on, ref_params=params)
    assert float(with_kl[2]["loss"]) == pytest.approx(float(without[2]["loss"]), rel=1e-6)
    assert float(without[2]["grad_norm"]) > 1.0
    for a, b in zip(jax.tree.leaves(with_kl[0]), jax.tree.leaves(without[0]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ROUNDING_GRAD)

    # The updated policy against the initial one as reference: a positive KL.
    _, _, m = step(without[0], opt, batch, loss_cfg=alone, ref_params=params)
    assert float(m["kl"]) > 1e6 * ROUNDING_KL and float(m["grad_norm"]) > 1e3 * ROUNDING_GRAD
    with pytest.raises(ValueError, match=r"the loss term\(s\) kl need the reference policy"):
        step(params, opt, batch, loss_cfg=alone)


def test_sharded_update_holds_a_reference_only_when_a_term_needs_it(model):
    tx = make_optimizer(1e-3)
    plain = ShardedUpdate(MeshConfig(), model, tx, LossConfig(), micro_batch_size=2)
    assert plain.ref_params is None
    kl = ShardedUpdate(MeshConfig(), model, tx, LossConfig(terms=WITH_KL, extra={"kl_coef": 0.05}), micro_batch_size=2)
    initial = jax.tree.map(np.asarray, kl.params)
    for r, p in zip(jax.tree.leaves(kl.ref_params), jax.tree.leaves(kl.params), strict=True):
        assert r.sharding == p.sharding and r.unsafe_buffer_pointer() != p.unsafe_buffer_pointer()
    metrics = kl.step(small_term_batch())  # params donated and updated; the reference kept as it was
    assert 0.0 <= float(metrics["kl"]) < ROUNDING_KL and float(metrics["kl_tokens"]) > 0
    _assert_trees_equal(kl.ref_params, initial)
    assert _trees_differ(kl.params, initial)


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trees_differ(a, b) -> bool:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in pairs)


@pytest.mark.slow  # 72 CPU s; the term's step: test_the_step_with_the_policy_as_reference
def test_a_tiny_run_with_the_kl_term_keeps_the_initial_policy_as_reference_across_a_resume(tmp_path):
    """Phase 1 logs update/kl (0 to rounding on its one step: the policy is still the reference); the reference stays
    the initial policy after the update; a resumed run restores the trained params but keeps the initial policy (built
    from model.checkpoint, here the tiny preset's seed) as reference, so its phase 2 has a positive KL."""
    workdir = str(tmp_path / "run")
    overrides = {"loss.terms": ",".join(WITH_KL), "loss.kl_coef": 0.05}
    initial = jax.tree.map(np.asarray, nnx.split(build_policy(tiny_run_settings(workdir, 1, overrides)))[1])
    trainer = Trainer(tiny_run_settings(workdir, 1, overrides))
    try:
        first = trainer.run_phase()  # checkpoint 1
        _assert_trees_equal(trainer.update.ref_params, initial)
        trained = jax.tree.map(np.asarray, trainer.update.params)
    finally:
        trainer.close()
    assert first["update/kl_tokens"] > 0 and 0.0 <= first["update/kl"] < ROUNDING_KL
    assert abs(first["update/kl_k1"]) < ROUNDING_K1
    assert _trees_differ(trained, initial)

    resumed = Trainer(tiny_run_settings(workdir, 2, overrides), resume=True)
    try:
        assert resumed.phase == 1
        _assert_trees_equal(resumed.update.params, trained)
        _assert_trees_equal(resumed.update.ref_params, initial)
        second = resumed.run_phase()
        _assert_trees_equal(resumed.update.ref_params, initial)
    finally:
        resumed.close()
    assert second["update/kl_tokens"] > 0 and np.isfinite(second["update/kl"])
    assert second["update/kl"] > 1e3 * ROUNDING_KL  # the resumed policy is not its own reference
