"""The embedded JaxEngine: logprobs, determinism, stopping, continuous batching, weight updates."""

import asyncio
import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams
from rltldr_jax.engines.jax_engine import MAX_STOP_IDS, sample_tokens
from rltldr_jax.models import ModelSpec, get_preset, sequence_logprobs
from rltldr_jax.settings import settings_of

CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=256)


@pytest.fixture(scope="module")
def model():
    return ModelSpec(CONFIG).build(seed=0)


@pytest.fixture(scope="module")
def engine(model):
    """The defaults: up to 32 decode steps per call, one group of 4 slots."""
    with JaxEngine(model, max_batch=4, max_len=96) as eng:
        assert eng.decode_steps == 32 and eng.decode_group == 4
        yield eng


@pytest.fixture(scope="module")
def grouped(model):
    """Two groups of 2 slots, 3 decode steps per call: rows finish mid-call and requests land in either group."""
    with JaxEngine(model, max_batch=4, max_len=96, decode_steps=3, decode_group=2) as eng:
        yield eng


def _prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 256, size=rng.integers(3, 30)).tolist()) for _ in range(n)]


# The references below run on ids right-padded to REF_LEN (every engine here has max_len <= 100): the model is causal,
# so the padding changes no earlier position, and each reference compiles once per model, not once per length.
REF_LEN = 128
_FORWARD = jax.jit(lambda m, x: sequence_logprobs(m, x)[0])
_LOGITS = jax.jit(lambda m, x: m(x))


def _padded(ids) -> jnp.ndarray:
    assert len(ids) <= REF_LEN
    return jnp.asarray([(*ids, *([0] * (REF_LEN - len(ids))))], jnp.int32)


def _teacher_forced(model, prompt, completion) -> np.ndarray:
    """log π(completion | prompt) token by token, float32, from one full forward."""
    return np.asarray(_FORWARD(model, _padded((*prompt, *completion))))[0, len(prompt) : len(prompt) + len(completion)]


def _full_logits(model, ids) -> np.ndarray:
    """The model's logits at every position of `ids`, from one full forward."""
    return np.asarray(_LOGITS(model, _padded(ids)))[0, : len(ids)]


def test_logprobs_equal_teacher_forced(engine, model):
    """Temperature 1, no truncation: the engine's logprobs are the model's logprobs of the same ids."""
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=12, seed=i)) for i, p in enumerate(_prompts(6))]
    results = engine.generate_many(requests)  # 6 requests on 4 slots: two are admitted as others finish
    for request, result in zip(requests, results, strict=False):
        assert result.finish_reason == "length" and len(result.token_ids) == 12
        expected = _teacher_forced(model, request.prompt_ids, result.token_ids)
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-5)


def test_padded_prefill_bucket(model):
    """Batched prefill: three requests admitted together fill a bucket of four; the padding row is dropped, not
    recorded, and each result is its prompt's (the model's logprobs, up to rounding)."""
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=3, seed=i)) for i, p in enumerate(_prompts(3, seed=13))
    ]
    results, finished = {}, threading.Semaphore(0)
    with JaxEngine(model, max_batch=4, max_len=96, batch_invariant=False) as engine:
        engine.pause()  # queue all three first, so that one admission takes them together
        for r in requests:
            engine.submit(r, lambda res: (results.__setitem__(res.request_id, res), finished.release()))
        engine.resume()
        for _ in requests:
            assert finished.acquire(timeout=120)
        assert engine.running
    for request in requests:
        result = results[request.request_id]
        assert len(result.token_ids) == 3
        expected = _teacher_forced(model, request.prompt_ids, result.token_ids)
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-5)


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    """batch_invariant (the default): a seeded request gives bit-identical tokens and logprobs alone and admitted
    with others of other prompt lengths, in another slot (batched prefill differed here at ~1e-7)."""
    prompt = _prompts(1, seed=3)[0]
    alone = engine.generate_many([GenerationRequest(prompt, SamplingParams(max_new_tokens=10, seed=7))])[0]
    crowd = [GenerationRequest(p, SamplingParams(max_new_tokens=5 + i)) for i, p in enumerate(_prompts(5, seed=4))]
    engine.pause()  # queue them all first: one admission takes four of them together, the rest join as slots free
    results, finished = {}, threading.Semaphore(0)
    requests = [*crowd[:2], GenerationRequest(prompt, SamplingParams(max_new_tokens=10, seed=7)), *crowd[2:]]
    for r in requests:
        engine.submit(r, lambda res: (results.__setitem__(res.request_id, res), finished.release()))
    engine.resume()
    for _ in requests:
        assert finished.acquire(timeout=120)
    together = results[requests[2].request_id]
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs


