"""Prefix reuse for the embedded JaxEngine: decode states at chunk boundaries of prompts, in an LRU with a byte budget.

Requests of the RL loop share long prompt prefixes: the K attempts of a task start from the same task prompt, a
step's action request continues its think request's prompt, and every step of a multi-step attempt extends the
previous step's prompt and completion. Qwen 3.5 is hybrid: besides the KV cache of its attention layers, each Gated
DeltaNet layer carries a recurrent state and a conv state that summarise the whole prefix at one position, so a
reusable entry is the complete decode state of one row at a given prefix length; it cannot be cut at another length.

Chunk-aligned prefill (`JaxEngine` with `batch_invariant=True`): every prompt is prefilled in chunks at fixed
multiples of C tokens from position 0, each continuing from the state at the previous boundary; the last, partial
chunk is right-padded to a power of two (>= 16, <= C). After a full chunk that ends at boundary k·C the engine may
store the row's state under a digest of ids[:k·C] (`boundary_keys`). A later prompt with the same first k·C tokens
resumes from the deepest stored boundary and runs exactly the chunk computations (same shapes, same inputs) that it
would have run without the entry, so a hit gives bit-identical tokens and logprobs to a miss.

What is stored per prompt of n tokens (`boundaries_to_store`): the deepest boundary an identical prompt can resume
from (the largest k·C < n: the other attempts of a task, which need at least one token left to sample from), the
boundary at n itself when n is a multiple of C (a longer prompt that extends this one: the next request of the
same attempt), and the boundaries at power-of-two multiples of C (prefixes shared with other prompts, such as the
system prompt of all tasks, reused to at least half their length). That is O(log n) entries, not n / C: a DeltaNet
state snapshot is large (Hv·Dk·Dv float32 per layer) and an entry at k·C also holds k·C positions of KV cache
(only those, not the whole row).

Whole prompts: after its last chunk, a prompt's state and its next-token logits are stored under a digest of the
whole prompt (`prompt_key`). An identical prompt later (the other attempts of a task, i.i.d. samples, evaluation
attempts) prefills nothing: it samples its first token from the stored logits with its own key, as a miss samples
from the logits its last chunk returned (sampling is its own program, `JaxEngine._sample`), so a hit gives the same
bits. The entry is the miss's own row and logits (a whole row: the engine never donates a prompt's final row, so
they are held without a copy, and no program is compiled per prompt length).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rltldr_jax.models.qwen3_5 import AttentionCache, DecodeState

_DIGEST_BYTES = 16
MIN_CHUNK_BUCKET = 16  # the last, partial chunk is padded to a power of two >= this


def boundary_keys(ids: Sequence[int], chunk: int, count: int) -> list[bytes]:
    """keys[k - 1] identifies the prefix ids[: k·chunk], for k = 1..count (a chained BLAKE2b digest per chunk)."""
    tokens = np.asarray(ids[: count * chunk], np.int32)
    keys, digest = [], chunk.to_bytes(4, "little")  # the chunk size is part of the key
    for k in range(count):
        digest = hashlib.blake2b(
            digest + tokens[k * chunk : (k + 1) * chunk].tobytes(), digest_size=_DIGEST_BYTES
        ).digest()
        keys.append(digest)
    return keys


def prompt_key(ids: Sequence[int]) -> bytes:
    """The key of a whole prompt's entry (state and next-token logits after all of `ids`)."""
    return hashlib.blake2b(b"prompt" + np.asarray(ids, np.int32).tobytes(), digest_size=_DIGEST_BYTES).digest()


