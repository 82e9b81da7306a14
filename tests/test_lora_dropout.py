"""Adapter dropout (`model.lora.dropout`, PEFT's `lora_dropout`): y = x·W + (α/r)·(drop(x)·A)·B in the train step's
loss only. A layer drops exactly as PEFT's `nn.Dropout` does (zeros with probability p, the rest scaled by 1/(1 − p));
stacked layers and micro-batches draw their own masks; the model itself, and so every engine, evaluation and export,
stays deterministic; a step's keys come from the seed and the step number in the optimizer state, so they checkpoint
and resume with it (the tiny run's resume test, tests/test_lora.py, runs with dropout)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import step_example

from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.models import ModelSpec, get_preset, lora
from rltldr_jax.models.qwen3_5 import Linear
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.batching import pack
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import (
    LossConfig,
    StepCount,
    dropout_key,
    dropout_seed_key,
    make_optimizer,
    with_step_count,
)

T = 16
IDS = (jnp.arange(2 * T, dtype=jnp.int32).reshape(2, T) * 7 + 3) % 256


def _model(dropout: float = 0.25, targets=lora.DEFAULT_TARGETS):
    """The 4-layer tiny Qwen 3.5 of tests/test_lora.py with random (trained-like: B ≠ 0) rank-4 adapters."""
    model = ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)
    lora.attach(model, lora.LoraSpec(rank=4, alpha=8.0, targets=targets, dropout=dropout), seed=3)
    state = lora.adapter_state(model)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), state))
    return model


def test_one_layer_drops_its_adapters_input_as_peft_does():
    """By hand: the mask zeroes about p of the input's elements and scales the rest by 1/(1 − p), the base path sees
    the whole input; with p = 0, or without a key, the layer is the plain adapted layer; averaged over many masks the
    output is the plain one (dropout is unbiased)."""
    p = 0.25
    layer = Linear(8, 6, use_bias=False, rngs=nnx.Rngs(0))
    lora._add_adapter(layer, 3, 2.0, nnx.Rngs(1), jnp.float32, dropout=p)
    layer.lora.lora_b[...] = jax.random.normal(jax.random.key(2), (3, 6))
    x = jax.random.normal(jax.random.key(3), (5, 7, 8))
    w, a, b = layer.kernel[...], layer.lora.lora_a[...], layer.lora.lora_b[...]
    plain = x @ w + 2.0 * (x @ a) @ b
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(plain), rtol=1e-5, atol=1e-6)  # no key: no dropout

    key = jax.random.key(4)
    noisy = lora.with_dropout(layer, key)
    assert layer.dropout_key is None  # (a copy: the layer itself stays deterministic)
    got = np.asarray(noisy(x))
    keep = np.asarray(jax.random.bernoulli(noisy.dropout_key[...], 1 - p, x.shape))
    assert abs(1 - keep.mean() - p) < 0.08  # about p of the 280 input elements dropped
    by_hand = x @ w + 2.0 * ((np.where(keep, x / (1 - p), 0.0)) @ a) @ b
    np.testing.assert_allclose(got, np.asarray(by_hand), rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(got - np.asarray(plain))) > 1e-2
    np.testing.assert_array_equal(np.asarray(lora.with_dropout(layer, key)(x)), got)  # same key, same mask

    layer.lora_dropout = 0.0
    np.testing.assert_allclose(np.asarray(lora.with_dropout(layer, key)(x)), np.asarray(plain), rtol=1e-5, atol=1e-6)
    layer.lora_dropout = p
    draws = np.stack([np.asarray(lora.with_dropout(layer, jax.random.key(k))(x)) for k in range(400)])
    standard_error = draws.std(axis=0) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - np.asarray(plain)) < 5 * standard_error + 1e-5)


def test_stacked_layers_draw_their_own_masks_and_the_model_stays_deterministic():
    model = _model()
    plain = np.asarray(model(IDS))
    noisy = lora.with_dropout(model, jax.random.key(7))
    keyed = [(p, m) for p, m in lora.linear_layers(noisy) if m.dropout_key is not None]
    assert len(keyed) == 15 and all(m.dropout_key.shape == m.kernel.shape[:-2] for _, m in keyed)
    data = [np.asarray(jax.random.key_data(m.dropout_key[...])).reshape(-1, 2) for _, m in keyed]
    rows = np.concatenate(data)
    assert len({tuple(r) for r in rows}) == len(rows)  # a key per layer and per stacked layer, all different
    assert all(m.dropout_key is None for _, m in lora.linear_layers(model))
    out = np.asarray(noisy(IDS))
    assert np.max(np.abs(out - plain)) > 1e-3
    np.testing.assert_array_equal(np.asarray(lora.with_dropout(model, jax.random.key(7))(IDS)), out)
    assert np.max(np.abs(np.asarray(lora.with_dropout(model, jax.random.key(8))(IDS)) - out)) > 1e-3
    np.testing.assert_array_equal(np.asarray(model(IDS)), plain)  # the model itself: unchanged, deterministic
    # what engines and exports take: merged, no dropout left
    assert lora.dropout_rate(model) == 0.25 and lora.dropout_rate(lora.merged(model)) == 0.0
    # only the layers with adapters drop
    only_q = lora.with_dropout(_model(targets=(r"self_attn/q_proj$",)), jax.random.key(7))
    assert [p for p, m in lora.linear_layers(only_q) if m.dropout_key is not None] == ["blocks/runs/1/self_attn/q_proj"]


def _update(dropout: float, seed: int = 0, tx=None) -> ShardedUpdate:
    return ShardedUpdate(
        MeshConfig(), _model(dropout), tx or make_optimizer(1e-2), LossConfig(lam=0.5), micro_batch_size=1, seed=seed
    )


def _batch():
    (batch,) = pack([step_example(1.0), step_example(-1.0)], micro_batch_size=1, grad_accum_steps=2, pad_to_multiple=T)
    return batch


def _counts(opt_state) -> list[int]:
    """The step numbers of the `StepCount`s in an optimizer state."""
    found = jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, StepCount))
    return [int(s.count) for s in found if isinstance(s, StepCount)]


def _adapters(update: ShardedUpdate) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(lora.split_trainable(update.params)[0])]


@pytest.mark.slow  # 60 CPU s: four tiny runs
def test_train_steps_drop_per_seed_and_step_and_resume_with_their_keys(tmp_path):
    """The step's loss runs the dropout (a different loss than without; the same for the same seed, another for
    another seed); the keys follow the step number the optimizer state holds, which a checkpoint keeps: one step,
    saved, restored into a fresh update, one more step == two steps in one go."""
    batch = _batch()
    loss = {}
    for name, dropout, seed in (("off", 0.0, 0), ("a", 0.5, 0), ("again", 0.5, 0), ("b", 0.5, 1)):
        update = _update(dropout, seed)
        loss[name] = float(update.step(batch)["loss"])
        assert _counts(update.opt_state) == ([1] if dropout > 0 else [])
    assert loss["a"] == loss["again"] and len({loss["off"], loss["a"], loss["b"]}) == 3

    whole = _update(0.5)
    whole.step(batch)
    whole.step(batch)

    first = _update(0.5)
    first.step(batch)
    with Checkpointer(tmp_path / "ckpt", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=first.params, opt_state=first.opt_state, rng=None)
        again = _update(0.5)
        params, opt_state = again.abstract()
        restored = ckpt.restore(1, abstract_params=params, abstract_opt_state=opt_state)
    again.params, again.opt_state = restored.params, restored.opt_state
    again.step(batch)
    for a, b in zip(_adapters(again), _adapters(whole), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # 34 CPU s
def test_each_step_draws_new_masks_and_every_seed_shares_one_compiled_step():
    """With a learning rate of 0 nothing moves but the step number: the loss on the same batch changes from step to
    step (new masks), and repeats in a run with the same seed; the seed is an argument of the compiled step, not a
    constant baked into it (runs with other seeds reuse its program)."""
    batch = _batch()
    still = make_optimizer(0.0, name="sgd")
    losses = {}
    for seed in (0, 0, 1):
        update = _update(0.5, seed, tx=still)
        losses.setdefault(seed, []).append([float(update.step(batch)["loss"]) for _ in range(3)])
        assert _counts(update.opt_state) == [3]
    (a, again), (b,) = losses[0], losses[1]
    assert a == again and len(set(a)) == 3 and a != b
    texts = []
    for seed in (0, 1):
        u = _update(0.5, seed)
        texts.append(u._step.lower(u.params, u.opt_state, batch, u._coefs, u._extras).as_text())
    assert texts[0] == texts[1]


def test_dropout_needs_the_step_number_in_the_optimizer_state():
    tx = make_optimizer(1e-2, name="sgd")
    trainable = lora.split_trainable(nnx.state(_model()))[0]
    with pytest.raises(ValueError, match="build it with_step_count"):
        dropout_key(tx.init(trainable), dropout_seed_key(0))
    counted = with_step_count(tx)
    state = counted.init(trainable)
    grads = jax.tree.map(jnp.ones_like, trainable)
    updates, state = counted.update(grads, state, trainable)
    plain_updates, _ = tx.update(grads, tx.init(trainable), trainable)
    for u, v in zip(jax.tree.leaves(updates), jax.tree.leaves(plain_updates), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))  # counting changes no update
    assert _counts(state) == [1]
    # plain SGD keeps no count of its own: a dropout update adds one
    update = _update(0.5, tx=tx)
    update.step(_batch())
    assert _counts(update.opt_state) == [1]


def test_exported_adapters_record_their_dropout_and_load_with_it(tmp_path):
    model = _model(0.1)
    lora.save_adapter(model, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())["lora_dropout"] == 0.1
    base = lora.without_adapters(model)
    again = lora.load_adapter(base, tmp_path / "adapter")
    assert lora.dropout_rate(again) == 0.1
    assert lora.dropout_rate(lora.set_dropout(again, 0.0)) == 0.0
    with pytest.raises(ValueError, match=r"give a probability in \[0, 1\)"):
        lora.set_dropout(again, 1.0)