def test_greedy_is_deterministic_and_argmax(engine, model):
    prompt = _prompts(1, seed=5)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    a, b = engine.generate_many([GenerationRequest(prompt, greedy), GenerationRequest(prompt, greedy)])
    assert a.token_ids == b.token_ids
    logits = _full_logits(model, prompt + a.token_ids)
    n = len(prompt)
    assert list(a.token_ids) == logits[n - 1 : n - 1 + 8].argmax(-1).tolist()


def test_stop_tokens_and_budget(engine):
    prompt = _prompts(1, seed=6)[0]
    free = engine.generate_many([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6))])[0]
    stop_at = free.token_ids[2]
    first = free.token_ids.index(stop_at)
    stopped = engine.generate_many(
        [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop_at,)))]
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]  # the stop token is returned
    with pytest.raises(ValueError, match="max_len=96"):
        engine.submit(GenerationRequest(prompt, SamplingParams(max_new_tokens=90)), lambda r: None)


def test_weight_update_changes_outputs_and_version(model):
    prompt = _prompts(1, seed=8)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    with JaxEngine(model, max_batch=4, max_len=96) as engine:  # the module engine's shapes: no new compile
        before = engine.generate_many([GenerationRequest(prompt, greedy)])[0]
        other = ModelSpec(CONFIG).build(seed=1)
        engine.update_weights(nnx.state(other), version=3)
        after = engine.generate_many([GenerationRequest(prompt, greedy)])[0]
    assert before.weight_version == 0 and after.weight_version == 3
    # The new weights produced the output: its logprobs are the new model's, not the old one's.
    np.testing.assert_allclose(after.logprobs, _teacher_forced(other, prompt, after.token_ids), atol=2e-5)
    assert np.abs(_teacher_forced(model, prompt, after.token_ids) - np.asarray(after.logprobs)).max() > 1e-2


def test_asyncio_generate_many_in_flight(engine):
    async def main():
        requests = [
            GenerationRequest(p, SamplingParams(max_new_tokens=4 + i % 3, seed=i))
            for i, p in enumerate(_prompts(7, seed=9))
        ]
        return requests, await asyncio.gather(*(engine.generate(r) for r in requests))

    requests, results = asyncio.run(main())
    assert [len(r.token_ids) for r in results] == [q.params.max_new_tokens for q in requests]
    assert [r.request_id for r in results] == [q.request_id for q in requests]


def test_top_k_top_p_truncation():
    n = 300  # rows 0..n-1: top-p 0.7; rows n..2n-1: top-k 1
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * (2 * n)))
    top_p = jnp.concatenate([jnp.full(n, 0.7), jnp.ones(n)])
    top_k = jnp.concatenate([jnp.full(n, -1), jnp.ones(n, jnp.int32)])
    tokens, lp = jax.jit(sample_tokens)(
        logits, jnp.ones(2 * n), top_p, top_k, jax.random.split(jax.random.key(0), 2 * n)
    )
    tokens, lp = np.asarray(tokens), np.asarray(lp)
    assert set(tokens[:n]) == {0, 1}  # top-p 0.7 keeps {0.5, 0.3}
    assert set(tokens[n:]) == {0}  # top-k 1
    np.testing.assert_allclose(lp[:n][tokens[:n] == 0], np.log(0.5 / 0.8), rtol=1e-5)  # renormalised
    np.testing.assert_allclose(lp[:n][tokens[:n] == 1], np.log(0.3 / 0.8), rtol=1e-5)
    np.testing.assert_allclose(lp[n:], 0.0, atol=1e-6)


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=0)
    with pytest.raises(ValueError, match="prompt token"):
        GenerationRequest(())


