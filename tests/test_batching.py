"""Attempts → examples (advantages, filters, masks, old logprobs) → packed TrainBatches."""

from __future__ import annotations

import numpy as np
import pytest

from rltldr_jax.agent.episode import Attempt, StepRecord, task_text
from rltldr_jax.agent.step_examples import Example
from rltldr_jax.envs import Task, Verdict
from rltldr_jax.tokenization import Insight
from rltldr_jax.train.batching import (
    ExampleConfig,
    length_buckets,
    length_buckets_error,
    pack,
    phase_examples,
)


def _step(tok, think: str, action: str, *, forced_close: bool = False, obs: str | None = "ok") -> StepRecord:
    think_ids = tok.encode(think)
    close = [tok.think_end_id, *tok.encode("\n\n")]
    action_ids = tok.encode(f"```python\n{action}\n```") + [tok.im_end_id]
    ids = (*think_ids, *close, *action_ids)
    forced = (False,) * len(think_ids) + (forced_close,) * len(close) + (False,) * len(action_ids)
    logprobs = tuple(0.0 if f else -0.1 * (i + 1) for i, f in enumerate(forced))
    return StepRecord(ids, forced, logprobs, action, obs, 0)


def _attempt(tok, task: Task, index: int, success: bool, insights=(), steps: int = 2) -> Attempt:
    records = tuple(_step(tok, f"think {index}.{k}", f"x = {k}", forced_close=(k == 0)) for k in range(steps))
    return Attempt(task, index, tuple(insights), records, "completed", Verdict(success, "", int(success), 1))


def test_advantages_filters_masks_and_packing(builder):
    tok = builder.tokenizer
    a, b = Task("t/a", "Do A.", "sapi", "train"), Task("t/b", "Do B.", "sapi", "train")
    hint = Insight("Remember to paginate.", attempt=1)
    attempts = [
        _attempt(tok, a, 1, False),
        _attempt(tok, a, 2, True, [hint]),
        _attempt(tok, a, 3, False, [hint]),
        _attempt(tok, a, 4, False, [hint]),
        *[_attempt(tok, b, i, False, [hint] if i > 1 else []) for i in range(1, 4)],  # no success: zero advantage
    ]
    examples, stats = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.0))
    assert stats.zero_advantage_groups == 1 and stats.kept_attempts == 4 and len(examples) == 8
    assert [e.advantage for e in examples[::2]] == [-0.25, 0.75, -0.25, -0.25]  # r - mean(r), one value per attempt
    second = examples[3]  # attempt 2, step 1: the first step is context without its think trace
    ctx_text = tok.decode(second.ids)
    assert "think 2.0" not in ctx_text and "think 2.1" in ctx_text and task_text(a) in ctx_text
    step = attempts[1].steps[1]
    sampled = ~np.asarray(step.forced)
    start = len(second) - len(step.action_ids)
    assert np.array_equal(np.flatnonzero(second.action_mask), start + np.flatnonzero(sampled))
    np.testing.assert_allclose(second.old_logprobs[start:], step.logprobs)
    assert second.old_logprobs[:start].sum() == 0
    assert tok.decode(second.ids[second.insight_mask]) == hint.text  # the flipped mask: exactly the insight sentence
    assert examples[0].insight_mask.sum() == 0  # attempt 1 had no insight
    first = examples[2]  # attempt 2, step 0: its forced `</think>\n\n` is context, not a target
    assert first.action_mask.sum() == sum(not f for f in attempts[1].steps[0].forced)

    # 1 positive → no negative may stay
    kept, stats = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.75))
    assert stats.kept_attempts == 1 and {e.attempt for e in kept} == {2}
    sft, stats = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.75, sft_on_filtered=True))
    assert stats.sft_only_attempts == 4  # the dropped insight-conditioned attempts: a/3, a/4, b/2, b/3
    assert all(
        e.action_mask.sum() == 0 and e.insight_mask.sum() > 0 for e in sft if e.attempt != 2 or e.task_id == "t/b"
    )

    batches = pack(examples, micro_batch_size=2, grad_accum_steps=3, pad_to_multiple=64)
    assert len(batches) == 2 and batches[0].ids.shape[:2] == (3, 2) and batches[0].ids.shape[2] % 64 == 0
    last = batches[1]
    assert int(last.action_mask[1:].sum()) == 0 and int(last.ids[1:].sum()) == 0  # 8 = 6 + 2: padding rows are empty
    assert np.asarray(last.advantages).reshape(-1)[:2].tolist() == [e.advantage for e in examples[6:]]


