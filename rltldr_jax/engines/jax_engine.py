"""The embedded generation engine: batched prefill and decode of a Qwen 3.5 model with its decode state.

A background thread runs the scheduler. Requests wait in a queue; whenever slots are free, waiting requests
are prefilled and their states are written into their slots (the lowest free ones first); then one fused decode call
per group of busy slots advances them by up to N tokens. A finished request frees its slot at once, so new requests
are admitted while others are still decoding. Shapes are fixed per bucket, so the jitted functions compile a
bounded number of times.

Fused decode and slot groups. The `max_batch` slots form groups of G = `decode_group` rows (fewer when max_batch is
smaller), each with its own decode state; only the groups holding a request are decoded, one jitted call each, all
dispatched before the host reads any result. A call runs up to N = `decode_steps` steps of its [G, 1] decode in a
`lax.while_loop` on the device: each step samples every row (keys folded with the token count, as one step at a
time would), writes the token and logprob into a [G, N] buffer, and checks the rows' budgets and stop ids (a
request's first MAX_STOP_IDS, padded with -1; the host checks them all); the loop returns after the step in which any
row finishes, or after N steps. Admission, aborts, pauses and weight swaps happen between calls (a swap applies to the
next call's tokens), so they wait at most N steps. The per-slot decode inputs (sampling parameters, key data, token
counts, budgets, stop ids) are numpy arrays written on admission and after each call, so the host works per call, not
per token. The step inside the loop is the same arithmetic as a one-step call: N = 1 and N = 32 give bit-identical
tokens and logprobs (tests), and a row's arithmetic never depends on what the other rows or groups hold. A decode step
attends with `_one_query_attention` (the model's attention with the query axis left out of the contractions, ~2x faster
on XLA:CPU).

Measured (benchmarks/engine.py fused; benchmarks/README.md has the table): at configs/replicate.py's shapes
(replicate_xs, max_batch 64, max_len 512) with 8 requests of ~100 prompt + 96 new tokens on a 2-core CPU, N x G =
1 x 64 (one [64, 1] call per token, as before) ran 751 tok/s end to end and 815 tok/s for the decode alone, 32 x 8
(the defaults) 4,050 and 6,483: 5.4x and 8.0x (4.6-5.6x and 6.5-9.0x over five runs on a loaded machine; 5.9-6.8x and
9.3-11.6x the engine as it was before, whose decode attention was slower too). What remains is model compute, not
the host: a [1, 128] prefill call takes ~7 ms (about half of the end-to-end time) and a [8, 1] step ~0.7 ms (~190
small XLA:CPU ops). On an accelerator with many concurrent requests one call over all slots (decode_group =
max_batch) may beat several group calls (not measured).

Sampling happens in float32 on the logits: temperature, then optional top-k / top-p truncation; the returned
logprob is that of the sampled token under this (truncated, renormalised) distribution, so at temperature 1
without truncation it equals the model's teacher-forced logprob. Each request's randomness comes from its own
key (its seed, or a fresh one), folded with the token index: a seeded completion is the same whatever else
is in the batch.

Batch invariance. Which requests are admitted together depends on thread timing, and float rounding depends on
the shapes of the matrix products: a prompt prefilled in a [2, 128] sub-batch gets a decode state that differs
at ~1e-6 from the same prompt prefilled in a [1, 32] one, and a run's later phases then drift apart. With
`batch_invariant=True` (the default) each request is prefilled on its own, and decode always runs a full [G, 1]
step whatever the group holds, whose rows do not interact: the same weights and seeds give bit-identical tokens and
logprobs whatever else runs and in whichever slot or group a request lands (G itself is part of the arithmetic: G = 1
differs from G = 4 at ~1e-6). `batch_invariant=False` prefills the requests admitted together as one right-padded
sub-batch (bucketed to powers of two): fewer, larger calls, which pays off on an accelerator with many concurrent
prompts, at the price of that rounding-level variation.

Chunked prefill and prefix reuse (`batch_invariant=True` only; `prefix_cache` module). A prompt is prefilled in
chunks of `prefill_chunk` (C) tokens aligned at multiples of C from position 0, one [1, C] call each, the last
partial chunk in a [1, bucket(rest)] call: the same calls for a prompt whatever ran before. With
`prefix_cache_bytes` > 0 the states at some full-chunk boundaries are kept and a prompt that starts with a stored
prefix resumes there, skipping those chunks, and a prompt seen whole before (a task's other attempts) is not
prefilled at all: its first token is sampled from the stored next-token logits (sampling is a program of its own, so
that a prefilled prompt's first token goes through the same one). Hit or miss give bit-identical results. New weights
empty the cache.

Decode weights (`weights_dtype`). A decode step at small batch reads every weight once per token, so its time is
the bytes of the weights over the memory bandwidth. With `weights_dtype="bfloat16"` the engine keeps its copy of
the weight matrices (projections, embedding, LM head) in bfloat16, half the bytes; each matrix product takes its
input rounded to bfloat16 and accumulates and returns float32, while everything else (norms, the delta rule,
attention scores, sampling, logprobs) stays in the model's compute dtype (measured on CPU: 3-5x faster per product
than float32 at batch 8; a bfloat16-output product, or upcasting the weight to float32 inside the step, was 6-8x
slower than float32). Logprobs are then those of the bfloat16-weight policy; the trainer's
`first_minibatch/logprob_gap` measures how far that is from its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rltldr_jax.engines.engine import GenerationEngine, GenerationRequest, GenerationResult
from rltldr_jax.engines.prefix_cache import MIN_CHUNK_BUCKET, PrefixCache, PrefixStats, prefill_chunked
from rltldr_jax.models.qwen3_5 import (
    Attention,
    DecodeState,
    Qwen35,
    RowLinear,
    init_decode_state,
    unroll,
    unroll_state,
)
from rltldr_jax.settings import choices

MIN_PREFILL_BUCKET = MIN_CHUNK_BUCKET  # the shortest prefill call
# Prefill chunk C, measured on CPU (benchmarks/engine.py's model, block-skipping attention). One 1000-token prompt
# took 0.47 / 0.35 / 0.27 / 0.25 s with C = 64 / 128 / 256 / 512 (as one [1, 1024] call: 0.21 s). With the prefix
# cache, 8 requests sharing a 1000-token prompt took 0.58 s with C = 128 and 0.70 s with 256 (2.5 / 2.0 s without),
# sharing 1100 tokens 0.63 / 0.60 s, and a 6-step attempt (1000-token prompt, +200 tokens a step) 0.77 s with either
# (2.7 / 2.3 s without). A larger C prefills a new prompt faster, a smaller one recomputes less after a hit.
DEFAULT_PREFILL_CHUNK = 128
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
WEIGHTS_DTYPES = choices("engine.weights_dtype")
# Fused decode (module doc): up to DEFAULT_DECODE_STEPS tokens per device call, slots decoded in groups of
# DEFAULT_DECODE_GROUP rows (fewer when max_batch is smaller). The device ends a call at a request's first
# MAX_STOP_IDS stop ids; the host checks them all after each call (tokens sampled past a later one are dropped).
DEFAULT_DECODE_STEPS = 32
DEFAULT_DECODE_GROUP = 8
MAX_STOP_IDS = 8

log = logging.getLogger(__name__)


def _deliver(done: Callable[[GenerationResult], None], result: GenerationResult) -> None:
    """Calls a request's callback; a failing callback is logged, never allowed to stop the scheduler."""
    try:
        done(result)
    except Exception:  # noqa: BLE001
        log.exception("the done-callback of request %s raised", result.request_id)