def test_pause_in_place_update_resume(model):
    """pause → update_weights → resume: running requests keep their tokens and finish with the new version."""
    prompt = _prompts(1, seed=10)[0]
    other = ModelSpec(CONFIG).build(seed=1)
    with JaxEngine(model, max_batch=4, max_len=96) as engine:  # the module engine's shapes: no new compile
        engine.pause()
        results, finished = [], threading.Event()
        engine.submit(
            GenerationRequest(prompt, SamplingParams(max_new_tokens=6, seed=1)),
            lambda r: (results.append(r), finished.set()),
        )
        assert engine.load() == {"num_running": 0, "num_waiting": 1}  # paused: nothing is admitted
        engine.update_weights(other, version=5)
        engine.resume()
        assert finished.wait(120)
    assert results[0].weight_version == 5 and len(results[0].token_ids) == 6
    np.testing.assert_allclose(results[0].logprobs, _teacher_forced(other, prompt, results[0].token_ids), atol=2e-5)


def test_abort_one_and_pause_abort_all(model):
    prompts = _prompts(3, seed=11)
    with JaxEngine(model, max_batch=1, max_len=96) as engine:
        engine.pause()
        requests = [GenerationRequest(p, SamplingParams(max_new_tokens=40, seed=i)) for i, p in enumerate(prompts)]
        done: dict[str, object] = {}
        first_done = threading.Event()

        def record(res):
            done[res.request_id] = res
            if res.request_id == requests[0].request_id:
                first_done.set()

        for r in requests:
            engine.submit(r, record)
        engine.abort(requests[1].request_id)  # aborted while queued, even though the engine is paused
        engine.abort("no-such-request")  # ignored
        engine.resume()
        assert first_done.wait(120)
        engine.pause("abort")  # aborts the running and the queued request
        assert engine.load() == {"num_running": 0, "num_waiting": 0}
        engine.resume()
    assert [done[r.request_id].finish_reason for r in requests] == ["length", "abort", "abort"]
    assert done[requests[1].request_id].token_ids == ()
    with pytest.raises(ValueError, match="pause mode"):
        JaxEngine.pause(engine, "later")


def test_a_failing_callback_does_not_stop_the_engine(engine):
    prompt = _prompts(1, seed=12)[0]

    def explode(result):
        raise RuntimeError("callback bug")

    engine.submit(GenerationRequest(prompt, SamplingParams(max_new_tokens=2, seed=0)), explode)
    after = engine.generate_many([GenerationRequest(prompt, SamplingParams(max_new_tokens=2, seed=0))])[0]
    assert len(after.token_ids) == 2 and engine.running and engine.error is None
    with pytest.raises(ValueError, match="seed must be in"):
        SamplingParams(seed=2**40)