def test_split_advantages_makes_separate_groups(builder):
    tok = builder.tokenizer
    a = Task("t/a", "Do A.", "sapi", "train")
    hint = Insight("Remember to paginate.", attempt=1)
    attempts = [
        _attempt(tok, a, 1, True, steps=1),
        _attempt(tok, a, 2, True, [hint], steps=1),
        _attempt(tok, a, 3, False, [hint], steps=1),
        _attempt(tok, a, 4, False, [hint], steps=1),
    ]
    examples, stats = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.0, split_advantages=True))
    # unconditioned group {1: success} has zero advantage and is dropped; conditioned {2, 3, 4} = [1, 0, 0] − 1/3
    assert stats.zero_advantage_groups == 1 and [e.attempt for e in examples] == [2, 3, 4]
    np.testing.assert_allclose([e.advantage for e in examples], [2 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def _conditioned_phase(tok):
    a = Task("t/a", "Do A.", "sapi", "train")
    hint = Insight("Remember to paginate.", attempt=1)
    attempts = [
        _attempt(tok, a, 1, False, steps=1),
        _attempt(tok, a, 2, True, steps=1),
        _attempt(tok, a, 3, True, [hint], steps=1),
        _attempt(tok, a, 4, False, [hint], steps=2),
    ]
    return attempts, hint


def test_off_policy_removes_insights_and_keeps_sft_as_prefix_examples(builder):
    tok = builder.tokenizer
    attempts, hint = _conditioned_phase(tok)
    examples, _ = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.0, insight_rollouts="off_policy"))
    steps = [e for e in examples if e.step >= 0]
    prefixes = [e for e in examples if e.step == -1]
    assert [e.attempt for e in steps] == [1, 2, 3, 4, 4]
    assert not any(e.insight_mask.any() for e in steps) and not any(hint.text in tok.decode(e.ids) for e in steps)
    # The sampled tokens and their (with-insight) old logprobs are unchanged: the ratio is π(y|task)/π_old(y|task+f).
    in_context, _ = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.0))
    for off, on in zip(steps, in_context, strict=True):
        np.testing.assert_array_equal(off.old_logprobs[off.action_mask], on.old_logprobs[on.action_mask])
        assert off.advantage == on.advantage and not off.detach_ratio
    # One SFT-only example (task + insights) per step of each conditioned attempt: 1 + 2.
    assert [e.attempt for e in prefixes] == [3, 4, 4]
    assert all(tok.decode(e.ids[e.insight_mask]) == hint.text and not e.action_mask.any() for e in prefixes)
    no_sft_config = ExampleConfig(positive_ratio=0.0, insight_rollouts="off_policy", lam=0.0)  # λ = 0: no SFT term
    no_sft, _ = phase_examples(attempts, builder, no_sft_config)
    assert all(e.step >= 0 for e in no_sft)


def test_self_distill_uses_the_no_insight_baseline_without_ratio(builder):
    tok = builder.tokenizer
    attempts, hint = _conditioned_phase(tok)
    examples, _ = phase_examples(attempts, builder, ExampleConfig(positive_ratio=0.0, insight_rollouts="self_distill"))
    # RLTF-SD: baseline = mean reward of the attempts without insights (1 and 2: 0.5), for every attempt.
    assert [(e.attempt, e.advantage, e.detach_ratio) for e in examples] == [
        (1, -0.5, False),
        (2, 0.5, False),
        (3, 0.5, True),
        (4, -0.5, True),
        (4, -0.5, True),
    ]
    assert not any(e.insight_mask.any() or hint.text in tok.decode(e.ids) for e in examples)
    (batch,) = pack(examples, micro_batch_size=5, grad_accum_steps=1, pad_to_multiple=16)
    assert np.asarray(batch.detach_ratio).tolist() == [[False, False, True, True, True]]