def _bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, (n - 1).bit_length()))


def _with_rows(state: DecodeState, rows: jax.Array, sub: DecodeState) -> DecodeState:
    """`state` with its rows `rows` replaced by the rows of `sub` (cache arrays are [n_blocks, run, B, ...]).

    `rows` has one entry per row of `sub`; an out-of-range entry (e.g. B) drops that row, so a padded
    prefill sub-batch is inserted without slicing it to the number of real requests (one compile per bucket).
    """
    layers = jax.tree.map(
        lambda big, small: big.at[:, :, rows].set(small.astype(big.dtype), mode="drop"), state.layers, sub.layers
    )
    return DecodeState(state.lengths.at[rows].set(sub.lengths, mode="drop"), layers)


class _MixedRowLinear(RowLinear):
    """`RowLinear` with a bfloat16 weight: y = bf16(x) Wᵀ accumulated and returned in float32, then cast to the
    compute dtype (`weights_dtype` in the module doc)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [..., in] → [..., out] in the compute dtype."""
        w = self.weight[...]
        y = jax.lax.dot_general(
            x.astype(w.dtype), w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )
        return y.astype(self.dtype)


class _MixedQwen35(Qwen35):
    """The unrolled model with bfloat16 weight matrices: `_MixedRowLinear` layers and a head that does the same."""

    def logits(self, h: jax.Array) -> jax.Array:
        """[B, T, d] hidden states → [B, T, V] float32 logits (bf16 operands, float32 accumulation)."""
        w = self._head_kernel()
        return jnp.einsum("btd,dv->btv", h.astype(w.dtype), w, preferred_element_type=jnp.float32)


def _one_query_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """The model's `causal_attention` for one query per row (a decode step), with the query axis left out of the
    contractions: the same products, which XLA:CPU runs ~2x faster (replicate_xs, 8 rows x 512 cache slots: 0.52 ->
    0.23 ms per step); results differ from the reference at float rounding (~1e-7).

    Args:
      q: [B, 1, H, D]; k, v: [B, S, KV, D] with H % KV == 0; q_pos: [B, 1]; k_pos: [B, S] (key j is seen iff
        k_pos[j] <= q_pos).

    Returns:
      [B, 1, H, D] in q.dtype.
    """
    b, _, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, kv, h // kv, d)
    scores = jnp.einsum("bkgd,bskd->bkgs", qg, k, preferred_element_type=jnp.float32) * d**-0.5
    scores = jnp.where((k_pos <= q_pos)[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgs,bskd->bkgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, 1, h, d).astype(q.dtype)


class _DecodeAttention(Attention):
    """`Attention` whose one-token decode step attends with `_one_query_attention` (the query axis left out of the
    contractions); everything else is the model's own. The tests hold the engine's logprobs to the model's
    teacher-forced ones."""

    def cached_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, slots: jax.Array):
        """q [B, T, H, D] over the cache k, v [B, S, Hk, D]: `_one_query_attention` when T = 1, else the model's."""
        if q.shape[1] != 1:
            return super().cached_attention(q, k, v, positions, slots)
        return _one_query_attention(q, k, v, positions, slots)