def test_sampling_frequencies_match_the_distribution():
    """The two-level inverse-CDF sampler draws each token with its probability (600 tokens: 3 blocks of 256)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(scale=2.0, size=600), jnp.float32).at[17].set(-jnp.inf)
    n = 40_000
    tokens, lp = jax.jit(sample_tokens)(
        jnp.tile(logits, (n, 1)), jnp.ones(n), jnp.ones(n), jnp.full(n, -1), jax.random.split(jax.random.key(1), n)
    )
    probs = np.asarray(jax.nn.softmax(logits))
    freq = np.bincount(np.asarray(tokens), minlength=600) / n
    assert freq[17] == 0  # zero-probability tokens are never drawn
    assert np.abs(freq - probs).max() < 4 * np.sqrt(probs.max() / n)
    np.testing.assert_allclose(np.asarray(lp), np.log(probs[np.asarray(tokens)]), rtol=1e-5, atol=1e-5)


def test_prefix_cache_hits_are_bit_identical_to_misses(model):
    """Chunk-aligned prefill (C = 16) with and without the prefix cache: the K attempts of a task (same prompt, found
    whole), a longer prompt extending it (the next step), a shorter one ending on a boundary and one diverging
    mid-prompt all give the same bits whether they resume from a stored prefix or not, and the model's logprobs.
    max_len=100 is not a multiple of C (rows are rounded up to 112)."""
    rng = np.random.default_rng(20)
    task = tuple(rng.integers(0, 256, 45).tolist())
    prompts = [
        task,
        task,
        task + tuple(rng.integers(0, 256, 25).tolist()),
        task[:32],
        task[:20] + tuple(rng.integers(0, 256, 30).tolist()),
        tuple(rng.integers(0, 256, 97).tolist()),
    ]
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=3, seed=i % 2)) for i, p in enumerate(prompts)]
    results, stats = {}, {}
    for budget in (0, 1 << 24):
        with JaxEngine(model, max_batch=2, max_len=100, prefill_chunk=16, prefix_cache_bytes=budget) as engine:
            results[budget] = [
                engine.generate_many([r])[0] for r in requests
            ]  # one at a time: each sees the last's entries
            stats[budget] = engine.prefix_stats()
    assert stats[0]["hits"] == 0 and stats[0]["entries"] == 0
    # task: stores 16, 32 (45 // 16 = 2) and itself whole; the second attempt finds it whole (nothing prefilled: it
    # samples from the stored logits with its own seed), the next step resumes at 32 (64 is stored then), task[:32]
    # at 16 (it needs a token left to sample from), the diverging prompt at 16; the unrelated one misses.
    assert stats[1 << 24]["hits"] == 4 and stats[1 << 24]["prompt_hits"] == 1
    assert stats[1 << 24]["reused_tokens"] == 45 + 32 + 16 + 16
    assert stats[1 << 24]["prefilled_tokens"] + stats[1 << 24]["reused_tokens"] == sum(map(len, prompts))
    for cached, plain, request in zip(results[1 << 24], results[0], requests, strict=False):
        assert cached.token_ids == plain.token_ids and cached.logprobs == plain.logprobs
        np.testing.assert_allclose(
            cached.logprobs, _teacher_forced(model, request.prompt_ids, cached.token_ids), atol=2e-5
        )


def test_attempts_of_one_prompt_prefill_it_once(model):
    """K attempts of one prompt submitted together (a GRPO group, the i.i.d. samples of a base check): the first is
    prefilled, the other K - 1 find it whole and sample their first token from its stored logits, each with its own
    seed: the same bits as an engine without a cache."""
    prompt = tuple(np.random.default_rng(23).integers(0, 256, 37).tolist())
    requests = [GenerationRequest(prompt, SamplingParams(max_new_tokens=4, seed=s)) for s in range(6)]
    out = {}
    for budget in (0, 1 << 24):
        with JaxEngine(model, max_batch=8, max_len=64, prefill_chunk=16, prefix_cache_bytes=budget) as engine:
            out[budget] = engine.generate_many(requests), engine.prefix_stats()
    (plain, _), (cached, stats) = out[0], out[1 << 24]
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert [r.logprobs for r in cached] == [r.logprobs for r in plain]
    assert stats["prompt_hits"] == 5 and stats["prefilled_tokens"] == 37 and stats["reused_tokens"] == 5 * 37
    assert len({tuple(r.token_ids) for r in cached}) > 1  # the seeds drew different completions


def test_prefix_cache_budget_and_new_weights(model):
    """Entries beyond the byte budget evict the least recently used ones; new weights empty the cache (no stale hit)."""
    rng = np.random.default_rng(21)
    prompts = [tuple(rng.integers(0, 256, 40).tolist()) for _ in range(3)]
    with JaxEngine(model, max_batch=2, max_len=64, prefill_chunk=16, prefix_cache_bytes=1) as tiny:
        tiny.generate_many([GenerationRequest(prompts[0], SamplingParams(max_new_tokens=2, seed=0))])
        assert tiny.prefix_stats()["entries"] == 0  # one entry is larger than the budget: nothing is stored
    with JaxEngine(model, max_batch=2, max_len=64, prefill_chunk=16) as engine:
        engine.generate_many([GenerationRequest(prompts[0], SamplingParams(max_new_tokens=2, seed=0))])
        entry = engine.prefix_stats()["bytes"] // 2  # 40 tokens store the boundaries at 16 and 32 (not the same size)
    with JaxEngine(model, max_batch=2, max_len=64, prefill_chunk=16, prefix_cache_bytes=3 * entry) as engine:
        for p in prompts:
            engine.generate_many([GenerationRequest(p, SamplingParams(max_new_tokens=2, seed=0))])
        stats = engine.prefix_stats()
        assert stats["evicted"] > 0 and 0 < stats["bytes"] <= 3 * entry and stats["hits"] == 0
        other = ModelSpec(CONFIG).build(seed=1)
        engine.update_weights(other, version=2)
        again = engine.generate_many([GenerationRequest(prompts[-1], SamplingParams(max_new_tokens=4, seed=0))])[0]
        assert engine.prefix_stats()["hits"] == 0 and again.weight_version == 2
    np.testing.assert_allclose(again.logprobs, _teacher_forced(other, prompts[-1], again.token_ids), atol=2e-5)


@pytest.mark.slow  # 19 CPU s; bf16 numerics: test_qwen3_5.py::test_bf16_path
def test_bf16_weights_logprobs_are_close_to_fp32(model):
    """weights_dtype="bfloat16": sampled logprobs within 0.05 nats of the float32 model's teacher-forced ones (0.012
    measured here), |mean gap| < 0.005 (what the trainer logs as first_minibatch/logprob_gap); greedy tokens are the
    float32 argmax or within 0.05 of it, and most greedy completions equal the float32 engine's."""
    prompts = _prompts(8, seed=22)
    sampled = [GenerationRequest(p, SamplingParams(max_new_tokens=16, seed=i)) for i, p in enumerate(prompts)]
    greedy = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=16)) for p in prompts]
    with (
        JaxEngine(model, max_batch=4, max_len=96, weights_dtype="bfloat16") as bf16,
        JaxEngine(model, max_batch=4, max_len=96) as fp32,
    ):
        assert bf16.weights_dtype == jnp.bfloat16 and fp32.weights_dtype == jnp.float32
        ours, ours_greedy, reference = (
            bf16.generate_many(sampled),
            bf16.generate_many(greedy),
            fp32.generate_many(greedy),
        )
        bf16.update_weights(model, version=4)  # the update is cast too
        after = bf16.generate_many(greedy[:1])[0]
    gaps = np.concatenate(
        [_teacher_forced(model, r.prompt_ids, o.token_ids) - o.logprobs for r, o in zip(sampled, ours, strict=False)]
    )
    assert np.abs(gaps).max() < 0.05 and abs(gaps.mean()) < 0.005
    for r, o in zip(greedy, ours_greedy, strict=False):
        n = len(r.prompt_ids)
        full = _full_logits(model, (*r.prompt_ids, *o.token_ids))[n - 1 : n - 1 + len(o.token_ids)]
        chosen = np.take_along_axis(full, np.asarray(o.token_ids)[:, None], axis=-1)[:, 0]
        assert (full.max(-1) - chosen).max() < 0.05
    assert sum(o.token_ids == f.token_ids for o, f in zip(ours_greedy, reference, strict=False)) >= 6
    assert after.weight_version == 4 and after.token_ids == ours_greedy[0].token_ids


