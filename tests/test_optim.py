"""The optimizer that `optim.*` builds: the rule (`optim.name`), the warmup schedule (`optim.warmup_steps`), the
cosine decay (`optim.decay_steps`, `optim.end_learning_rate`), the default being exactly the former clip + AdamW,
config validation, and the schedule's step count surviving a checkpoint round trip."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from configs import sapi
from rltldr_jax.checkpoint import Checkpointer, CheckpointMismatchError
from rltldr_jax.config import base
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.settings import build, settings_of
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import LossConfig, learning_rate_schedule, make_optimizer, optimizer_of


def _updates(tx, grads_seq, params):
    """The updates of `tx` for each gradient of `grads_seq`, params fixed (float64 numpy)."""
    state, out = tx.init(params), []
    for g in grads_seq:
        u, state = tx.update(g, state, params)
        out.append(jax.tree.map(np.asarray, u))
    return out, state


def _random_tree(rs, scale=1.0):
    return {
        "a": (scale * rs.standard_normal((3, 4))).astype(np.float32),
        "b": (scale * rs.standard_normal(5)).astype(np.float32),
    }


@pytest.mark.parametrize("lr, wd, clip", [(3e-6, 0.0, 1.0), (1e-2, 0.01, 1.0), (1e-3, 0.0, 0.0)])
def test_default_rule_is_bit_identical_to_clip_plus_adamw(lr, wd, clip):
    """name=adamw, warmup_steps=0 builds exactly the former construction: same state tree (old checkpoints restore)
    and bit-identical updates over 4 steps of random gradients, some large enough to clip."""
    rs = np.random.default_rng(0)
    params = _random_tree(rs)
    grads = [_random_tree(rs, scale) for scale in (0.1, 3.0, 0.5, 10.0)]
    old = optax.chain(
        optax.clip_by_global_norm(clip) if clip > 0 else optax.identity(),
        optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd),
    )
    new = make_optimizer(lr, weight_decay=wd, grad_clip_norm=clip)
    (u_old, s_old), (u_new, s_new) = _updates(old, grads, params), _updates(new, grads, params)
    assert jax.tree.structure(s_old) == jax.tree.structure(s_new)
    for a, b in zip(jax.tree.leaves((u_old, s_old)), jax.tree.leaves((u_new, s_new)), strict=False):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_default_config_builds_the_default_rule():
    c = base.validate(sapi.get_config("paper"))
    assert (c.optim.name, c.optim.warmup_steps, c.optim.learning_rate, c.optim.weight_decay) == ("adamw", 0, 3e-6, 0.0)
    rs = np.random.default_rng(1)
    params, grads = _random_tree(rs), [_random_tree(rs, 5.0), _random_tree(rs, 0.2)]
    old = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-6, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
    new = optimizer_of(settings_of(c).optim)
    for a, b in zip(
        jax.tree.leaves(_updates(old, grads, params)), jax.tree.leaves(_updates(new, grads, params)), strict=False
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_warmup_schedule_learning_rates():
    """lr(t) = 0.8 * min(t, 4) / 4: 0, 0.2, 0.4, 0.6 (t = warmup_steps - 1), 0.8 (t = warmup_steps), 0.8 after."""
    schedule = learning_rate_schedule(0.8, 4)
    got = [float(schedule(t)) for t in (0, 1, 2, 3, 4, 5, 100)]
    np.testing.assert_allclose(got, [0.0, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8], rtol=1e-6)
    assert learning_rate_schedule(0.8, 0) == 0.8  # a plain float: no schedule counter in the optimizer state
    with pytest.raises(ValueError, match=r"^warmup_steps=-1 is negative: use 0 \(no warmup\)"):
        learning_rate_schedule(0.8, -1)


def test_cosine_decay_learning_rates():
    """Warmup 2, then cosine from 0.8 to 0.2 over 4 steps: lr(2 + s) = 0.2 + 0.6 * (1 + cos(pi * s / 4)) / 2, i.e.
    0, 0.4 (warmup), 0.8, 0.2 + 0.3 * (1 + 1/sqrt 2), 0.5, 0.2 + 0.3 * (1 - 1/sqrt 2), 0.2 (t = 6), 0.2 after."""
    schedule = learning_rate_schedule(0.8, 2, 4, 0.2)
    got = [float(schedule(t)) for t in (0, 1, 2, 3, 4, 5, 6, 7, 1000)]
    half = 0.3 * 2**-0.5
    np.testing.assert_allclose(got, [0.0, 0.4, 0.8, 0.5 + half, 0.5, 0.5 - half, 0.2, 0.2, 0.2], rtol=1e-6)
    # Without warmup: from lr(0) = 1 down to 0 at t = 2 (the default end_learning_rate), then 0.
    no_warmup = learning_rate_schedule(1.0, 0, 2)
    np.testing.assert_allclose([float(no_warmup(t)) for t in (0, 1, 2, 3)], [1.0, 0.5, 0.0, 0.0], atol=1e-7)
    # decay_steps = 0: no decay, whatever end_learning_rate says (today's schedules: a float without warmup).
    assert learning_rate_schedule(0.8, 0, 0, 0.5) == 0.8
    warm = learning_rate_schedule(0.8, 4, 0, 0.5)
    assert [float(warm(t)) for t in (0, 2, 4, 9)] == [float(learning_rate_schedule(0.8, 4)(t)) for t in (0, 2, 4, 9)]
    with pytest.raises(ValueError, match=r"^decay_steps=-1 is negative: use 0 \(no decay\)"):
        learning_rate_schedule(0.8, 0, -1)
    bad = (
        r"^optim.end_learning_rate=0.9 with optim.decay_steps=3: the cosine decay goes from the learning rate 0.8 to it"
    )
    with pytest.raises(ValueError, match=bad):
        make_optimizer(0.8, decay_steps=3, end_learning_rate=0.9)


def test_cosine_decay_inside_the_optimizer_counts_optimizer_steps():
    """SGD (no clipping) on a constant gradient 1: updates -lr(t) of the schedule above, t = 0..7."""
    params, grads = {"w": np.zeros(1, np.float32)}, {"w": np.ones(1, np.float32)}
    tx = make_optimizer(0.8, name="sgd", warmup_steps=2, decay_steps=4, end_learning_rate=0.2, grad_clip_norm=0.0)
    updates, state = _updates(tx, [grads] * 8, params)
    half = 0.3 * 2**-0.5
    want = [0.0, -0.4, -0.8, -0.5 - half, -0.5, -0.5 + half, -0.2, -0.2]
    np.testing.assert_allclose([u["w"][0] for u in updates], want, rtol=1e-6)
    assert [int(x) for x in jax.tree.leaves(state) if np.ndim(x) == 0] == [8]


@pytest.mark.parametrize("warmup", [0, 3])
def test_no_decay_is_bit_identical_whatever_the_end_learning_rate(warmup):
    """decay_steps=0 builds today's optimizer (the same state tree, bit-identical AdamW updates over 5 steps), also
    with a nonzero end_learning_rate (unused without decay)."""
    rs = np.random.default_rng(3)
    params = _random_tree(rs)
    grads = [_random_tree(rs, scale) for scale in (0.1, 3.0, 0.5, 10.0, 1.0)]
    lr = 1e-3 if warmup == 0 else optax.linear_schedule(0.0, 1e-3, warmup)
    old = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01))
    for end in (0.0, 5e-4):
        new = make_optimizer(1e-3, warmup_steps=warmup, decay_steps=0, end_learning_rate=end, weight_decay=0.01)
        (u_old, s_old), (u_new, s_new) = _updates(old, grads, params), _updates(new, grads, params)
        assert jax.tree.structure(s_old) == jax.tree.structure(s_new)
        for a, b in zip(jax.tree.leaves((u_old, s_old)), jax.tree.leaves((u_new, s_new)), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_warmup_inside_the_optimizer_counts_optimizer_steps():
    """SGD (no clipping) on a constant gradient 1 with lr 0.8 and 4 warmup steps: updates -lr(t) for t = 0..5."""
    params, grads = {"w": np.zeros(1, np.float32)}, {"w": np.ones(1, np.float32)}
    tx = make_optimizer(0.8, name="sgd", warmup_steps=4, grad_clip_norm=0.0)
    updates, state = _updates(tx, [grads] * 6, params)
    np.testing.assert_allclose([u["w"][0] for u in updates], [0.0, -0.2, -0.4, -0.6, -0.8, -0.8], rtol=1e-6)
    counts = [int(x) for x in jax.tree.leaves(state) if np.ndim(x) == 0]
    assert counts == [6]  # the schedule's step counter (SGD has no other state)


def test_warmup_scales_adam_from_zero():
    """Adam's first bias-corrected step is g/(|g| + eps) = ±1 per coordinate; with lr 0.5 and 2 warmup steps the
    updates are -0 at t=0, -0.25 at t=1 and -0.5 at t=2 for a constant positive gradient."""
    params, grads = {"w": np.zeros(2, np.float32)}, {"w": np.array([0.3, 0.4], np.float32)}
    tx = make_optimizer(0.5, name="adam", warmup_steps=2, grad_clip_norm=0.0)
    updates, _ = _updates(tx, [grads] * 3, params)
    np.testing.assert_allclose(
        [u["w"] for u in updates], [[0.0, 0.0], [-0.25, -0.25], [-0.5, -0.5]], rtol=1e-4
    )  # float32 bias correction (1 - 0.999^t)


def test_sgd_update_is_minus_lr_times_the_clipped_gradient():
    """Gradient (3, 0 | 4) has global norm 5: clipped to norm 1 it is (0.6, 0 | 0.8), times -lr = -0.5 gives
    (-0.3, 0 | -0.4). The second gradient (0.3, 0 | 0.4) has norm 0.5 < 1 and is not clipped: (-0.15, 0 | -0.2); no
    momentum carries over from the first step."""
    params = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([-1.0], np.float32)}
    grads = [
        {"a": np.array([3.0, 0.0], np.float32), "b": np.array([4.0], np.float32)},
        {"a": np.array([0.3, 0.0], np.float32), "b": np.array([0.4], np.float32)},
    ]
    updates, _ = _updates(make_optimizer(0.5, name="sgd", grad_clip_norm=1.0), grads, params)
    np.testing.assert_allclose(updates[0]["a"], [-0.3, 0.0], rtol=1e-6)
    np.testing.assert_allclose(updates[0]["b"], [-0.4], rtol=1e-6)
    np.testing.assert_allclose(updates[1]["a"], [-0.15, 0.0], rtol=1e-6)
    np.testing.assert_allclose(updates[1]["b"], [-0.2], rtol=1e-6)


def test_adam_and_adamw_differ_only_by_weight_decay():
    """w = 2, gradient 10 (clipped to 1): Adam's first step is -lr * 1 = -0.1; AdamW with decay 0.1 adds
    -lr * 0.1 * w = -0.02, so -0.12. With decay 0 the two are identical over several steps."""
    params, grads = {"w": np.array([2.0], np.float32)}, {"w": np.array([10.0], np.float32)}
    (adam,), _ = _updates(make_optimizer(0.1, name="adam"), [grads], params)
    (adamw,), _ = _updates(make_optimizer(0.1, name="adamw", weight_decay=0.1), [grads], params)
    np.testing.assert_allclose(adam["w"], [-0.1], rtol=1e-5)
    np.testing.assert_allclose(adamw["w"], [-0.12], rtol=1e-5)
    rs = np.random.default_rng(2)
    p, gs = _random_tree(rs), [_random_tree(rs, s) for s in (0.3, 4.0, 1.0)]
    a, _ = _updates(make_optimizer(1e-3, name="adam", warmup_steps=2), gs, p)
    b, _ = _updates(make_optimizer(1e-3, name="adamw", warmup_steps=2, weight_decay=0.0), gs, p)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False):
        np.testing.assert_array_equal(x, y)


def test_make_optimizer_refuses_bad_input_in_one_line():
    with pytest.raises(ValueError, match=r"^optim.name='rmsprop' is not one of 'adamw', 'adam', 'sgd': pick one") as e:
        make_optimizer(1e-3, name="rmsprop")
    assert "\n" not in str(e.value)
    for name in ("adam", "sgd"):
        fix = r"--config.optim.weight_decay=0, or --config.optim.name=adamw"
        with pytest.raises(
            ValueError, match=rf"^optim.weight_decay=0.01 with optim.name='{name}' would be ignored: set {fix}"
        ) as e:
            make_optimizer(1e-3, name=name, weight_decay=0.01)
        assert "\n" not in str(e.value)


def _problems(overrides):
    """The problem lines of the ConfigError for `overrides` on the tiny SAPI config."""
    with pytest.raises(base.ConfigError) as e:
        base.validate(base.override(sapi.get_config("tiny"), overrides))
    return [line[4:] for line in str(e.value).splitlines() if line.startswith("  - ")]


def test_config_validation_refuses_unknown_names_and_ignored_weight_decay():
    assert _problems({"optim.name": "rmsprop"}) == ["optim.name='rmsprop' is not one of 'adamw', 'adam', 'sgd'"]
    assert _problems({"optim.name": "sgd", "optim.weight_decay": 0.1}) == [
        "optim.weight_decay=0.1 with optim.name='sgd' would be ignored: set optim.weight_decay=0, or optim.name=adamw "
        "for decoupled weight decay"
    ]
    assert _problems({"optim.warmup_steps": -2}) == ["optim.warmup_steps=-2 is outside [0, inf)"]
    for name in ("adamw", "adam", "sgd"):  # valid combinations pass and build
        c = base.validate(base.override(sapi.get_config("tiny"), {"optim.name": name, "optim.warmup_steps": 3}))
        optimizer_of(settings_of(c).optim)
    assert _problems({"optim.decay_steps": -1}) == ["optim.decay_steps=-1 is outside [0, inf)"]
    assert _problems({"optim.end_learning_rate": -1e-5}) == ["optim.end_learning_rate=-1e-05 is outside [0.0, inf)"]
    assert _problems({"optim.decay_steps": 10, "optim.end_learning_rate": 1e-3}) == [
        "optim.end_learning_rate=0.001 with optim.decay_steps=10: the cosine decay goes from the learning rate 0.0001 "
        "to it, so it must be in [0, 0.0001]"
    ]
    # the offline SFT baselines decay from sft.learning_rate (3e-6 by default)
    assert _problems({"mode": "sft", "optim.decay_steps": 10, "optim.end_learning_rate": 1e-5}) == [
        "optim.end_learning_rate=1e-05 with optim.decay_steps=10: the cosine decay goes from the learning rate 3e-06 "
        "to it, so it must be in [0, 3e-06]"
    ]
    c = base.validate(
        base.override(sapi.get_config("tiny"), {"optim.decay_steps": 10, "optim.end_learning_rate": 1e-5})
    )
    state = optimizer_of(settings_of(c).optim).init({"w": np.zeros(1, np.float32)})
    assert [int(x) for x in jax.tree.leaves(state) if np.ndim(x) == 0] == [0, 0]  # Adam's count, the schedule's count
    # sft.learning_rate replaces optim.learning_rate for the offline SFT baselines; the rest of optim.* applies
    c = base.override(sapi.get_config("tiny"), {"optim.name": "sgd", "optim.grad_clip_norm": 0.0})
    (u,), _ = _updates(
        optimizer_of(settings_of(c).optim, learning_rate=0.25),
        [{"w": np.array([2.0], np.float32)}],
        {"w": np.zeros(1, np.float32)},
    )
    np.testing.assert_allclose(u["w"], [-0.5], rtol=1e-6)


def test_checkpoint_restores_the_schedule_step_count(tmp_path):
    """After 3 warmup steps (lr 0.8, 4 warmup steps) the restored state continues at t=3 and t=4: updates -0.6, -0.8
    on gradient 1, exactly as without the round trip. A warmup-free target does not take it (its state holds no
    schedule counter): a clear mismatch, not a silent restart of the warmup."""
    params, grads = {"w": np.zeros(1, np.float32)}, {"w": np.ones(1, np.float32)}
    tx = make_optimizer(0.8, name="sgd", warmup_steps=4, grad_clip_norm=0.0)
    _, state = _updates(tx, [grads] * 3, params)
    params = jax.device_put(params)
    with Checkpointer(tmp_path / "ckpt", keep=2, async_save=False) as ckpt:
        ckpt.save(3, params=params, opt_state=state, rng=None)
        r = ckpt.restore(abstract_params=params, abstract_opt_state=jax.eval_shape(tx.init, params))
        with pytest.raises(
            CheckpointMismatchError, match=r"(?s)only the optimizer state differs.*optim\.\*.*opt_state"
        ):
            plain = make_optimizer(0.8, name="sgd", grad_clip_norm=0.0)
            ckpt.restore(abstract_params=params, abstract_opt_state=jax.eval_shape(plain.init, params))
    assert [int(x) for x in jax.tree.leaves(r.opt_state)] == [3]
    u3, s = tx.update(grads, r.opt_state, params)
    u4, _ = tx.update(grads, s, params)
    np.testing.assert_allclose([u3["w"][0], u4["w"][0]], [-0.6, -0.8], rtol=1e-6)


def test_sharded_update_holds_the_schedule_counter():
    """The trainer's sharded state (and so its checkpoint restore targets) carries the warmup counter, replicated."""
    c = base.validate(base.override(sapi.get_config("tiny"), {"optim.warmup_steps": 5, "batch.micro_batch_size": 1}))
    spec = ModelSpec(dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=1, layer_types=()))
    model = spec.build(seed=0)
    update = ShardedUpdate(
        build(MeshConfig, settings_of(c).mesh),
        model,
        optimizer_of(settings_of(c).optim),
        LossConfig(),
        micro_batch_size=c.batch.micro_batch_size,
    )
    _, abstract_opt = update.abstract()
    scalars = [x for x in jax.tree.leaves(update.opt_state) if x.ndim == 0]
    assert [int(x) for x in scalars] == [0, 0]  # Adam's count and the schedule's count
    assert [x.shape for x in jax.tree.leaves(abstract_opt) if x.ndim == 0] == [(), ()]
    assert all(x.sharding.is_fully_replicated for x in scalars)