def boundaries_to_store(n: int, chunk: int) -> set[int]:
    """The boundary indices k (state after k·chunk tokens) worth storing for a prompt of n tokens (module doc)."""
    full = n // chunk
    keep = {k for k in ((n - 1) // chunk, full) if k >= 1}
    k = 1
    while k <= full:
        keep.add(k)
        k *= 2
    return keep


def _take_prefix(state: DecodeState, length: int) -> DecodeState:
    """Copies of a one-row state's arrays, the KV caches cut to their first `length` positions."""
    layers = tuple(
        AttentionCache(c.k[:, :, :, :length], c.v[:, :, :, :length])
        if isinstance(c, AttentionCache)
        else jax.tree.map(jnp.copy, c)
        for c in state.layers
    )
    return DecodeState(jnp.copy(state.lengths), layers)


def _restore(entry: DecodeState, cache_len: int) -> DecodeState:
    """A one-row state of `cache_len` positions from an entry (KV positions past the prefix are zero, as in a row that
    was prefilled up to there)."""

    def pad(x: jax.Array) -> jax.Array:
        return jnp.pad(x, [(0, 0)] * 3 + [(0, cache_len - x.shape[3])] + [(0, 0)] * (x.ndim - 4))

    layers = tuple(
        AttentionCache(pad(c.k), pad(c.v)) if isinstance(c, AttentionCache) else jax.tree.map(jnp.copy, c)
        for c in entry.layers
    )
    return DecodeState(jnp.copy(entry.lengths), layers)  # copies: the engine donates the row to its prefill


def _entry_bytes(row: DecodeState, length: int) -> int:
    """Bytes of `_take_prefix(row, length)`."""
    total = row.lengths.nbytes
    for c in row.layers:
        scale = length / c.k.shape[3] if isinstance(c, AttentionCache) else 1
        total += sum(round(x.nbytes * scale) for x in jax.tree.leaves(c))
    return total


@dataclasses.dataclass
class PrefixStats:
    """Counters of the engine's prefills since it started (the cache's use among them)."""

    requests: int = 0  # prompts prefilled alone (chunk-aligned), with or without a cache
    hits: int = 0  # of which resumed from a stored boundary or found whole
    prompt_hits: int = 0  # of which found whole: nothing prefilled (their state and next-token logits reused)
    reused_tokens: int = 0  # prompt tokens not prefilled thanks to a hit
    prefilled_tokens: int = 0  # prompt tokens prefilled (padding not counted)
    stored: int = 0  # entries inserted
    evicted: int = 0  # entries dropped to stay within the byte budget (or by a weight update)


class PrefixCache:
    """An LRU of one-row decode states keyed by `boundary_keys` digests, and of whole prompts' states with their
    next-token logits keyed by `prompt_key` digests, holding at most `budget_bytes`.

    Used from the engine's scheduler thread only. `clear()` drops every entry (new weights make them stale).

    Args:
      budget_bytes: the most bytes of entries held; an entry larger than that is not stored.
      cache_len: positions per row of the engine's decode state (restored entries are padded to it).
      stats: counters to update (the engine's; `stored` and `evicted` are counted here).
    """

    def __init__(self, budget_bytes: int, cache_len: int, stats: PrefixStats | None = None):
        if budget_bytes <= 0:
            raise ValueError(f"prefix cache budget must be > 0 bytes, got {budget_bytes}; use no cache to turn it off")
        self.budget_bytes = int(budget_bytes)
        self.cache_len = cache_len
        self._entries: collections.OrderedDict[bytes, tuple[DecodeState, int]] = collections.OrderedDict()
        self.bytes = 0
        self.stats = stats if stats is not None else PrefixStats()
        self._take = jax.jit(_take_prefix, static_argnums=1)
        self._restore = jax.jit(_restore, static_argnums=1)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, keys: Sequence[bytes]) -> tuple[int, DecodeState | None]:
        """(k, a fresh one-row state after keys[k - 1]'s prefix) for the deepest stored k, or (0, None)."""
        for k in range(len(keys), 0, -1):
            found = self._entries.get(keys[k - 1])
            if found is not None:
                self._entries.move_to_end(keys[k - 1])
                return k, self._restore(found[0], self.cache_len)
        return 0, None

    def lookup_prompt(self, key: bytes) -> tuple[jax.Array, DecodeState] | None:
        """(next-token logits [1, V], the one-row state) after the whole prompt of `key` (`prompt_key`), or None: the
        stored arrays themselves (`put_prompt`), not to be donated."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: bytes, row: DecodeState, length: int) -> None:
        """Stores a copy of `row` (one row, `length` tokens in it) under `key`, evicting least recently used entries."""
        self._store(key, _entry_bytes(row, length), lambda: self._take(row, length))

    def put_prompt(self, key: bytes, logits: jax.Array, row: DecodeState) -> None:
        """Stores `logits` [1, V] and `row` (one whole row, `cache_len` positions) after a whole prompt under `key`
        (`prompt_key`). They are held as they are, not copied (no program per prompt length): the caller must not
        donate them (the engine only inserts a prompt's final row into its decode state)."""
        self._store(key, _entry_bytes(row, self.cache_len) + logits.nbytes, lambda: (logits, row))

    def _store(self, key: bytes, nbytes: int, entry: Callable[[], object]) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if nbytes > self.budget_bytes:
            return
        value = entry()
        while self.bytes + nbytes > self.budget_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self.stats.evicted += 1
        self._entries[key] = (value, nbytes)
        self.bytes += nbytes
        self.stats.stored += 1

    def clear(self) -> None:
        self.stats.evicted += len(self._entries)
        self._entries.clear()
        self.bytes = 0

    def describe(self, since: PrefixStats) -> str:
        """One line on the cache's use since the counters read `since`, and what it holds now."""
        now = self.stats
        requests, reused = now.requests - since.requests, now.reused_tokens - since.reused_tokens
        total = reused + now.prefilled_tokens - since.prefilled_tokens
        return (
            f"{now.hits - since.hits} of {requests} prompts resumed from a stored prefix "
            f"({now.prompt_hits - since.prompt_hits} found whole), {reused} of {total} prompt "
            f"tokens reused ({100.0 * reused / max(total, 1):.0f} %); "
            f"{len(self)} entries, {self.bytes / 2**20:.1f} MB held"
        )


def prefill_chunked(
    prefill: Callable[[DecodeState, np.ndarray, np.ndarray], tuple[jax.Array, DecodeState]],
    empty_row: Callable[[], DecodeState],
    prompt: Sequence[int],
    chunk: int,
    cache: PrefixCache | None,
    stats: PrefixStats,
) -> tuple[jax.Array, DecodeState]:
    """Prefills one prompt in chunks aligned at multiples of `chunk` (module doc), from the deepest prefix `cache`
    holds (if any), storing the boundaries of `boundaries_to_store` on the way and the whole prompt at the end; a
    prompt `cache` holds whole is not prefilled at all.

    Args:
      prefill: (row, ids [1, T] int32, valid [1, T] bool) -> (next-token logits [1, V], row): continues a one-row
        state with T tokens (right-padded). Called with T = chunk for every full chunk.
      empty_row: a fresh one-row state.
      prompt: the prompt ids (n of them).
      cache: the prefix cache, or None.
      stats: counters to update.

    Returns:
      (next-token logits [1, V], row): the logits after the prompt's last token and the state after the prompt. With
      a cache they are held by it (`put_prompt`) and may be returned again: the caller must not donate them.
    """
    prompt = np.asarray(prompt, np.int32)
    n = len(prompt)
    stats.requests += 1
    start, row, keys, store, whole = 0, None, [], set(), b""
    if cache is not None:
        whole = prompt_key(prompt)
        found = cache.lookup_prompt(whole)
        if found is not None:
            stats.hits += 1
            stats.prompt_hits += 1
            stats.reused_tokens += n
            return found
        keys = boundary_keys(prompt, chunk, n // chunk)
        store = boundaries_to_store(n, chunk)
        hit, row = cache.lookup(keys[: (n - 1) // chunk])  # at least one token left to sample from
        start = hit * chunk
    if row is None:
        row = empty_row()
    stats.hits += start > 0
    stats.reused_tokens += start
    stats.prefilled_tokens += n - start
    while True:
        size = min(chunk, n - start)
        length = chunk if size == chunk else max(MIN_CHUNK_BUCKET, 1 << (size - 1).bit_length())
        ids = np.zeros((1, length), np.int32)
        ids[0, :size] = prompt[start : start + size]
        valid = np.zeros((1, length), bool)
        valid[0, :size] = True
        logits, row = prefill(row, ids, valid)
        start += size
        if cache is not None and size == chunk and start // chunk in store:
            cache.put(keys[start // chunk - 1], row, start)
        if start == n:
            if cache is not None:
                cache.put_prompt(whole, logits, row)
            return logits, row