def test_bad_engine_options(model):
    with pytest.raises(ValueError, match="prefill_chunk must be a power of two"):
        JaxEngine(model, prefill_chunk=24)
    with pytest.raises(ValueError, match="prefix_cache_bytes must be >= 0"):
        JaxEngine(model, prefix_cache_bytes=-1)
    with pytest.raises(ValueError, match="weights_dtype must be one of"):
        JaxEngine(model, weights_dtype="float16")
    with pytest.raises(ValueError, match="decode_steps must be >= 1"):
        JaxEngine(model, decode_steps=0)
    with pytest.raises(ValueError, match="decode_group=3 does not divide max_batch=4"):
        JaxEngine(model, max_batch=4, decode_group=3)


def test_config_engine_options_reach_the_embedded_engine(model, tmp_path):
    """engine.prefill_chunk, engine.prefix_cache_mb, engine.weights_dtype, engine.decode_steps and
    engine.decode_group (configs/base.py) reach the policy's JaxEngine."""
    from rltldr_jax.config import base
    from rltldr_jax.engines.factory import EngineConfig, policy_engine

    config = base.get_config()
    assert EngineConfig.of(settings_of(config)).jax_engine_options()["prefix_cache_bytes"] == 1024 * 2**20
    assert config.engine.weights_dtype == ""
    base.override(
        config,
        {
            "engine.kind": "jax",
            "engine.prefix_cache_mb": 3,
            "engine.weights_dtype": "bfloat16",
            "engine.prefill_chunk": 32,
            "engine.max_batch": 4,
            "engine.decode_steps": 5,
            "engine.decode_group": 2,
            "rollout.max_context_tokens": 64,
        },
    )
    with policy_engine(EngineConfig.of(settings_of(config)), model, workdir=str(tmp_path)) as engine:
        assert engine.weights_dtype == jnp.bfloat16 and engine.prefix_stats()["budget_bytes"] == 3 * 2**20
        assert engine.prefill_chunk == 32 and engine.decode_steps == 5 and engine.decode_group == 2
    base.override(config, {"engine.weights_dtype": "float16"})
    with pytest.raises(base.ConfigError, match="engine.weights_dtype"):
        base.validate(config)
    base.override(config, {"engine.weights_dtype": "", "engine.decode_group": 3})
    with pytest.raises(base.ConfigError, match="engine.decode_group=3 does not divide engine.max_batch=4"):
        base.validate(config)
    base.override(config, {"engine.decode_group": 8, "engine.decode_steps": 0})
    with pytest.raises(base.ConfigError, match="engine.decode_steps"):
        base.validate(config)


