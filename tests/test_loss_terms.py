"""Loss terms as data (`rltldr_jax.loss_terms`): the term-driven train step is bit-identical to the step before the
refactor (a frozen copy in tests/legacy_step.py) on plain, packed and writer/detach batches: the same loss, metrics
and updated parameters (with SGD at learning rate 1 and no clipping, the updated parameters are the gradients)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx
from legacy_step import LegacyBatch
from legacy_step import train_step as legacy_train_step

from rltldr_jax import loss_terms
from rltldr_jax.agent.step_examples import Example
from rltldr_jax.models import ModelSpec, get_preset
from rltldr_jax.train.batching import pack
from rltldr_jax.train.step import LossConfig, make_optimizer, train_step


@pytest.fixture(scope="module")
def model():
    return ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)


def _examples(seed: int = 0) -> list[Example]:
    """Six examples of 20-60 tokens: actions, insights, a writer-SFT example and a detached (RLTF-SD) one."""
    r = np.random.default_rng(seed)
    out = []
    for i, n in enumerate([40, 60, 25, 50, 20, 33]):
        pos = np.arange(n)
        writer = i == 4
        out.append(
            Example(
                ids=r.integers(1, 256, n).astype(np.int32),
                old_logprobs=np.where(pos >= n // 2, -r.uniform(3, 7, n), 0.0).astype(np.float32),
                action_mask=(pos >= n // 2) & (not writer),
                insight_mask=(pos >= 3) & (pos < 9) & (i % 2 == 0) & (not writer),
                advantage=0.0 if writer else float(r.normal()),
                task_id="t",
                attempt=i,
                step=0 if not writer else -1,
                writer_mask=((pos >= n - 8) & (pos < n - 1)) if writer else None,
                detach_ratio=i == 3,
            )
        )
    return out


def _legacy(batch) -> LegacyBatch:
    return LegacyBatch(
        ids=batch.ids,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        action_mask=batch.action_mask,
        insight_mask=batch.insight_mask,
        writer_mask=batch.writer_mask,
        detach_ratio=batch.detach_ratio,
        segments=batch.segments,
    )


def _batches() -> dict[str, object]:
    ex = _examples()
    common = dict(micro_batch_size=2, grad_accum_steps=3, pad_to_multiple=16, max_len=64)
    (plain,) = pack(ex, **common)
    (packed,) = pack(ex, **common, pack_rows=2)
    plain_only = [e for e in ex if e.writer_mask is None]
    (no_writer,) = pack(plain_only, micro_batch_size=5, grad_accum_steps=1, pad_to_multiple=16)
    bare = dataclasses.replace(no_writer, detach_ratio=None)
    bare = _without_writer(bare)
    return {"plain": plain, "packed": packed, "bare": bare}


def _without_writer(batch):
    """The batch as a caller that never heard of writer SFT or RLTF-SD builds it (no writer mask, no detach_ratio)."""
    legacy = _legacy(batch)
    return type(batch)(
        ids=legacy.ids,
        old_logprobs=legacy.old_logprobs,
        advantages=legacy.advantages,
        action_mask=legacy.action_mask,
        insight_mask=legacy.insight_mask,
    )


# Each case compiles two steps (~35 CPU s): the default run keeps the most general (AdamW, packed rows), `-m slow`
# the other five.
@pytest.mark.parametrize(
    "name, optimizer",
    [
        pytest.param(name, optimizer, marks=() if (name, optimizer) == ("packed", "adamw") else pytest.mark.slow)
        for optimizer in ("sgd", "adamw")
        for name in ("plain", "packed", "bare")
    ],
)
def test_term_driven_step_is_bit_identical_to_the_old_step(model, name, optimizer):
    batch = _batches()[name]
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1.0, name="sgd", grad_clip_norm=0.0) if optimizer == "sgd" else make_optimizer(1e-3)
    opt = tx.init(params)
    cfg = LossConfig(lam=0.5, grpo_coef=1.0, clip_eps=0.2, writer_sft_coef=0.3).traced()
    new = jax.jit(functools.partial(train_step, graphdef, tx=tx))(params, opt, batch, loss_cfg=cfg)
    old = jax.jit(functools.partial(legacy_train_step, graphdef, tx=tx))(params, opt, _legacy(batch), loss_cfg=cfg)
    new_metrics, old_metrics = new[2], old[2]
    assert set(new_metrics) == set(old_metrics)
    for key in old_metrics:
        np.testing.assert_array_equal(np.asarray(new_metrics[key]), np.asarray(old_metrics[key]), err_msg=key)
    assert float(new_metrics["loss"]) != 0 and float(new_metrics["grpo_tokens"]) > 0
    for a, b in zip(jax.tree.leaves(new[:2]), jax.tree.leaves(old[:2]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_term_registers_by_decorator_and_reads_its_own_mask_by_name():
    """`loss_term` registers a function; `Example.extra_masks` reaches `TrainBatch.masks` under its name, plain and
    packed, and every batch of a `pack` call has the same masks (one pytree, one compiled step)."""

    @loss_terms.loss_term("test_marked_nll", mask="marked", coef="marked_coef")
    def marked_nll(inputs, mask, cfg):
        return loss_terms.sft_term(inputs, mask, cfg)

    try:
        assert loss_terms.LOSS_TERMS["test_marked_nll"].fn is marked_nll
        assert loss_terms.parse_terms("grpo, test_marked_nll") == ("grpo", "test_marked_nll")
        with pytest.raises(ValueError, match="already registered"):
            loss_terms.register_loss_term(loss_terms.LossTerm("test_marked_nll", "x", marked_nll, "c"))
        with pytest.raises(ValueError, match="names a term twice"):
            loss_terms.parse_terms("grpo,grpo")
        ex = _examples()
        marked = np.zeros(len(ex[1]), bool)
        marked[5:9] = True
        ex[1] = dataclasses.replace(ex[1], extra_masks={"marked": marked})
        common = dict(micro_batch_size=2, grad_accum_steps=1, pad_to_multiple=16, max_len=64)
        first, second, third = pack(ex, **common)
        assert set(first.masks) == set(third.masks) == {"action", "insight", "writer", "marked"}
        np.testing.assert_array_equal(np.asarray(first.masks["marked"])[0, 1, : len(marked)], marked)
        assert not np.asarray(second.masks["marked"]).any()
        packed = pack(ex, **common, pack_rows=2)[0]
        assert int(np.asarray(packed.masks["marked"]).sum()) == 4
        cfg = LossConfig(terms=("grpo", "test_marked_nll"), extra={"marked_coef": 0.25})
        assert [t.name for t in cfg.loss_terms()] == ["grpo", "test_marked_nll"] and cfg.coef("marked_coef") == 0.25
        with pytest.raises(KeyError, match="no coefficient 'nope'"):
            cfg.coef("nope")
    finally:
        del loss_terms.LOSS_TERMS["test_marked_nll"]