def _engine_graphdef(graphdef: nnx.GraphDef, params: nnx.State, *, mixed: bool) -> nnx.GraphDef:
    """`graphdef` (an unrolled model's) with `_DecodeAttention` layers and, if `mixed`, `_MixedRowLinear` layers and
    `_MixedQwen35` logits, for the same params."""
    model = nnx.merge(graphdef, params)  # new module objects (sharing the arrays), retyped below
    for _, node in nnx.iter_graph(model):
        if type(node) is Attention:
            node.__class__ = _DecodeAttention
        elif mixed and type(node) is RowLinear:
            node.__class__ = _MixedRowLinear
    if mixed:
        model.__class__ = _MixedQwen35
    return nnx.graphdef(model)


def _cast_matrices(params: nnx.State, dtype: Any) -> nnx.State:
    """`params` (unrolled layout) with every weight matrix and the embedding in `dtype`; norms, conv kernels and the
    DeltaNet gates' vectors keep theirs (few bytes, precision-sensitive)."""
    flat = []
    for key, var in nnx.to_flat_state(params):
        value = var[...] if isinstance(var, nnx.Variable) else var
        if value.ndim == 2 and key[-1] in ("weight", "embedding") and value.dtype != dtype:
            value = value.astype(dtype)
        flat.append((key, value))
    return nnx.from_flat_state(flat)


def _weights_dtype(value: Any) -> Any:
    """None, "", "float32", "bfloat16" or such a dtype → None (keep the model's) or the jnp dtype."""
    if value is None or value == "":
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"weights_dtype must be one of {WEIGHTS_DTYPES} ('' = the model's), got {value!r}")
    return dtype


def decode_group_size(max_batch: int, decode_group: int) -> int:
    """The rows G of a decode call: `decode_group`, or `max_batch` when that is smaller."""
    return min(decode_group, max_batch)


def decode_group_error(max_batch: int, decode_group: int, *, prefix: str = "") -> str | None:
    """Why `decode_group` does not fit `max_batch` (a one-line fix), or None. `prefix` names the config section."""
    if decode_group < 1:
        return f"{prefix}decode_group must be >= 1, got {decode_group}"
    group = decode_group_size(max_batch, decode_group)
    if max_batch % group:
        return (
            f"{prefix}decode_group={decode_group} does not divide {prefix}max_batch={max_batch}: set "
            f"{prefix}decode_group to a divisor of max_batch (or max_batch a multiple of it)"
        )
    return None


SAMPLE_BLOCK = 256  # tokens per block of the two-level inverse-CDF search in `sample_tokens`


def _first_above(cdf: jax.Array, mass: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the first index where cdf [B, n] exceeds target [B], clipped to the last index of positive
    mass [B, n] (float rounding can leave target at or above the last cdf); it always has positive mass."""
    n = cdf.shape[-1]
    last_positive = n - 1 - jnp.argmax(mass[:, ::-1] > 0, axis=-1)
    return jnp.minimum(jnp.sum(cdf <= target[:, None], axis=-1), last_positive)


def _inverse_cdf_sample(probs: jax.Array, u: jax.Array) -> jax.Array:
    """Token of each row of probs [B, V] (summing to ~1) for a uniform u [B] in [0, 1): the first token whose
    cumulative probability exceeds u · total. Two levels (blocks of SAMPLE_BLOCK tokens, then inside the chosen
    block), so the work is a few passes over [B, V] and one random number per row, where Gumbel-max sampling
    (`jax.random.categorical`) draws and takes two logs of B · V random numbers."""
    b, v = probs.shape
    blocks = jnp.pad(probs, ((0, 0), (0, -v % SAMPLE_BLOCK))).reshape(b, -1, SAMPLE_BLOCK)
    block_mass = blocks.sum(axis=-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = u * block_cdf[:, -1]
    block = _first_above(block_cdf, block_mass, target)
    inner = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
    before = jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=-1)[:, 0]
    return block * SAMPLE_BLOCK + _first_above(before[:, None] + jnp.cumsum(inner, axis=-1), inner, target)


def sample_tokens(
    logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array, keys: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One token per row and its logprob under the sampling distribution.

    Args:
      logits: [B, V] float32.
      temperature: [B]; 0 = greedy (the logprob is then the model's, at temperature 1).
      top_p: [B] in (0, 1]; top_k: [B] int, -1 = off.
      keys: [B] typed PRNG keys.

    Returns:
      (tokens [B] int32, logprobs [B] float32).
    """
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]

    def truncate(scaled: jax.Array) -> jax.Array:
        order = jnp.argsort(-scaled, axis=-1)
        ranked = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        rank = jnp.arange(scaled.shape[-1])
        keep = (mass_before < top_p[:, None]) & ((top_k[:, None] < 0) | (rank < top_k[:, None]))
        kept = jnp.where(keep, ranked, -jnp.inf)
        return jnp.full_like(scaled, -jnp.inf).at[jnp.arange(scaled.shape[0])[:, None], order].set(kept)

    needs_truncation = jnp.any((top_p < 1.0) | (top_k > 0))
    scaled = jax.lax.cond(needs_truncation, truncate, lambda s: s, scaled)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    sampled = _inverse_cdf_sample(jnp.exp(logp), jax.vmap(jax.random.uniform)(keys))
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    model_logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.where(greedy[:, None], model_logp, logp)
    return tokens, jnp.take_along_axis(picked, tokens[:, None], axis=-1)[:, 0]