def _submit_all(engine: JaxEngine, requests, on_done=None) -> dict:
    """Queues `requests` while paused, so that one admission takes them in order (the lowest free slots first), then
    waits for all of them; results by request id. `on_done(result)` runs in the engine thread first."""
    results, finished = {}, threading.Semaphore(0)

    def done(result):
        results[result.request_id] = result
        if on_done is not None:
            on_done(result)
        finished.release()

    engine.pause()
    for r in requests:
        engine.submit(r, done)
    engine.resume()
    for _ in requests:
        assert finished.acquire(timeout=120)
    return results


def _mixed_requests(seed: int) -> list[GenerationRequest]:
    """Seeded sampling, greedy, top-p and top-k truncation, a stop token; budgets that are not multiples of N."""
    prompts = _prompts(6, seed=seed)
    params = [
        SamplingParams(max_new_tokens=13, seed=1),
        SamplingParams(temperature=0.0, max_new_tokens=17),
        SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=9, seed=2),
        SamplingParams(top_k=5, max_new_tokens=20, seed=3),
        SamplingParams(max_new_tokens=40, seed=4, stop_token_ids=(7, 77)),
        SamplingParams(temperature=1.3, max_new_tokens=7, seed=5),
    ]
    return [GenerationRequest(p, sp) for p, sp in zip(prompts, params, strict=True)]


