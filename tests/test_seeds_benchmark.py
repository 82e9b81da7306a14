"""benchmarks/seeds.py: what it times for S stacked seeds is S real optimizer steps (each seed's result equals its own
unstacked step), and its table runs at tiny shapes (no timing is asserted: the times only have to exist)."""

from __future__ import annotations

import math
import os

import jax
import numpy as np
import pytest
from flax import nnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def seeds(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))  # the benchmarks import each other as scripts do
    import seeds

    return seeds


@pytest.mark.slow  # ~40 s on 2 cores (three train-step programs compiled); `pytest -m slow` runs it
def test_stacked_seeds_are_independent_real_steps_and_the_table_runs(seeds):
    from rltldr_jax.models.presets import get_preset
    from rltldr_jax.models.qwen3_5 import Qwen35
    from rltldr_jax.train.step import LossConfig, make_optimizer, train_step

    config = get_preset("replicate_xs")
    graphdef, params = nnx.split(Qwen35(config, rngs=nnx.Rngs(0)))
    tx, loss_cfg = make_optimizer(1e-3), LossConfig().traced()
    batch = seeds.packed_batch(config.vocab_size, rows=2, length=64, per_row=2)
    stacked_params, stacked_batch = seeds.stack(params, 2), seeds.stack(batch, 2, perturb=0)
    assert not np.array_equal(*jax.tree.leaves(stacked_params)[0])  # two different policies
    step = lambda p, o, b: train_step(graphdef, p, o, b, tx=tx, loss_cfg=loss_cfg)  # noqa: E731
    new, _, metrics = jax.jit(jax.vmap(step))(stacked_params, seeds.stack(tx.init(params), 2, perturb=0), stacked_batch)
    for i in range(2):
        one = jax.tree.map(lambda x, i=i: x[i], stacked_params)
        b = jax.tree.map(lambda x, i=i: x[i], stacked_batch)
        want, _, want_metrics = jax.jit(step)(one, tx.init(one), b)
        assert want_metrics["grpo_tokens"] > 0 and want_metrics["sft_tokens"] > 0
        np.testing.assert_allclose(float(metrics["loss"][i]), float(want_metrics["loss"]), rtol=1e-5)
        for got, expected in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(expected), rtol=1e-5, atol=1e-6)

    rows = seeds.main(["--seeds=1,2", "--length=64", "--per_row=2", "--group=2", "--repeat=1"])
    assert set(rows) == {("update", 1), ("update", 2), ("decode", 1), ("decode", 2)}
    for row in rows.values():
        assert all(math.isfinite(v) and v > 0 for v in row.values()), rows
