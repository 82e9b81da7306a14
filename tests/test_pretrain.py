"""Pretraining's examples and cache key: demonstrations whose insights are targets train the insight tokens given
the task (L_SFT's mask) next to the action; settings added after base policies shipped keep their keys."""

import numpy as np

from rltldr_jax.envs.registry import demonstrations
from rltldr_jax.settings import replace
from rltldr_jax.tokenization import Insight
from rltldr_jax.train.pretrain import LATER_KEYS, demonstration_example, pretrain_key
from tests.helpers import tiny_settings


def test_later_settings_enter_the_key_only_away_from_their_defaults():
    config = replace(tiny_settings(), {"env.name": "forge", "pretrain.steps": 10})
    key = pretrain_key(config)
    for name in LATER_KEYS:
        assert pretrain_key(replace(config, {f"pretrain.{name}": 0.0})) == key
        assert pretrain_key(replace(config, {f"pretrain.{name}": 0.3})) != key
    assert pretrain_key(replace(config, {"pretrain.statement_prob": 0.0})) == key  # (its default too, as ever)
    assert pretrain_key(replace(config, {"pretrain.statement_prob": 0.3})) != key


def test_written_insights_are_trained_given_the_task_and_the_earlier_insights(builder):
    """The target of a demonstration with `targets`: the action and each insight sentence (as L_SFT's mask marks
    it); without: the action only. The context is the same either way."""
    draw = demonstrations("forge", write_prob=1.0, insight_prob=1.0)
    rng = np.random.default_rng(0)
    task, insights, act, targets = draw(rng)
    while not insights:
        task, insights, act, targets = draw(rng)
    assert targets
    written = demonstration_example(task, insights, act, True, builder)
    plain = demonstration_example(task, insights, act, False, builder)
    np.testing.assert_array_equal(written.ids, plain.ids)
    tok = builder.tokenizer
    action = len(tok.encode(act)) + 1  # (+ <|im_end|>)
    assert plain.insight_mask.sum() == action
    ctx = builder.build(
        "t", [Insight(text, n) for text, n in insights], (), None
    )  # the insight tokens, counted as the builder marks them
    assert written.insight_mask.sum() == action + ctx.insight_mask.sum()
    trained = tok.decode(written.ids[written.insight_mask & ~plain.insight_mask].tolist())
    for text, _ in insights:
        assert text in trained