def test_fused_decode_equals_one_step_calls(engine, model):
    """decode_steps=32 (the module engine) and decode_steps=1 (one token per call, as before the fused loop), same
    group size: bit-identical tokens and logprobs for greedy, seeded and truncated sampling, 6 requests on 4 slots
    (XLA compiles the step inside the while loop to the same arithmetic as the one-step call)."""
    requests = _mixed_requests(seed=30)
    fused = engine.generate_many(requests)
    with JaxEngine(model, max_batch=4, max_len=96, decode_steps=1) as one_step:
        single = one_step.generate_many(requests)
    for f, s in zip(fused, single, strict=True):
        assert f.token_ids == s.token_ids and f.logprobs == s.logprobs and f.finish_reason == s.finish_reason
    assert [len(r.token_ids) for r in fused if r.finish_reason == "length"] == [
        q.params.max_new_tokens for q, r in zip(requests, fused, strict=True) if r.finish_reason == "length"
    ]


def test_a_request_does_not_depend_on_its_group_or_neighbours(grouped, engine):
    """Bit-identical tokens and logprobs alone (slot 0), sharing its group with another request, and in the other
    group next to a request that finishes mid-call; the same tokens (logprobs up to rounding) with a group of 4."""
    target = GenerationRequest(_prompts(1, seed=31)[0], SamplingParams(max_new_tokens=11, seed=9))
    others = [
        GenerationRequest(p, SamplingParams(max_new_tokens=2 + 3 * i, seed=i)) for i, p in enumerate(_prompts(3, 32))
    ]
    alone = grouped.generate_many([target])[0]
    same_group = _submit_all(grouped, [target, *others])[target.request_id]  # slot 0, next to others[0] (slot 1)
    other_group = _submit_all(grouped, [*others, target])[target.request_id]  # slot 3, next to others[2] (slot 2)
    for result in (same_group, other_group):
        assert result.token_ids == alone.token_ids and result.logprobs == alone.logprobs
    wider = engine.generate_many([target])[0]
    assert wider.token_ids == alone.token_ids
    np.testing.assert_allclose(wider.logprobs, alone.logprobs, atol=1e-5)


def test_rows_finishing_mid_call_stop_exactly(grouped):
    """N=3: a budget that ends mid-call and a stop token sampled mid-call end their rows there (the stop token
    included), while their neighbour decodes on; a stop id past the first MAX_STOP_IDS (checked on the host) too."""
    prompt, neighbour = _prompts(2, seed=33)
    sampled = SamplingParams(max_new_tokens=12, seed=0)
    free = grouped.generate_many([GenerationRequest(prompt, sampled)])[0]
    stop_at = free.token_ids[4]  # the prefill token, one call of 3, then the 2nd step of the next call
    assert free.token_ids.index(stop_at) == 4
    unused = [t for t in range(256) if t not in free.token_ids][:MAX_STOP_IDS]
    requests = [
        GenerationRequest(prompt, dataclasses.replace(sampled, stop_token_ids=(stop_at,))),
        GenerationRequest(neighbour, SamplingParams(max_new_tokens=20, seed=1)),
        GenerationRequest(prompt, dataclasses.replace(sampled, stop_token_ids=(*unused, stop_at))),
        GenerationRequest(prompt, dataclasses.replace(sampled, max_new_tokens=6)),
    ]
    results = _submit_all(grouped, requests)
    stopped, long, late_stop, short = (results[r.request_id] for r in requests)
    assert stopped.finish_reason == late_stop.finish_reason == "stop"
    assert stopped.token_ids == late_stop.token_ids == free.token_ids[:5]
    assert stopped.logprobs == late_stop.logprobs == free.logprobs[:5]
    assert short.finish_reason == "length" and short.token_ids == free.token_ids[:6]
    assert long.finish_reason == "length" and len(long.token_ids) == 20


