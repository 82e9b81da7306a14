"""LoRA adapters on the Flax Qwen 3.5 (rltldr_jax/models/lora.py): attached with B = 0 they leave the logits exactly
as they were; merged they give the adapted logits; targets choose the layers; a train step moves the adapters alone
(gradients and optimizer state for them only, the base bitwise unchanged); `model.lora.*` is validated before
anything is built; a tiny LoRA run resumes exactly."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config, tiny_run_settings

from rltldr_jax.config import base
from rltldr_jax.models import ModelSpec, get_preset, lora
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.batching import pack
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import LossConfig, make_optimizer

T = 16


def _model():
    """A 4-layer tiny Qwen 3.5 (3 DeltaNet + 1 attention layer), 256-token vocabulary."""
    return ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)


IDS = (jnp.arange(2 * T, dtype=jnp.int32).reshape(2, T) * 7 + 3) % 256


def _perturb(model, scale: float = 0.05) -> None:
    """Random adapters (B ≠ 0), as after training."""
    state = lora.adapter_state(model)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape, x.dtype), state))


def test_attached_adapters_change_nothing_until_trained_and_merge_exactly():
    model = _model()
    before = model(IDS)
    lora.attach(model, lora.LoraSpec(rank=4, alpha=8.0), seed=3)
    np.testing.assert_array_equal(np.asarray(model(IDS)), np.asarray(before))  # B = 0
    # every projection of the 4 layers: per DeltaNet layer 5, per attention layer 4, per MLP 3 (stacked: 3 + 1 runs)
    paths = [p for p, m in lora.linear_layers(model) if m.lora is not None]
    assert len(paths) == 5 + 4 + 3 + 3 and not any("lm_head" in p for p in paths)
    q = next(m for p, m in lora.linear_layers(model) if p.endswith("self_attn/q_proj"))
    assert q.lora.lora_a.shape == (*q.kernel.shape[:-1], 4) and q.lora.lora_b.shape == (1, 1, 4, q.kernel.shape[-1])
    assert q.lora_scale == 2.0
    # rank 4 over a [64, 256] kernel: 4 · (64 + 256) per layer
    assert lora.adapter_count(model) == sum(
        int(np.prod(m.kernel.shape[:-2])) * 4 * sum(m.kernel.shape[-2:]) for _, m in lora.linear_layers(model)
    )
    _perturb(model)
    adapted = np.asarray(model(IDS))
    assert np.max(np.abs(adapted - np.asarray(before))) > 1e-2
    plain = lora.merged(model)
    assert not lora.has_adapters(plain) and lora.has_adapters(model)  # (a copy: the trained model keeps them)
    np.testing.assert_allclose(np.asarray(plain(IDS)), adapted, atol=2e-5)
    # merged by hand for one layer: W + (α/r)·A·B
    a, b = np.asarray(q.lora.lora_a[...]), np.asarray(q.lora.lora_b[...])
    q_plain = next(m for p, m in lora.linear_layers(plain) if p.endswith("self_attn/q_proj"))
    np.testing.assert_allclose(np.asarray(q_plain.kernel[...]), np.asarray(q.kernel[...]) + 2.0 * a @ b, rtol=1e-6)


def test_targets_choose_the_layers_and_bad_ones_are_one_line():
    model = lora.attach(_model(), lora.LoraSpec(rank=2, targets=(r"self_attn/(q_proj|v_proj)$",)))
    assert sorted(p.rsplit("/", 1)[-1] for p, m in lora.linear_layers(model) if m.lora is not None) == [
        "q_proj",
        "v_proj",
    ]
    with pytest.raises(ValueError, match="match no linear layer: the layers are down_proj, gate_proj"):
        lora.attach(_model(), lora.LoraSpec(rank=2, targets=("qproj",)))
    with pytest.raises(ValueError, match="holds LoRA adapters already"):
        lora.attach(model, lora.LoraSpec(rank=2))
    assert lora.parse_targets("") == lora.DEFAULT_TARGETS
    assert lora.parse_targets(" q_proj$ , mlp/ ") == ("q_proj$", "mlp/")
    with pytest.raises(base.ConfigError, match=r"model.lora.targets: '\(q_proj' is not a regular expression"):
        tiny_config({"model.lora.rank": 8, "model.lora.targets": "(q_proj"})
    with pytest.raises(base.ConfigError, match="model.lora.dropout=0.1: only 0 is implemented"):
        tiny_config({"model.lora.rank": 8, "model.lora.dropout": 0.1})
    tiny_config({"model.lora.targets": "(q_proj"})  # (rank 0: no adapters, nothing to check)


def _example(advantage: float) -> object:
    from rltldr_jax.agent.step_examples import Example

    positions = np.arange(T)
    return Example(
        ids=(positions * 7 + 3).astype(np.int32) % 256,
        old_logprobs=np.full(T, -2.0, np.float32),
        action_mask=positions >= 8,
        insight_mask=(positions >= 4) & (positions < 8),
        advantage=advantage,
        task_id="t",
        attempt=1,
        step=0,
    )


def test_a_train_step_moves_the_adapters_alone():
    model = lora.attach(_model(), lora.LoraSpec(rank=4))
    _perturb(model)  # (B ≠ 0: A gets a gradient too)
    update = ShardedUpdate(MeshConfig(), model, make_optimizer(1e-2), LossConfig(lam=0.5), micro_batch_size=1)
    adapters = {k for k, v in nnx.to_flat_state(update.params) if isinstance(v, nnx.LoRAParam)}
    before = {k: np.array(v[...]) for k, v in nnx.to_flat_state(update.params)}
    # AdamW's two moments per adapter, and a step count: nothing for the base
    moments = [x for x in jax.tree.leaves(update.opt_state) if np.ndim(x) > 0]
    assert len(moments) == 2 * len(adapters) and len(adapters) == 2 * 15
    (batch,) = pack([_example(1.0), _example(-1.0)], micro_batch_size=1, grad_accum_steps=2, pad_to_multiple=T)
    metrics = update.step(batch)
    assert float(metrics["skipped_nonfinite"]) == 0.0 and float(metrics["grad_norm"]) > 0
    after = {k: np.array(v[...]) for k, v in nnx.to_flat_state(update.params)}
    assert set(after) == set(before)
    for k in before:
        if k in adapters:
            assert not np.array_equal(after[k], before[k]), k
        else:
            np.testing.assert_array_equal(after[k], before[k])
    # what engines get: a plain model with the trained adapters merged in
    policy = update.model()
    assert not lora.has_adapters(policy)
    np.testing.assert_allclose(
        np.asarray(policy(IDS)), np.asarray(nnx.merge(update.graphdef, update.params)(IDS)), atol=2e-5
    )


def _host(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]


def test_a_tiny_lora_run_checkpoints_and_resumes_exactly(tmp_path):
    """Two phases in one run vs one phase, then a resumed one: the same adapters and optimizer state, bit for bit;
    the base as loaded in both."""
    from rltldr_jax.train.loop import Trainer

    overrides = {"model.lora.rank": 8, "model.lora.alpha": 16.0}
    ref = Trainer(tiny_run_settings(str(tmp_path / "ref"), 2, overrides))
    try:
        start = {k: np.array(v[...]) for k, v in nnx.to_flat_state(ref.update.params)}
        ref.run_phase()
        ref.run_phase()
        ref_params, ref_opt = _host(ref.update.params), _host(ref.update.opt_state)
        final = {k: np.array(v[...]) for k, v in nnx.to_flat_state(ref.update.params)}
    finally:
        ref.close()
    moved = {k for k in start if not np.array_equal(start[k], final[k])}
    assert moved and all("lora" in k for k in moved)
    workdir = str(tmp_path / "run")
    stopped = Trainer(tiny_run_settings(workdir, 1, overrides))
    try:
        stopped.run_phase()
    finally:
        stopped.close()
    assert os.path.isdir(os.path.join(workdir, "checkpoints"))
    resumed = Trainer(tiny_run_settings(workdir, 2, overrides), resume=True)
    try:
        assert resumed.phase == 1
        resumed.run_phase()
        params, opt = _host(resumed.update.params), _host(resumed.update.opt_state)
    finally:
        resumed.close()
    for a, b in zip(params + opt, ref_params + ref_opt, strict=True):
        np.testing.assert_array_equal(a, b)