def test_writer_sft_examples_target_the_insight_in_the_writer_context(builder):
    from rltldr_jax.agent.insight import WriterOutput

    tok = builder.tokenizer
    attempts, hint = _conditioned_phase(tok)
    writer_prompt = tuple(builder.build("Writer this failed attempt.").ids.tolist())  # ends with an open <think>
    writer_outputs = [
        ("t/a", 1, WriterOutput(hint.text, {"hint": hint.text}, None, 0, 0, prompt_ids=writer_prompt)),
        ("t/a", 4, WriterOutput("Check the totals.", {}, None, 0, 0, prompt_ids=writer_prompt)),
    ]
    writer_sft = ExampleConfig(positive_ratio=0.0, writer_sft_coef=0.5)
    examples, stats = phase_examples(attempts, builder, writer_sft, writer_outputs=writer_outputs)
    writer = [e for e in examples if e.writer_mask is not None]
    assert stats.writer_examples == 2 == len(writer)
    first = writer[0]
    assert tok.decode(first.ids[first.writer_mask]) == hint.text
    assert tok.decode(first.ids).endswith(
        "Writer this failed attempt.<|im_end|>\n<|im_start|>assistant\n<think>\n</think>\n\n"
        "Remember to paginate.<|im_end|>"
    )
    assert not first.action_mask.any() and not first.insight_mask.any()
    next_success = ExampleConfig(positive_ratio=0.0, writer_sft_coef=0.5, writer_sft_filter="next_success")
    # Self-play insight SFT keeps an insight only if the next attempt succeeded with it in context: attempt 2
    # succeeded without the hint written after attempt 1, and attempt 4 has no successor, so nothing is kept.
    _, stats = phase_examples(attempts, builder, next_success, writer_outputs=writer_outputs)
    assert stats.writer_examples == 0
    writer_outputs.append(
        ("t/a", 2, WriterOutput(hint.text, {}, None, 0, 0, prompt_ids=writer_prompt))
    )  # 3 succeeded with it
    _, stats = phase_examples(attempts, builder, next_success, writer_outputs=writer_outputs)
    assert stats.writer_examples == 1


def _plain(n: int, advantage: float = 1.0) -> Example:
    """An example of n tokens, action mask on all but the first."""
    return Example(
        ids=np.arange(1, n + 1, dtype=np.int32),
        old_logprobs=np.full(n, -1.0, np.float32),
        action_mask=np.arange(n) > 0,
        insight_mask=np.zeros(n, bool),
        advantage=advantage,
        task_id="t",
        attempt=1,
        step=0,
    )


def test_length_buckets_are_few_and_cover_the_context():
    assert length_buckets("geometric", 64, 512) == (64, 128, 192, 256, 384, 512)
    paper = length_buckets("geometric", 256, 32768)  # the paper's setting: 14 shapes where multiples of 256 are 128
    assert len(paper) == 14 and paper[-1] == 32768 and all(b % 256 == 0 for b in paper)
    assert all(b / a <= 1.5 for a, b in zip(paper[1:], paper[2:], strict=False))
    assert length_buckets("geometric", 16, 3000)[-2:] == (2048, 3008)  # the last: max_len rounded up
    assert length_buckets("geometric", 1024, 2048) == (1024, 2048)  # the tiny preset's
    assert length_buckets("multiples", 64, 512) is None
    assert length_buckets("100,300,600", 64, 512) == (100, 300, 600)
    assert length_buckets_error("geometric", 64, 512) is None
    assert "an increasing comma-separated list" in length_buckets_error("300,100", 64, 512)
    assert "use e.g. 'geometric'" in length_buckets_error("pow2", 64, 512)
    assert length_buckets_error("100,300", 64, 512) == (
        "batch.length_buckets='100,300': the longest bucket 300 is shorter than rollout.max_context_tokens=512: add a "
        "bucket >= 512, or lower rollout.max_context_tokens"
    )


def test_pack_pads_to_the_smallest_bucket_and_keeps_the_row_shape():
    buckets = length_buckets("geometric", 64, 512)
    examples = [_plain(n) for n in (200, 30, 150, 257, 40)]
    batches = pack(examples, micro_batch_size=2, grad_accum_steps=2, pad_to_multiple=64, length_buckets=buckets)
    # Steps of 4 rows: longest 257 -> 384 (multiples of 64 would give 320); the last step holds one example of 40
    # tokens -> 64, and keeps its 4 rows (3 empty).
    assert [b.ids.shape for b in batches] == [(2, 2, 384), (2, 2, 64)]
    last = batches[1]
    assert np.asarray(last.ids).reshape(4, 64)[0, :40].tolist() == list(range(1, 41))
    assert int(np.asarray(last.action_mask).reshape(4, 64)[1:].sum()) == 0 and int(np.asarray(last.ids)[1:].sum()) == 0
    assert np.asarray(last.advantages).reshape(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    old = pack(examples, micro_batch_size=2, grad_accum_steps=2, pad_to_multiple=64)  # length_buckets None: multiples
    assert [b.ids.shape[-1] for b in old] == [320, 64]
    with pytest.raises(ValueError, match=r"more than the longest of batch.length_buckets \(64, 128\)"):
        pack([_plain(129)], micro_batch_size=1, grad_accum_steps=1, length_buckets=(64, 128))