def test_abort_and_pause_between_multi_step_calls(grouped):
    """Aborts and pauses act between calls of N=3 steps. A request aborted from its group neighbour's done-callback
    keeps exactly the tokens of the calls so far (a prefix of its uninterrupted run); abort-all also ends the other
    group's requests and the queue. An in-place pause mid-request changes nothing; pause("abort") returns a prefix."""
    prompt, short_prompt = _prompts(2, seed=34)
    long = SamplingParams(max_new_tokens=60, seed=5)
    full = grouped.generate_many([GenerationRequest(prompt, long)])[0]
    assert len(full.token_ids) == 60
    for everything in (False, True):
        short = GenerationRequest(short_prompt, SamplingParams(max_new_tokens=4, seed=0))
        victim = GenerationRequest(prompt, long)
        fillers = [GenerationRequest(short_prompt, SamplingParams(max_new_tokens=12, seed=i)) for i in range(2)]
        queued = GenerationRequest(short_prompt, SamplingParams(max_new_tokens=2, seed=3))

        def abort(result, short=short, victim=victim, everything=everything):
            if result.request_id == short.request_id:
                grouped.abort(None if everything else victim.request_id)

        # One admission fills the 4 slots (short and victim: group 0; the fillers: group 1); `queued` waits. The first
        # call of each group takes 3 steps, the last of which ends `short`'s budget.
        results = _submit_all(grouped, [short, victim, *fillers, queued], on_done=abort)
        aborted = results[victim.request_id]
        assert aborted.finish_reason == "abort"
        assert aborted.token_ids == full.token_ids[:4] and aborted.logprobs == full.logprobs[:4]
        if everything:
            assert [len(results[f.request_id].token_ids) for f in fillers] == [4, 4]
            assert {results[r.request_id].finish_reason for r in (*fillers, queued)} == {"abort"}
            assert results[queued.request_id].token_ids == ()
        else:
            assert [results[r.request_id].finish_reason for r in (*fillers, queued)] == ["length"] * 3

    companion = GenerationRequest(short_prompt, SamplingParams(max_new_tokens=2, seed=0))
    for mode in ("in_place", "abort"):
        results, first_call, finished = [], threading.Event(), threading.Event()
        grouped.pause()
        grouped.submit(companion, lambda r, first_call=first_call: first_call.set())
        grouped.submit(
            GenerationRequest(prompt, long),
            lambda r, results=results, finished=finished: (results.append(r), finished.set()),
        )
        grouped.resume()
        assert first_call.wait(120)  # after the first call (one step: the companion's budget)
        grouped.pause(mode)
        grouped.resume()
        assert finished.wait(120)
        (result,) = results
        n = len(result.token_ids)
        assert result.token_ids == full.token_ids[:n] and result.logprobs == full.logprobs[:n]
        if mode == "in_place" or result.finish_reason == "length":  # (a very slow pause may come after the end)
            assert n == 60
        else:
            assert result.finish_reason == "abort" and n >= 2


def test_one_program_per_shape_with_committed_parameters(model):
    """Parameters placed on a mesh (as the trainer's are): a fresh decode state and the states the jitted calls
    return have the same placement, so a two-chunk prompt's first and second [1, C] prefill calls, and the first and
    later decode calls, run one compiled program each (before: a second compilation of every shape)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    placed = nnx.merge(*nnx.split(model)[:1], jax.device_put(nnx.state(model), replicated))
    prompt = tuple(range(1, 41))  # chunks of 16: [1, 16], [1, 16], then the last 8 tokens in a [1, 16] call
    with JaxEngine(placed, max_batch=2, max_len=64, prefill_chunk=16, decode_steps=2) as engine:
        first = engine.generate_many([GenerationRequest(prompt, SamplingParams(max_new_tokens=5, seed=0))])[0]
        again = engine.generate_many([GenerationRequest(prompt, SamplingParams(max_new_tokens=5, seed=0))])[0]
        assert engine._prefill._cache_size() == 1 and engine._decode._cache_size() == 1
    assert first.token_ids == again.token_ids