def _step_keys(key_data: jax.Array, counts: jax.Array) -> jax.Array:
    """[B] typed keys for this step: each request's key folded with its number of tokens so far."""
    return jax.vmap(lambda kd, c: jax.random.fold_in(jax.random.wrap_key_data(kd), c))(key_data, counts)


@dataclasses.dataclass
class _Active:
    """A request occupying a slot."""

    request: GenerationRequest
    done: Callable[[GenerationResult], None]
    key_data: np.ndarray  # raw data of the request's PRNG key
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)


class JaxEngine(GenerationEngine):
    """Embedded, batched generation with a Qwen 3.5 model (a `GenerationEngine`).

    Args:
      model: the policy (its parameters are copied out; `update_weights` replaces them).
      max_batch: decode slots (sequences generated concurrently).
      max_len: tokens per slot, prompt + completion; longer requests are rejected with ValueError.
      cache_dtype: dtype of the KV and conv caches (the recurrent state is always float32).
      weight_version: the version label of `model`'s weights.
      batch_invariant: prefill each request alone, so results do not depend on batch composition (module doc).
      prefill_chunk: C, the tokens per prefill call and the spacing of prefix-cache boundaries (a power of two >= 16;
        `batch_invariant` only); DEFAULT_PREFILL_CHUNK says how 128 was chosen. An accelerator may prefer more.
      prefix_cache_bytes: the byte budget of the prefix cache (module doc); 0 = off. Only with `batch_invariant`.
        Entries are held as device arrays; each holds a DeltaNet state snapshot (Hv·Dk·Dv float32 per DeltaNet layer)
        and the KV cache of its prefix.
      weights_dtype: dtype of the engine's copy of the weight matrices: "" (or None) = the model's; "bfloat16" = half
        the bytes per decode step, with float32 accumulation (module doc); "float32".
      decode_steps: N, the most decode steps of one device call (module doc); 1 = one token per call.
      decode_group: G, the rows of a decode call (module doc); min(G, max_batch) must divide max_batch. G = max_batch
        decodes every slot in one call, as an accelerator with many concurrent requests may prefer.
    """

    def __init__(
        self,
        model: Qwen35,
        *,
        max_batch: int = 8,
        max_len: int = 4096,
        cache_dtype: Any = None,
        weight_version: int = 0,
        batch_invariant: bool = True,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        weights_dtype: Any = None,
        decode_steps: int = DEFAULT_DECODE_STEPS,
        decode_group: int = DEFAULT_DECODE_GROUP,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1 (1 = one token per decode call), got {decode_steps}")
        if (problem := decode_group_error(max_batch, decode_group)) is not None:
            raise ValueError(problem)
        if prefill_chunk < MIN_PREFILL_BUCKET or prefill_chunk & (prefill_chunk - 1):
            raise ValueError(f"prefill_chunk must be a power of two >= {MIN_PREFILL_BUCKET}, got {prefill_chunk}")
        if prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0 (0 = no prefix cache), got {prefix_cache_bytes}")
        cast_to = _weights_dtype(weights_dtype)
        self.config = model.config
        self.dtype = model.dtype  # compute dtype of the forward pass
        self.max_batch = max_batch
        self.max_len = max_len
        self.decode_steps = int(decode_steps)
        self.decode_group = decode_group_size(max_batch, decode_group)
        self.batch_invariant = batch_invariant
        self.prefill_chunk = prefill_chunk
        # Rows hold max_len rounded up to a multiple of C, so that a chunk never ends past the row.
        self._cache_len = -(-max_len // prefill_chunk) * prefill_chunk
        # The engine runs the `unrolled` twin of the model (one array per layer, a copy of the weights): reading a
        # layer out of stacked weights inside the compiled step would copy it at every token.
        self._graphdef, params = nnx.split(unroll(model))
        embedding = dict(nnx.to_flat_state(params))[("embed_tokens", "embedding")]
        self.weights_dtype = jnp.dtype(
            cast_to or (embedding[...] if isinstance(embedding, nnx.Variable) else embedding).dtype
        )
        # bfloat16 matrices meet bfloat16 inputs with float32 accumulation when asked for, or when the model computes in
        # bfloat16 anyway (its own products round their inputs the same way); a float32 model given bfloat16
        # parameters without weights_dtype keeps its own graph (weights upcast inside the step).
        mixed = self.weights_dtype == jnp.bfloat16 and (cast_to is not None or jnp.dtype(model.dtype) == jnp.bfloat16)
        self._graphdef = _engine_graphdef(self._graphdef, params, mixed=mixed)
        if mixed:
            cast_to = jnp.dtype(jnp.bfloat16)  # also for later updates: the mixed graph expects bfloat16 matrices
        self._cast_to = cast_to
        if cast_to is not None:
            params = _cast_matrices(params, cast_to)
        self._params = params
        self._version = int(weight_version)
        self._weights_generation = 0  # bumped by update_weights: the prefix cache's entries are then stale
        dtype = cache_dtype or model.dtype
        # One decode state per group of G slots (slot s is row s % G of group s // G): each is donated to its own calls.
        self._states = [
            self._placed(init_decode_state(self.config, self.decode_group, self._cache_len, dtype))
            for _ in range(max_batch // self.decode_group)
        ]
        self._cache_dtype = dtype
        self._prefix_stats = PrefixStats()
        self._prefix: PrefixCache | None = None
        if prefix_cache_bytes and batch_invariant:
            self._prefix = PrefixCache(prefix_cache_bytes, self._cache_len, self._prefix_stats)
        elif prefix_cache_bytes:
            log.info("prefix cache off: it applies to per-request prefill (batch_invariant=True) only")
        self._prefix_generation = 0
        self._logged_stats = PrefixStats()
        self._slots: list[_Active | None] = [None] * max_batch
        self._key_shape = jax.random.key_data(jax.random.key(0)).shape
        # Per-slot decode inputs (numpy, [max_batch, ...]), written when a request is admitted and after each call:
        # the last token, the sampling parameters, the key data, tokens so far, the token budget and the stop ids
        # (the first MAX_STOP_IDS, padded with -1; `_stop_sets` holds them all for the host's check).
        self._active = np.zeros((max_batch,), bool)
        self._last = np.zeros((max_batch,), np.int32)
        self._temperature = np.ones((max_batch,), np.float32)
        self._top_p = np.ones((max_batch,), np.float32)
        self._top_k = np.full((max_batch,), -1, np.int32)
        self._key_data = np.zeros((max_batch, *self._key_shape), np.uint32)
        self._counts = np.zeros((max_batch,), np.int32)
        self._limits = np.ones((max_batch,), np.int32)
        self._stop_ids = np.full((max_batch, MAX_STOP_IDS), -1, np.int32)
        self._stop_sets: list[frozenset[int]] = [frozenset()] * max_batch
        self._queue: deque[tuple[GenerationRequest, Callable[[GenerationResult], None]]] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._paused = False
        self._to_abort: set[str] = set()
        self._abort_all = False
        self.error: BaseException | None = None  # set if the engine thread died
        self._seed_counter = int(np.random.SeedSequence().generate_state(1)[0])
        self._busy = False  # the scheduler is inside a step (guarded by _lock)
        self._admitting: list[tuple[GenerationRequest, Callable[[GenerationResult], None]]] = []
        # Jitted per engine (not per class, keyed on `self`): the compiled programs and the decode state they hold go
        # when the engine does, so a process can run many engines one after another.
        self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1,))
        self._sample = jax.jit(self._sample_fn)
        self._empty_rows = jax.jit(self._empty_rows_fn, static_argnums=(0,))
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1,))
        self._insert = jax.jit(self._insert_fn, donate_argnums=(0,))
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()

    # -- public API -------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    def update_weights(self, params: nnx.State | Qwen35, version: int) -> None:
        """Swaps in new parameters (a model or its `nnx.state`); the tokens of later calls use them and report
        `version` (a decode call already running finishes its up to `decode_steps` tokens with the old ones).

        They are copied in the engine's layout and `weights_dtype`; the prefix cache is emptied before their first use.
        """
        if isinstance(params, nnx.Module):
            params = nnx.state(params)
        params = unroll_state(params)  # the engine's per-layer copy (see __init__)
        if self._cast_to is not None:
            params = _cast_matrices(params, self._cast_to)
        with self._lock:
            self._params = params
            self._version = int(version)
            self._weights_generation += 1

    def prefix_stats(self) -> dict[str, int]:
        """Prefill counters since the engine started: requests prefilled alone, prefix-cache hits, prompt tokens
        reused from the cache and prefilled (padding not counted), entries stored and evicted; entries and bytes held
        now and the byte budget (0 without a cache)."""
        with self._lock:
            stats = dataclasses.asdict(self._prefix_stats)
            held = (
                (0, 0, 0)
                if self._prefix is None
                else (len(self._prefix), self._prefix.bytes, self._prefix.budget_bytes)
            )
            return {**stats, "entries": held[0], "bytes": held[1], "budget_bytes": held[2]}

    def submit(self, request: GenerationRequest, done: Callable[[GenerationResult], None]) -> None:
        """Queues a request; `done(result)` is called from the engine thread when it finishes."""
        needed = len(request.prompt_ids) + request.params.max_new_tokens
        if needed > self.max_len:
            raise ValueError(
                f"request {request.request_id}: {len(request.prompt_ids)} prompt + {request.params.max_new_tokens} "
                f"new tokens exceed the engine's max_len={self.max_len}; raise max_len or lower max_new_tokens"
            )
        if any(t < 0 or t >= self.config.vocab_size for t in request.prompt_ids):
            raise ValueError(f"request {request.request_id}: prompt ids outside [0, {self.config.vocab_size})")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the engine is closed{f' after an error: {self.error!r}' if self.error else ''}")
            self._queue.append((request, done))
            self._lock.notify_all()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generates one completion; many calls may be in flight at once."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationResult] = loop.create_future()
        self.submit(request, lambda result: loop.call_soon_threadsafe(future.set_result, result))
        return await future

    def generate_many(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Blocking batch generation (results in request order), for scripts and evaluation."""
        results: list[GenerationResult | None] = [None] * len(requests)
        finished = threading.Semaphore(0)
        for i, request in enumerate(requests):

            def done(result, i=i):
                results[i] = result
                finished.release()

            self.submit(request, done)
        for _ in requests:
            finished.acquire()
        return results  # type: ignore[return-value]

    def abort(self, request_id: str | None = None) -> None:
        """Finishes one request (or, with None, every queued and running one) with reason "abort".

        Tokens generated so far are returned with the result. Takes effect between decode calls (at most
        `decode_steps` tokens later); unknown ids are ignored (the request may have finished already).
        """
        with self._lock:
            if request_id is None:
                self._abort_all = True
            else:
                self._to_abort.add(request_id)
            self._lock.notify_all()

    def pause(self, mode: str = "in_place") -> None:
        """Stops admitting and decoding until `resume()`; returns once no decode call (of up to `decode_steps`
        tokens) is running.

        Modes as SGLang's `pause_generation`: "abort" finishes every queued and running request with reason
        "abort"; "in_place" and "retract" keep them (their caches stay in their slots) and continue them on
        `resume()`, with whatever weights are current then. Weights swapped while paused apply to every later
        token, so pause → update_weights → resume gives a clean switch.
        """
        if mode not in ("abort", "in_place", "retract"):
            raise ValueError(f'pause mode must be "abort", "in_place" or "retract", got {mode!r}')
        with self._lock:
            self._paused = True
            if mode == "abort":
                self._abort_all = True
            self._lock.notify_all()
            # The scheduler holds no lock while it runs a call; it acknowledges the pause at its next loop top
            # (and applies pending aborts first). Do not call pause() from a done-callback: it would wait for itself.
            while (self._busy or self._abort_all) and not self._closed:
                self._lock.wait()

    def resume(self) -> None:
        """Continues after `pause()` (SGLang's `continue_generation`)."""
        with self._lock:
            self._paused = False
            self._lock.notify_all()

    @property
    def running(self) -> bool:
        """The scheduler thread is alive and the engine accepts requests."""
        return self._thread.is_alive() and not self._closed

    @property
    def paused(self) -> bool:
        return self._paused

    def load(self) -> dict[str, int]:
        """Requests running (in slots) and waiting (queued)."""
        with self._lock:
            return {"num_running": sum(s is not None for s in self._slots), "num_waiting": len(self._queue)}

    def close(self) -> None:
        """Stops the engine thread; queued and running requests finish with reason "abort"."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join()

    # -- jitted pieces ----------------------------------------------------------------------------------

    def _prefill_fn(self, params, state, ids, valid):
        """Continues `state` [n rows] with ids [n, T] (right-padded: valid [n, T]); returns each row's next-token
        logits [n, V] and the state. Sampling is its own program (`_sample_fn`), so that a prompt the prefix cache
        holds whole samples from stored logits exactly as a prefilled one does."""
        model = nnx.merge(self._graphdef, params)
        h, state = model.hidden_states(ids, state=state, valid=valid)
        last = jnp.maximum(valid.sum(axis=1) - 1, 0)
        return model.logits(jnp.take_along_axis(h, last[:, None, None], axis=1))[:, 0], state

    def _sample_fn(self, logits, temperature, top_p, top_k, key_data, counts):
        """Each row's first token and its logprob ([n] each) from its next-token logits [n, V]."""
        return sample_tokens(logits, temperature, top_p, top_k, _step_keys(key_data, counts))

    def _placed(self, state: DecodeState) -> DecodeState:
        """`state` placed as the jitted calls' outputs are: with the parameters' sharding when they are committed (a
        trainer's mesh). A fresh state is otherwise uncommitted, and a call taking it lowers to another program than
        the same call taking a state it returned (a second compilation of every prefill and decode shape)."""
        leaf = jax.tree.leaves(self._params)[0]
        if not leaf.committed:
            return state
        where = leaf.sharding
        if isinstance(where, jax.sharding.NamedSharding):  # the rows are whole on every device of the mesh
            where = jax.sharding.NamedSharding(where.mesh, jax.sharding.PartitionSpec())
        return jax.device_put(state, where)

    def _empty_rows_fn(self, n: int) -> DecodeState:
        return init_decode_state(self.config, n, self._cache_len, self._cache_dtype)

    def _decode_fn(
        self,
        params: nnx.State,
        state: DecodeState,
        last: jax.Array,
        active: jax.Array,
        temperature: jax.Array,
        top_p: jax.Array,
        top_k: jax.Array,
        key_data: jax.Array,
        counts: jax.Array,
        limits: jax.Array,
        stop_ids: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, DecodeState]:
        """Up to N (`decode_steps`) decode steps of one group of G rows in a `lax.while_loop`; stops after the first
        step in which an active row samples one of its stop ids or reaches its budget.

        Args:
          state: the group's decode state (G rows; donated).
          last: [G] int32, each row's last token; active: [G] bool, rows holding a request (the others are left as
            they are: no cache write counts, their outputs are ignored).
          temperature, top_p, top_k: [G] sampling parameters (`sample_tokens`).
          key_data: [G, *key] uint32 each request's key data; counts: [G] int32 its tokens so far (step i's key is the
            request's key folded with counts + i, as a one-step call would).
          limits: [G] int32 max_new_tokens; stop_ids: [G, MAX_STOP_IDS] int32, -1 = none (a request's first
            MAX_STOP_IDS stop ids; the host checks them all, see `_record`).

        Returns:
          (tokens [G, N] int32, logprobs [G, N] float32, n, state): every active row's next n tokens (columns past n
          are unwritten), n the steps taken (scalar int32), and the state after them.
        """
        model = nnx.merge(self._graphdef, params)
        rows, n = last.shape[0], self.decode_steps
        valid = active[:, None]

        def keep_going(carry):
            i, *_, finished = carry
            return (i < n) & ~finished

        def step(carry):
            i, state, last, tokens, logprobs, _ = carry
            h, state = model.hidden_states(last[:, None], state=state, valid=valid)
            keys = _step_keys(key_data, counts + i)
            token, logprob = sample_tokens(model.logits(h)[:, 0], temperature, top_p, top_k, keys)
            tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i, axis=1)
            logprobs = jax.lax.dynamic_update_slice_in_dim(logprobs, logprob[:, None], i, axis=1)
            stopped = jnp.any(token[:, None] == stop_ids, axis=1) | (counts + i + 1 >= limits)
            return i + 1, state, jnp.where(active, token, last), tokens, logprobs, jnp.any(active & stopped)

        carry = (
            jnp.zeros((), jnp.int32),
            state,
            last,
            jnp.zeros((rows, n), jnp.int32),
            jnp.zeros((rows, n), jnp.float32),
            jnp.zeros((), bool),
        )
        taken, state, _, tokens, logprobs, _ = jax.lax.while_loop(keep_going, step, carry)
        return tokens, logprobs, taken, state

    def _insert_fn(self, state, rows, sub):
        return _with_rows(state, rows, sub)

    # -- scheduler ----------------------------------------------------------------------------------------

    def _sampling_arrays(self, actives: Sequence[_Active | None], n: int):
        """Per-row sampling parameters, key data and token counts (numpy, padded to n rows)."""
        temperature = np.ones(n, np.float32)
        top_p = np.ones(n, np.float32)
        top_k = np.full(n, -1, np.int32)
        key_data = np.zeros((n, *self._key_shape), np.uint32)
        counts = np.zeros(n, np.int32)
        for i, a in enumerate(actives[:n]):
            if a is not None:
                p = a.request.params
                temperature[i], top_p[i], top_k[i] = p.temperature, p.top_p, p.top_k
                key_data[i], counts[i] = a.key_data, len(a.tokens)
        return temperature, top_p, top_k, key_data, counts

    def _admit(self, params, version: int, generation: int) -> None:
        """Prefills as many waiting requests as there are free slots: each alone (batch_invariant) or together. They
        take the lowest free slots, so that running requests pack into few decode groups."""
        free = [i for i, s in enumerate(self._slots) if s is None]
        with self._lock:
            batch = [self._queue.popleft() for _ in range(min(len(free), len(self._queue)))]
        if not batch:
            return
        self._admitting = batch  # until they sit in slots; if anything below raises, _run's cleanup aborts them
        actives = []
        for request, done in batch:
            seed = request.params.seed
            if seed is None:
                self._seed_counter += 1
                seed = int(self._seed_counter)
            actives.append(_Active(request, done, np.asarray(jax.random.key_data(jax.random.key(seed)))))
        if self._prefix is not None and generation != self._prefix_generation:
            self._log_prefix_stats()
            self._prefix.clear()  # its states were computed with other weights
            self._prefix_generation = generation
        slots = free[: len(actives)]
        if self.batch_invariant:
            placed = [(slot, *self._prefill_alone(params, a, slot)) for slot, a in zip(slots, actives, strict=True)]
        else:
            placed = [
                (slot, *sampled)
                for slot, sampled in zip(slots, self._prefill_group(params, actives, slots), strict=True)
            ]
        for slot, a in zip(slots, actives, strict=True):
            self._occupy(slot, a)
        self._admitting = []
        for slot, token, logprob in placed:
            self._record(slot, [token], [logprob], version)

    def _occupy(self, slot: int, a: _Active) -> None:
        """Puts `a` in `slot` and writes its row of the per-slot decode inputs."""
        p = a.request.params
        self._slots[slot] = a
        self._active[slot] = True
        self._temperature[slot], self._top_p[slot], self._top_k[slot] = p.temperature, p.top_p, p.top_k
        self._key_data[slot] = a.key_data
        self._counts[slot] = 0
        self._limits[slot] = p.max_new_tokens
        stops = p.stop_token_ids[:MAX_STOP_IDS]
        self._stop_ids[slot] = -1
        self._stop_ids[slot, : len(stops)] = stops
        self._stop_sets[slot] = frozenset(p.stop_token_ids)

    def _group_row(self, slot: int) -> tuple[int, int]:
        """(group, row in the group) of a slot."""
        return divmod(slot, self.decode_group)

    def _prefill_alone(self, params, a: _Active, slot: int) -> tuple[int, float]:
        """Chunk-aligned prefill of one request (module doc), resuming from the prefix cache when it can; writes the
        state into `slot` and returns the first (token, logprob)."""
        logits, row = prefill_chunked(
            lambda row, ids, valid: self._prefill(params, row, ids, valid),
            lambda: self._placed(self._empty_rows(1)),
            a.request.prompt_ids,
            self.prefill_chunk,
            self._prefix,
            self._prefix_stats,
        )
        token, logprob = self._sample(logits, *self._sampling_arrays([a], 1))
        group, r = self._group_row(slot)
        self._states[group] = self._insert(self._states[group], np.array([r], np.int32), row)
        return int(token[0]), float(logprob[0])

    def _prefill_group(self, params, actives: list[_Active], slots: list[int]) -> list[tuple[int, float]]:
        """Prefills `actives` as one right-padded sub-batch (rows and length bucketed to powers of two), writes
        their states into `slots` and returns each one's first (token, logprob)."""
        n = _bucket(len(actives))
        length = min(_bucket(max(len(a.request.prompt_ids) for a in actives), MIN_PREFILL_BUCKET), self._cache_len)
        ids = np.zeros((n, length), np.int32)
        valid = np.zeros((n, length), bool)
        for r, a in enumerate(actives):
            ids[r, : len(a.request.prompt_ids)] = a.request.prompt_ids
            valid[r, : len(a.request.prompt_ids)] = True
        logits, sub = self._prefill(params, self._placed(self._empty_rows(n)), ids, valid)
        tokens, logprobs = self._sample(logits, *self._sampling_arrays(actives, n))
        for group in sorted({self._group_row(slot)[0] for slot in slots}):
            rows = np.full(n, self.decode_group, np.int32)  # rows of other groups and padding point past the end
            for i, slot in enumerate(slots):
                g, r = self._group_row(slot)
                if g == group:
                    rows[i] = r
            self._states[group] = self._insert(self._states[group], rows, sub)
        k = len(actives)  # rows past k are bucket padding
        return [(int(t), float(lp)) for t, lp in zip(np.asarray(tokens)[:k], np.asarray(logprobs)[:k], strict=True)]

    def _log_prefix_stats(self) -> None:
        """Logs the prefix cache's use since the last call (once per weight version)."""
        if self._prefix_stats.requests > self._logged_stats.requests:
            log.debug("prefix cache: %s", self._prefix.describe(self._logged_stats))
        self._logged_stats = dataclasses.replace(self._prefix_stats)

    def _record(self, slot: int, tokens: list[int], logprobs: list[float], version: int) -> None:
        """Appends a slot's newly sampled tokens; finishes the request at its first stop token (kept) or at its
        budget. The device ends a call at the step where a row stops, so this cut is exact for a request's first
        MAX_STOP_IDS stop ids; a later one is found here, and the tokens sampled after it are dropped."""
        a = self._slots[slot]
        limit = a.request.params.max_new_tokens
        room = limit - len(a.tokens)
        cut, reason = min(len(tokens), room), None
        stops = self._stop_sets[slot]
        if stops:
            cut = next((i + 1 for i, t in enumerate(tokens[:cut]) if t in stops), cut)
            reason = "stop" if tokens[cut - 1] in stops else None
        if reason is None and cut >= room:
            reason = "length"
        a.tokens.extend(tokens[:cut])
        a.logprobs.extend(logprobs[:cut])
        self._counts[slot] = len(a.tokens)
        self._last[slot] = tokens[cut - 1]
        if reason is not None:
            self._finish(slot, reason, version)

    def _finish(self, slot: int, reason: str, version: int) -> None:
        a = self._slots[slot]
        self._slots[slot] = None
        self._active[slot] = False
        _deliver(a.done, GenerationResult(a.request.request_id, tuple(a.tokens), tuple(a.logprobs), reason, version))

    def _step(self, params, version: int) -> None:
        """Decodes every group that holds a request: one fused call each (up to N tokens per row), all dispatched
        before the first result is read, then the host records each row's tokens."""
        size = self.decode_group
        calls = []
        for group in range(len(self._states)):
            rows = slice(group * size, (group + 1) * size)
            if not self._active[rows].any():
                continue
            tokens, logprobs, taken, self._states[group] = self._decode(
                params,
                self._states[group],
                self._last[rows],
                self._active[rows],
                self._temperature[rows],
                self._top_p[rows],
                self._top_k[rows],
                self._key_data[rows],
                self._counts[rows],
                self._limits[rows],
                self._stop_ids[rows],
            )
            calls.append((group, np.flatnonzero(self._active[rows]), tokens, logprobs, taken))
        for group, active, tokens, logprobs, taken in calls:
            n = int(taken)
            tokens, logprobs = np.asarray(tokens)[:, :n], np.asarray(logprobs)[:, :n]
            for r in active:
                self._record(group * size + int(r), tokens[r].tolist(), logprobs[r].tolist(), version)

    def _apply_aborts(self, version: int) -> None:
        """Finishes the requests that `abort()` or `pause("abort")` asked for (scheduler thread only)."""
        with self._lock:
            everything, ids = self._abort_all, self._to_abort
            self._abort_all, self._to_abort = False, set()
            if everything:
                queued, self._queue = list(self._queue), deque()
            else:
                queued = [q for q in self._queue if q[0].request_id in ids]
                self._queue = deque(q for q in self._queue if q[0].request_id not in ids)
        for slot, s in enumerate(self._slots):
            if s is not None and (everything or s.request.request_id in ids):
                self._finish(slot, "abort", version)
        for request, done in queued:
            _deliver(done, GenerationResult(request.request_id, (), (), "abort", version))

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()
                    while (
                        not self._closed
                        and not self._abort_all
                        and not self._to_abort
                        and (self._paused or (not self._queue and all(s is None for s in self._slots)))
                    ):
                        self._lock.wait()
                    if self._closed:
                        break
                    self._busy = True
                    params, version, generation = self._params, self._version, self._weights_generation
                if self._abort_all or self._to_abort:
                    self._apply_aborts(version)
                    continue
                if self._queue and any(s is None for s in self._slots):
                    self._admit(params, version, generation)
                if any(s is not None for s in self._slots):
                    self._step(params, version)
        except BaseException as e:  # never leave a caller waiting: abort everything, refuse new requests
            self.error = e
            with self._lock:
                self._closed = True
            raise
        finally:
            with self._lock:
                self._busy = False
                self._lock.notify_all()
            for slot, s in enumerate(self._slots):
                if s is not None:
                    self._finish(slot, "abort", self._version)
            leftover, self._admitting = self._admitting, []
            with self._lock:
                leftover += list(self._queue)
                self._queue.clear()
            for request, done in leftover:
                _deliver(done, GenerationResult(request.request_id, (), (), "abort", self._version))
