"""Δθ: the parameter-space distance between two checkpoints (the paper's Table 7, appendix E.1).

With Δθ = θ_b − θ_a (a = the original policy, b = the trained one; every entry of every text-model tensor):

    ‖Δθ‖₁          Σ |Δ|                                              exact (float64 sums)
    ‖Δθ‖₂          (Σ Δ²)^½                                            exact
    >bf16          #{ |Δ| > 2⁻⁸·|θ_a| } / n                            exact
    Gini(|Δθ|)     Σᵢ (2i − n − 1)·x₍ᵢ₎ / (n·Σx), x = |Δ| ascending, i = 1..n     ± a reported bound
    top-1% share   (sum of the k = ⌈n/100⌉ largest Δ²) / Σ Δ²                      ± a reported bound
    changed        #{ Δ ≠ 0 } / n                                      exact (not in the paper; helps read >bf16)

over all n entries (unchanged ones included), globally and per module kind (`module_kind`): attention,
DeltaNet, MLP, embeddings (embed_tokens and an untied lm_head) and norms (every norm weight, including the
q/k norms of attention and the gated norm inside DeltaNet).

**">bf16".** The paper counts "how many parameters have been updated beyond bfloat16 precision" without a
formula. bf16 keeps 8 significant bits: near θ its values are 2^(⌊log₂|θ|⌋−7) apart, between 2⁻⁸·|θ| and
2⁻⁷·|θ|. We count |Δ| > 2⁻⁸·|θ_a| (the usual "|Δw| > |w|/256" visibility rule for updates of bf16
weights): for a bf16 θ_a such a change always leaves θ_a's rounding interval, so θ_b rounds to another bf16 value. With
both checkpoints in bf16 every nonzero change is ≥ 2⁻⁸·|θ_a|, and only the step down from an exact power of
two equals it, so the column is then the share of changed entries less those steps. At θ_a = 0 any nonzero
change counts. The threshold is relative to θ_a, the first (base) checkpoint: swapping a and b changes it.

**Gini and top-1% share, one tensor at a time.** Both need the order statistics of all ~9·10⁹ entries. Rather
than sort them, each tensor's |Δ| is added to a histogram with exact bins (`LogHistogram`): a bin for exact
zeros, then `bins_per_octave` (M, a power of two) equal-width sub-bins of every binade [2^(e−1), 2^e) for
e ∈ [E_LO, E_HI] (read exactly off the float64 bits, no logarithm), an underflow bin below and an overflow
bin above. Per bin it keeps the count c, Σx and Σx² (over the occupied range only), so histograms merge by
addition across tensors and kinds. Since bins are ordered intervals, only the order *inside* a bin is unknown,
and both statistics are bracketed exactly:

- Gini: with values of a bin taken as equal, the estimate is a lower bound (Chebyshev's sum inequality); the
  within-bin excess is at most (hi − lo)·⌊c²/4⌋/2 per bin. We report the midpoint and the half-width
  Σ_bins (hi − lo)·⌊c²/4⌋ / (2·n·Σx), which is ≤ 1/(8M) (≈1.2·10⁻⁴ at the default M = 1024) because
  hi − lo ≤ lo/M in a regular bin (values in the under-/overflow bins, outside [2⁻¹⁶¹, 2¹³⁰), void this).
- top share: whole bins above the boundary bin are exact; the t largest of the boundary bin's c entries sum
  to between max(t·q/c, t·lo², q − (c−t)·hi²) and min(t·hi², q − (c−t)·lo², q) (q = its Σx²). We report
  the midpoint and the half-width over ΣΔ², which is ≤ share·(2M + 1)/(2M²) (≈0.1 % of the share at M = 1024).

Both bounds are returned with each value (`Estimate`), so a table shows what it can claim; exact versions of
all statistics on in-memory arrays (`gini`, `top_share`, ...) serve as references in the tests.

**Reading checkpoints.** Both kinds are compared in HF's per-layer text layout (`models.hf.hf_names`), one
tensor pair at a time:

- HF safetensors directories (`save_pretrained`, `launch/export_hf.py`, the released VLM checkpoint whose
  vision tower and MTP head are skipped): each tensor is read on its own from its shard.
- `Checkpointer` run directories (`runs/X/checkpoints[:STEP]`, default the latest step; a step directory
  `runs/X/checkpoints/120` or a run directory holding `checkpoints/` also work): orbax restores the `params`
  item one array at a time (`partial_restore`), so one *stacked* parameter is in memory per orbax checkpoint
  (all layers of one run of the block pattern, e.g. the 9B's first-run MLP up-projections, 8×3×4096×12288
  entries: 2.4 GB in bf16, 4.8 GB in fp32), and its layers are compared one by one. orbax cannot restore a
  slice of an array through this API, so that is the floor. A LoRA run's checkpoint (`model.lora.rank` > 0 in its
  recorded config) is read as the policy it trained: each adapted kernel as W + (α/r)·A·B (`models.lora.merged`),
  so Δθ against the base is the adapters' update in the base's coordinates.

Memory otherwise stays at a few tensors' worth: entries are converted to float64 in row blocks of about
`chunk_elems` entries. Non-finite values and mismatching tensors fail with the tensor's name and both shapes.
"""

from __future__ import annotations

import abc
import contextlib
import csv
import dataclasses
import fractions
import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rltldr_jax import strict_json
from rltldr_jax.checkpoint import split_step  # `DIR[:STEP]` parsing, shared with checkpoint.load_model
from rltldr_jax.mismatch import listing, mismatch_problems

TOP_FRACTION = 0.01  # the paper's "top-1% share of Δθ²"
DEFAULT_BINS_PER_OCTAVE = 1024
DEFAULT_CHUNK_ELEMS = 1 << 22  # float64 row blocks of ~32 MB per temporary

# frexp exponents of the regular binades: x ∈ [2^(e−1), 2^e) for e ∈ [E_LO, E_HI]. |Δ| of finite bf16/fp32
# values lies in [2⁻¹⁴⁹, 2¹²⁹), well inside; float64 checkpoints could reach the under-/overflow bins.
E_LO, E_HI = -160, 130

KINDS = ("attention", "deltanet", "mlp", "embeddings", "norms")
ALL = "all"


class DeltaThetaError(ValueError):
    """Checkpoints that cannot be compared, or a path that is no checkpoint; the message says which tensor/path."""


# ----------------------------------------------------------------------------------------------------
# Exact statistics of in-memory arrays (the references)
# ----------------------------------------------------------------------------------------------------


def top_count(n: int, fraction: float = TOP_FRACTION) -> int:
    """k = ⌈fraction·n⌉, computed exactly (0.01·n in floating point can land just above an integer)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    f = fractions.Fraction(fraction).limit_denominator(10**9)
    return -(-n * f.numerator // f.denominator)


def exceeds_bf16(base: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Whether each change is beyond bf16 precision of the base value: |Δ| > 2⁻⁸·|θ_a|.

    Args:
      base: θ_a, any shape and float dtype.
      delta: Δ = θ_b − θ_a, the same shape.

    Returns:
      bool array of that shape.
    """
    return np.abs(np.asarray(delta, np.float64)) * 256.0 > np.abs(np.asarray(base, np.float64))


def gini(x: np.ndarray) -> float:
    """The exact Gini index of non-negative values: Σᵢ (2i − n − 1)·x₍ᵢ₎ / (n·Σx), x sorted ascending.

    Equals the mean absolute difference over all ordered pairs divided by twice the mean: 0 when all values
    are equal, (n−1)/n when one value holds everything. Defined as 0 when Σx = 0 (no update at all).

    Args:
      x: values ≥ 0, any shape (flattened).
    """
    x = np.sort(np.asarray(x, np.float64).ravel())
    if x.size and x[0] < 0:
        raise ValueError("gini: values must be non-negative (pass |Δθ|)")
    n, total = x.size, float(x.sum())
    if n == 0 or total == 0.0:
        return 0.0
    weights = 2.0 * np.arange(1, n + 1, dtype=np.float64) - n - 1
    return float(np.dot(weights, x) / (n * total))


def top_share(energy: np.ndarray, fraction: float = TOP_FRACTION) -> float:
    """The exact share of Σ energy held by the k = ⌈fraction·n⌉ largest entries (energy = Δθ² in Table 7).

    Defined as 0 when the total is 0. Args: energy ≥ 0, any shape (flattened).
    """
    e = np.asarray(energy, np.float64).ravel()
    total = float(e.sum())
    if e.size == 0 or total == 0.0:
        return 0.0
    k = top_count(e.size, fraction)
    return float(np.partition(e, e.size - k)[e.size - k :].sum() / total)


# ----------------------------------------------------------------------------------------------------
# Streaming: a histogram with exact bins, and per-tensor sums that add up
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A statistic known to lie in [value − bound, value + bound]."""

    value: float
    bound: float


@dataclasses.dataclass(frozen=True)
class LogHistogram:
    """Counts, Σx and Σx² of non-negative values in ordered bins with known edges (see the module docstring).

    Bins, by global index: 0 exact zeros, 1 the underflow (0, 2^(E_LO−1)), then M sub-bins per binade
    e ∈ [E_LO, E_HI], and the last bin [2^E_HI, max]. They are ordered by value, so the histogram brackets any
    order statistic. Only the range of occupied positive bins is stored (|Δ| spans a few dozen binades).

    Attributes:
      bins_per_octave: M, a power of two (sub-bins are then read exactly off the float64 bits).
      zeros: the number of exact zeros (bin 0).
      start: the global index of the first stored positive bin (≥ 1).
      counts: int64 [L]; sums: float64 [L] (Σx); sq_sums: float64 [L] (Σx²): bins start … start + L − 1.
      max_value: the largest value added (the overflow bin's upper edge); 0 when none.
    """

    bins_per_octave: int
    zeros: int
    start: int
    counts: np.ndarray
    sums: np.ndarray
    sq_sums: np.ndarray
    max_value: float = 0.0

    @staticmethod
    def num_bins(bins_per_octave: int) -> int:
        """K, the number of global bins."""
        return 3 + (E_HI - E_LO + 1) * bins_per_octave

    @classmethod
    def empty(cls, bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE) -> LogHistogram:
        m = int(bins_per_octave)
        if m < 1 or m & (m - 1):
            raise ValueError(f"bins_per_octave={bins_per_octave} must be a power of two")
        return cls(m, 0, 1, np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.float64), 0.0)

    @classmethod
    def of(cls, x: np.ndarray, bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE) -> LogHistogram:
        """The histogram of x (≥ 0 and finite, any shape; flattened)."""
        h = cls.empty(bins_per_octave)
        x = np.asarray(x, np.float64).ravel()
        pos = x[x != 0]  # also drops −0.0
        zeros = x.size - pos.size
        if pos.size == 0:
            return dataclasses.replace(h, zeros=zeros)
        idx = bin_index(pos, h.bins_per_octave)
        first = int(idx.min())
        idx -= first
        return cls(
            h.bins_per_octave,
            zeros,
            first,
            np.bincount(idx).astype(np.int64),
            np.bincount(idx, weights=pos),
            np.bincount(idx, weights=pos * pos),
            float(pos.max()),
        )

    @property
    def n(self) -> int:
        return self.zeros + int(self.counts.sum())

    def __add__(self, other: LogHistogram) -> LogHistogram:
        if other.bins_per_octave != self.bins_per_octave:
            raise ValueError(f"cannot add histograms of {self.bins_per_octave} and {other.bins_per_octave} bins/octave")
        zeros, top = self.zeros + other.zeros, max(self.max_value, other.max_value)
        parts = [h for h in (self, other) if h.counts.size]
        if len(parts) < 2:
            return dataclasses.replace(parts[0] if parts else self, zeros=zeros, max_value=top)
        first = min(h.start for h in parts)
        length = max(h.start + h.counts.size for h in parts) - first
        out = [np.zeros(length, np.int64), np.zeros(length, np.float64), np.zeros(length, np.float64)]
        for h in parts:
            at = slice(h.start - first, h.start - first + h.counts.size)
            for acc, arr in zip(out, (h.counts, h.sums, h.sq_sums), strict=True):
                acc[at] += arr
        return LogHistogram(self.bins_per_octave, zeros, first, *out, top)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) float64 [L] of the stored bins: every value in a bin lies in [lo, hi]."""
        m = self.bins_per_octave
        g = np.arange(self.start, self.start + self.counts.size)
        r = np.clip(g - 2, 0, (E_HI - E_LO + 1) * m - 1)
        e, sub = E_LO + r // m, (r % m).astype(np.float64)
        lo = np.ldexp(1.0 + sub / m, e - 1)
        hi = np.ldexp(1.0 + (sub + 1.0) / m, e - 1)
        under, over = g == 1, g == self.num_bins(m) - 1
        lo[under], hi[under] = 0.0, 2.0 ** (E_LO - 1)
        lo[over], hi[over] = 2.0**E_HI, max(self.max_value, 2.0**E_HI)
        return lo, hi

    def gini(self) -> Estimate:
        """Gini index of the values, ± a bound (module docstring); 0 ± 0 when all are 0."""
        c = self.counts
        n, total = self.n, float(self.sums.sum())
        if n == 0 or total == 0.0:
            return Estimate(0.0, 0.0)
        below = self.zeros + np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.float64)  # entries in lower bins
        lower = float(np.dot(2.0 * below + c - n, self.sums)) / (n * total)
        lo, hi = self.edges()
        cf = c.astype(np.float64)
        upper = lower + float(np.dot(hi - lo, np.floor(cf * cf / 4.0))) / (n * total)
        return _interval(lower, upper)

    def top_share(self, fraction: float = TOP_FRACTION) -> Estimate:
        """Share of Σx² held by the ⌈fraction·n⌉ largest values, ± a bound; 0 ± 0 when Σx² = 0."""
        c, q = self.counts, self.sq_sums
        n, total = self.n, float(q.sum())
        if n == 0 or total == 0.0:
            return Estimate(0.0, 0.0)
        k = top_count(n, fraction)
        at_or_above = np.cumsum(c[::-1])[::-1]  # positive entries in bins ≥ b
        if k >= at_or_above[0]:  # every nonzero value is among the top k
            return Estimate(1.0, 0.0)
        b = int(np.nonzero(at_or_above >= k)[0][-1])  # the boundary bin
        above = int(at_or_above[b]) - int(c[b])
        full = float(q[b + 1 :].sum())
        t, cb, qb = k - above, int(c[b]), float(q[b])
        lo, hi = self.edges()
        lo2, hi2 = float(lo[b]) ** 2, float(hi[b]) ** 2
        p_lo = max(t * qb / cb, t * lo2, qb - (cb - t) * hi2)
        p_hi = min(t * hi2, qb - (cb - t) * lo2, qb)
        p_hi = max(p_hi, p_lo)  # rounding
        return _interval((full + p_lo) / total, (full + p_hi) / total)


def _interval(lower: float, upper: float) -> Estimate:
    """The midpoint ± half-width of [lower, upper] ∩ [0, 1] (both statistics lie in [0, 1])."""
    lower, upper = min(max(float(lower), 0.0), 1.0), min(max(float(upper), 0.0), 1.0)
    upper = max(upper, lower)
    return Estimate((lower + upper) / 2, (upper - lower) / 2)


def bin_index(x: np.ndarray, bins_per_octave: int) -> np.ndarray:
    """The global `LogHistogram` bin of each positive value: int64 [n] for float64 x [n] (finite, > 0).

    A float64's bits are sign | biased exponent (11) | mantissa (52), so shifting out all but the top log2(M)
    mantissa bits leaves exponent·M + sub-bin: the binade and its M equal-width sub-bins, exactly.
    """
    m = bins_per_octave
    x = np.ascontiguousarray(x, np.float64)
    key = (x.view(np.uint64) >> np.uint64(52 - (m.bit_length() - 1))).astype(np.int64)
    idx = key - ((E_LO - 1 + 1023) * m - 2)  # frexp exponent E_LO, sub-bin 0 → bin 2
    return np.clip(idx, 1, LogHistogram.num_bins(m) - 1, out=idx)


@dataclasses.dataclass(frozen=True)
class DeltaStats:
    """Sums and counts of Δθ over some set of tensors; `+` combines disjoint sets.

    Attributes:
      tensors: number of tensors; n: entries; l1: Σ|Δ|; l2sq: ΣΔ²; exceed: #{|Δ| > 2⁻⁸|θ_a|};
      hist: the `LogHistogram` of |Δ| (`hist.zeros` counts the unchanged entries).
    """

    tensors: int
    n: int
    l1: float
    l2sq: float
    exceed: int
    hist: LogHistogram

    @classmethod
    def empty(cls, bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE) -> DeltaStats:
        return cls(0, 0, 0.0, 0.0, 0, LogHistogram.empty(bins_per_octave))

    def __add__(self, other: DeltaStats) -> DeltaStats:
        return DeltaStats(
            self.tensors + other.tensors,
            self.n + other.n,
            self.l1 + other.l1,
            self.l2sq + other.l2sq,
            self.exceed + other.exceed,
            self.hist + other.hist,
        )

    @property
    def l2(self) -> float:
        return math.sqrt(self.l2sq)

    @property
    def changed(self) -> int:
        return self.n - self.hist.zeros

    def row(self, fraction: float = TOP_FRACTION) -> dict[str, Any]:
        """The Table 7 numbers (fractions, not percent), with the ± bounds of the two concentration metrics."""
        g, s = self.hist.gini(), self.hist.top_share(fraction)
        n = max(self.n, 1)
        return {
            "tensors": self.tensors,
            "entries": self.n,
            "l1": self.l1,
            "l2": self.l2,
            "changed": self.changed / n,
            "exceed_bf16": self.exceed / n,
            "gini": g.value,
            "gini_err": g.bound,
            "top_share": s.value,
            "top_share_err": s.bound,
            "top_fraction": fraction,
        }


def _row_blocks(shape: tuple[int, ...], chunk_elems: int) -> Iterator[slice]:
    """Slices of the first axis covering about `chunk_elems` entries each (at least one row)."""
    rows = shape[0]
    per_row = math.prod(shape[1:])
    step = max(1, chunk_elems // max(per_row, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def delta_stats(
    a: np.ndarray,
    b: np.ndarray,
    *,
    name: str = "tensor",
    bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> DeltaStats:
    """The sums and counts of Δ = b − a for one tensor pair, in float64 row blocks (a and b may be views).

    Args:
      a: θ_a, any shape and float dtype (bf16 included).
      b: θ_b, the same shape.
      name: the tensor's name, for error messages.
      bins_per_octave: histogram resolution (a power of two).
      chunk_elems: about how many entries are converted to float64 at once.

    Raises:
      DeltaThetaError: different shapes, or a non-finite value (naming the tensor).
    """
    if tuple(a.shape) != tuple(b.shape):
        raise DeltaThetaError(f"{name}: shapes differ: a {tuple(a.shape)} ≠ b {tuple(b.shape)}")
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    l1 = l2sq = 0.0
    exceed = 0
    hist = LogHistogram.empty(bins_per_octave)
    for rows in _row_blocks(tuple(a.shape), chunk_elems):
        a64 = np.asarray(a[rows], np.float64).ravel()  # may be a view of `a`: never written to
        d = np.asarray(b[rows], np.float64).ravel() - a64  # a new array
        if not np.isfinite(d).all():
            raise DeltaThetaError(f"{name}: non-finite values (inf/nan) in a or b")
        ad = np.abs(d, out=d)
        l1 += float(ad.sum())
        l2sq += float(np.dot(ad, ad))
        exceed += int(np.count_nonzero(exceeds_bf16(a64, ad)))
        hist = hist + LogHistogram.of(ad, bins_per_octave)
    return DeltaStats(1, int(a.size), l1, l2sq, exceed, hist)


# ----------------------------------------------------------------------------------------------------
# Module kinds
# ----------------------------------------------------------------------------------------------------


def module_kind(name: str) -> str:
    """The Table 7 module kind of an HF text-layout tensor name.

    embeddings: model.embed_tokens.weight, lm_head.weight; norms: every `*norm.weight` (input/post-attention
    layernorms, final norm, q_norm/k_norm, DeltaNet's gated norm); attention: other `self_attn.*`; deltanet:
    other `linear_attn.*` (projections, conv1d, A_log, dt_bias); mlp: `mlp.*`.

    Raises:
      DeltaThetaError for a name of none of these kinds.
    """
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "embeddings"
    if name.endswith("norm.weight"):
        return "norms"
    if ".self_attn." in name:
        return "attention"
    if ".linear_attn." in name:
        return "deltanet"
    if ".mlp." in name:
        return "mlp"
    raise DeltaThetaError(f"{name}: no module kind (attention, deltanet, mlp, embeddings, norms) for this tensor")


# ----------------------------------------------------------------------------------------------------
# Checkpoint sources: HF-layout tensors, one at a time
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One HF text-layout tensor of a checkpoint: its name, shape (HF layout) and stored dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def _hf_shape(ours: Sequence[int], transform: str) -> tuple[int, ...]:
    """One layer's shape in our layout → the HF shape (`models.hf._to_hf`)."""
    if transform == "linear":
        return tuple(reversed(tuple(ours)))
    if transform == "conv":  # [K, C] → [C, 1, K]
        return (ours[1], 1, ours[0])
    return tuple(ours)


def _hf_view(x: np.ndarray, transform: str) -> np.ndarray:
    """Our layout → HF layout without copying (`models.hf._to_hf` makes contiguous copies)."""
    if transform == "linear":
        return x.T
    if transform == "conv":
        return x.T[:, None, :]
    return x


@functools.lru_cache(maxsize=8)
def _expected(config) -> list[tuple[tuple, list[tuple[str, Any]], str, tuple[int, ...], str]]:
    """Per parameter of our model: (our path, [(HF name, (block, layer) or None)], transform, our shape, dotted).

    Cached: tracing the abstract model takes about a second.
    """
    from flax import nnx

    from rltldr_jax.models import ModelSpec
    from rltldr_jax.models.hf import hf_names

    out = []
    for key, var in nnx.to_flat_state(nnx.split(ModelSpec(config).abstract())[1]):
        names, transform = hf_names(key, config)
        if key[0] == "blocks":
            located = [(name, (bi, j)) for bi, per_block in enumerate(names) for j, name in enumerate(per_block)]
        else:
            located = [(names[0], None)]
        out.append((key, located, transform, tuple(var.shape), ".".join(str(k) for k in key)))
    return out


class Source(contextlib.AbstractContextManager, abc.ABC):
    """A checkpoint read one HF-layout tensor at a time (a context manager: `close` on exit).

    Attributes:
      label: the path (and step) it was opened from.
      config: its architecture (Qwen35Config).
      tensors: TensorInfo of every text-model tensor, in a stable order grouped by our stacked parameters.
    """

    label: str
    config: Any
    tensors: list[TensorInfo]

    @abc.abstractmethod
    def read(self, name: str) -> np.ndarray:
        """The tensor `name` (one of `tensors`) in HF layout and its stored dtype; possibly a view."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases open files and cached arrays."""

    def __exit__(self, *exc) -> None:
        self.close()


_ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}  # safetensors → numpy names


class HFSource(Source):
    """An HF safetensors directory (text or VLM layout); tensors are read lazily from the shards."""

    def __init__(self, path: str | os.PathLike):
        from rltldr_jax.models import Qwen35Config
        from rltldr_jax.models.hf import _text_name, _weight_files, open_safetensors

        path = os.fspath(path)
        self.label = path
        self.config = Qwen35Config.from_pretrained(path)
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}
        self._where: dict[str, tuple[str, str]] = {}  # text name → (file, stored name)
        for stored, file in _weight_files(path).items():
            text = _text_name(stored)
            if text is not None:
                self._where[text] = (file, stored)
        self._open_safetensors = open_safetensors
        self.tensors = []
        missing, misshaped, used = [], [], set()
        for _, located, transform, ours, _ in _expected(self.config):
            want = _hf_shape(ours[2:] if located[0][1] is not None else ours, transform)
            for name, _ in located:
                if name not in self._where:
                    missing.append(name)
                    continue
                used.add(name)
                piece = self._slice(name)
                shape, dtype = tuple(piece.get_shape()), str(piece.get_dtype())
                dtype = _ST_DTYPES.get(dtype, dtype.lower())
                if shape != want:
                    misshaped.append(f"{name}: file {shape} ≠ config.json {want}")
                self.tensors.append(TensorInfo(name, shape, dtype))
        tied = {"lm_head.weight"} if self.config.tie_word_embeddings else set()  # a tied copy is ignored
        unexpected = sorted(set(self._where) - used - tied)
        problems = mismatch_problems(missing=missing, unexpected=unexpected, mis_shaped=misshaped, what="tensors")
        if problems:
            self.close()
            raise DeltaThetaError(f"HF checkpoint {path!r} does not match its config.json: " + " | ".join(problems))

    def _handle(self, file: str):
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(self._open_safetensors(file))
        return self._handles[file]

    def _slice(self, name: str):
        file, stored = self._where[name]
        return self._handle(file).get_slice(stored)

    def read(self, name: str) -> np.ndarray:
        file, stored = self._where[name]
        return self._handle(file).get_tensor(stored)

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()


class OrbaxSource(Source):
    """A `Checkpointer` checkpoint's `params`, restored one (stacked) array at a time and cut into layers.

    Args:
      directory: the Checkpointer directory (runs/X/checkpoints).
      step: the step; None for the latest.
      config: the architecture, for a checkpoint saved without one (a recorded one must agree with it).
    """

    def __init__(self, directory: str | os.PathLike, step: int | None = None, *, config=None):
        import orbax.checkpoint as ocp

        from rltldr_jax.checkpoint import Checkpointer
        from rltldr_jax.models import Qwen35Config
        from rltldr_jax.models.lora import lora_spec_of_run

        ckpt = Checkpointer(directory, keep=None, async_save=False, create=False)
        try:
            step, state, meta = ckpt.read_state(step)
            stored = ckpt.stored_arrays(step, "params")
            params_dir = ckpt.directory / str(step) / "params"
        finally:
            ckpt.close()
        self.label = f"{os.fspath(directory)}:{step}"
        self.step = step
        saved = state.get("model_config")
        if config is not None and hasattr(config, "config"):  # a ModelSpec
            config = config.config
        if saved is not None:
            recorded = Qwen35Config.from_hf_dict(saved)
            if config is not None and config != recorded:
                ours, theirs = config.to_hf_dict(), recorded.to_hf_dict()
                diff = ", ".join(
                    f"{k}: given {ours.get(k)!r}, saved {theirs.get(k)!r}" for k in ours if ours.get(k) != theirs.get(k)
                )
                raise DeltaThetaError(f"checkpoint {self.label}: the given model config differs from the saved: {diff}")
            config = recorded
        if config is None:
            raise DeltaThetaError(
                f"checkpoint {self.label} records no model config; give the architecture (--preset or --config_json)"
            )
        self.config = config
        self._params_dir = params_dir
        self._stored = stored
        self.tensors = []
        # HF name → (stored array, (block, layer) or None, transform)
        self._where: dict[str, tuple[str, tuple[int, int] | None, str]] = {}
        # A LoRA run's checkpoint (its recorded config says so): kernel leaf → its adapters' (A, B) leaves; a
        # kernel is read as W + (α/r)·A·B (`models.lora.merged`), the policy the run trained.
        adapters = lora_spec_of_run(meta.get("config"))
        self._scale = adapters.scale if adapters is not None else 0.0
        self._lora: dict[str, tuple[str, str]] = {}
        missing, misshaped, used = [], [], set()
        for _, located, transform, ours, dotted in _expected(config):
            leaf = f"{dotted}.value" if f"{dotted}.value" in stored else dotted
            if leaf not in stored:
                missing.append(dotted)
                continue
            used.add(leaf)
            if adapters is not None:
                owner = dotted.rsplit(".", 1)[0]
                found = [
                    next((n for n in (f"{owner}.lora.{ab}.value", f"{owner}.lora.{ab}") if n in stored), None)
                    for ab in ("lora_a", "lora_b")
                ]
                if all(found):
                    self._lora[leaf] = (found[0], found[1])
                    used.update(found)
            meta = stored[leaf]
            if tuple(meta.shape) != ours:
                misshaped.append(f"{dotted}: checkpoint {tuple(meta.shape)} ≠ config {ours}")
                continue
            layer = ours[2:] if located[0][1] is not None else ours
            for name, at in located:
                self.tensors.append(TensorInfo(name, _hf_shape(layer, transform), np.dtype(meta.dtype).name))
                self._where[name] = (leaf, at, transform)
        unexpected = sorted(set(stored) - used)
        problems = mismatch_problems(missing=missing, unexpected=unexpected, mis_shaped=misshaped, what="arrays")
        if problems:
            raise DeltaThetaError(f"checkpoint {self.label} does not match its model config: " + " | ".join(problems))
        self._checkpointer = ocp.PyTreeCheckpointer()
        self._cached: tuple[str, np.ndarray] | None = None

    def _restore(self, leaf: str) -> np.ndarray:
        """One stored (stacked) kernel or other parameter as numpy in its stored dtype, with its LoRA update merged
        in when it has adapters (in float32, as `models.lora.merged`)."""
        value = self._restore_leaf(leaf)
        if leaf not in self._lora:
            return value
        a, b = (self._restore_leaf(n).astype(np.float32) for n in self._lora[leaf])
        return (value.astype(np.float32) + self._scale * np.matmul(a, b)).astype(value.dtype)

    def _restore_leaf(self, leaf: str) -> np.ndarray:
        """One stored array, in its stored dtype, as numpy (orbax `partial_restore`: nothing else is read)."""
        import jax
        import orbax.checkpoint as ocp

        meta = self._stored[leaf]
        parts = leaf.split(".")
        item: dict[str, Any] = {}
        args: dict[str, Any] = {}
        node_i, node_a = item, args
        for p in parts[:-1]:
            node_i, node_a = node_i.setdefault(p, {}), node_a.setdefault(p, {})
        node_i[parts[-1]] = jax.ShapeDtypeStruct(tuple(meta.shape), meta.dtype)
        node_a[parts[-1]] = ocp.RestoreArgs(restore_type=np.ndarray)
        try:
            restored = self._checkpointer.restore(
                self._params_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True)
            )
        except Exception as e:  # truncated or damaged files: TensorStore errors
            from rltldr_jax.checkpoint import CorruptCheckpointError, error_reason

            raise CorruptCheckpointError(
                f"checkpoint {self.label}: cannot read {leaf} ({error_reason(e)}); its files are truncated or damaged"
            ) from e
        for p in parts:
            restored = restored[p]
        return np.asarray(restored)

    def read(self, name: str) -> np.ndarray:
        leaf, at, transform = self._where[name]
        if self._cached is None or self._cached[0] != leaf:
            self._cached = None  # free the previous array before reading the next
            self._cached = (leaf, self._restore(leaf))
        value = self._cached[1]
        return _hf_view(value if at is None else value[at], transform)

    def close(self) -> None:
        self._cached = None
        if hasattr(self, "_checkpointer"):
            self._checkpointer.close()


def _is_hf_dir(path: str) -> bool:
    from rltldr_jax.models.hf import INDEX_FILE, SINGLE_FILE

    return os.path.isfile(os.path.join(path, "config.json")) and (
        os.path.isfile(os.path.join(path, INDEX_FILE)) or os.path.isfile(os.path.join(path, SINGLE_FILE))
    )


def _is_step_dir(path) -> bool:
    return (path / "params").is_dir() and (path / "state").is_dir() and path.name.isdigit()


def _is_checkpointer_dir(path) -> bool:
    return path.is_dir() and any(_is_step_dir(p) for p in path.iterdir() if p.name.isdigit())


def open_checkpoint(spec: str | os.PathLike, *, config=None) -> Source:
    """Opens `PATH[:STEP]` as whichever kind of checkpoint it is.

    PATH is an HF directory (config.json + model.safetensors or model.safetensors.index.json), a Checkpointer
    directory (runs/X/checkpoints; STEP defaults to the latest), a step directory of one (runs/X/checkpoints/120),
    or a run directory holding `checkpoints/`.

    Args:
      spec: the path, optionally with :STEP (orbax only).
      config: architecture for an orbax checkpoint saved without one (Qwen35Config or ModelSpec).

    Raises:
      DeltaThetaError: the path is neither kind (saying what was expected), or mismatches its own config.
      FileNotFoundError: no such step.
    """
    from etils import epath

    path, step = split_step(os.fspath(spec))
    if _is_hf_dir(path):
        if step is not None:
            raise DeltaThetaError(f"{spec!r}: a :STEP applies to orbax checkpoints only; {path!r} is an HF directory")
        return HFSource(path)
    p = epath.Path(path)
    directory = None
    try:  # which kind of directory (an unreadable path is none)
        if _is_step_dir(p) and _is_checkpointer_dir(p.parent):
            if step is not None and step != int(p.name):
                raise DeltaThetaError(f"{spec!r}: step {step} given for the step directory {p.name}")
            directory, step = p.parent, int(p.name)
        elif _is_checkpointer_dir(p):
            directory = p
        elif _is_checkpointer_dir(p / "checkpoints"):
            directory = p / "checkpoints"
    except OSError:
        pass
    if directory is not None:
        return OrbaxSource(directory, step, config=config)
    raise DeltaThetaError(
        f"{os.fspath(spec)!r} is not a checkpoint: expected an HF safetensors directory (config.json + "
        "model.safetensors or model.safetensors.index.json) or an orbax Checkpointer directory "
        "(runs/X/checkpoints[:STEP], holding {step}/params and {step}/state)"
    )


# ----------------------------------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeltaReport:
    """Δθ = θ_b − θ_a per module kind. `rows()` gives the table: the global row first, then each kind."""

    a: str
    b: str
    by_kind: Mapping[str, DeltaStats]
    top_fraction: float = TOP_FRACTION

    @property
    def total(self) -> DeltaStats:
        stats = list(self.by_kind.values())
        out = stats[0]
        for s in stats[1:]:
            out = out + s
        return out

    def rows(self) -> list[dict[str, Any]]:
        rows = [{"kind": ALL, **self.total.row(self.top_fraction)}]
        rows += [{"kind": k, **s.row(self.top_fraction)} for k, s in self.by_kind.items() if s.n]
        return rows


def _check_same_tensors(a: Source, b: Source) -> None:
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    only_a, only_b = [n for n in ta if n not in tb], [n for n in tb if n not in ta]
    wrong = [f"{n}: a {ta[n].shape} ≠ b {tb[n].shape}" for n in ta if n in tb and ta[n].shape != tb[n].shape]

    problems = []
    if only_a:
        problems.append(f"only in a: {listing(only_a, '; ')}")
    if only_b:
        problems.append(f"only in b: {listing(only_b, '; ')}")
    if wrong:
        problems.append(f"different shapes: {listing(wrong, '; ')}")
    if problems:
        raise DeltaThetaError(f"a = {a.label} and b = {b.label} have different architectures: " + " | ".join(problems))


def compare(
    a: Source | str | os.PathLike,
    b: Source | str | os.PathLike,
    *,
    config=None,
    bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE,
    top_fraction: float = TOP_FRACTION,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    progress: Callable[[str], None] | None = None,
) -> DeltaReport:
    """Δθ = θ_b − θ_a between two checkpoints, one tensor pair in memory at a time.

    Args:
      a: the base checkpoint (θ_original in Table 7): a `Source` or a `PATH[:STEP]` for `open_checkpoint`.
      b: the other (θ_trained).
      config: architecture for orbax checkpoints saved without one.
      bins_per_octave: `LogHistogram` resolution; the Gini bound is ≤ 1/(8·bins_per_octave).
      top_fraction: the "top-1%" fraction.
      chunk_elems: float64 row-block size.
      progress: called with a line per tensor (e.g. to print progress on stderr).

    Raises:
      DeltaThetaError: different tensor names or shapes (all listed, with both shapes), a non-checkpoint path.
    """
    with contextlib.ExitStack() as stack:
        sa = a if isinstance(a, Source) else stack.enter_context(open_checkpoint(a, config=config))
        sb = b if isinstance(b, Source) else stack.enter_context(open_checkpoint(b, config=config))
        _check_same_tensors(sa, sb)
        by_kind = {k: DeltaStats.empty(bins_per_octave) for k in KINDS}
        for i, t in enumerate(sa.tensors):
            kind = module_kind(t.name)
            stats = delta_stats(
                sa.read(t.name), sb.read(t.name), name=t.name, bins_per_octave=bins_per_octave, chunk_elems=chunk_elems
            )
            by_kind[kind] = by_kind[kind] + stats
            if progress is not None:
                progress(f"[{i + 1}/{len(sa.tensors)}] {t.name} {t.shape}: ‖Δ‖₁={stats.l1:.4g}")
        return DeltaReport(sa.label, sb.label, by_kind, top_fraction)


# ----------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------

COLUMNS = (
    "kind",
    "tensors",
    "entries",
    "l1",
    "l2",
    "changed",
    "exceed_bf16",
    "gini",
    "gini_err",
    "top_share",
    "top_share_err",
)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a fixed-width text table (shares in percent, ± the bounds of Gini and top share)."""
    head = f"{'kind':<11}{'entries':>15}{'‖Δθ‖₁':>12}{'‖Δθ‖₂':>11}{'changed':>9}{'>bf16':>9}"
    head += f"{'Gini':>18}{'top-1% share':>22}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['kind']:<11}{r['entries']:>15,}{r['l1']:>12.4g}{r['l2']:>11.4g}{100 * r['changed']:>8.2f}%"
            f"{100 * r['exceed_bf16']:>8.2f}%{r['gini']:>10.4f} ±{r['gini_err']:<6.0e}"
            f"{100 * r['top_share']:>12.2f}% ±{100 * r['top_share_err']:<6.0e}"
        )
    return "\n".join(lines)


def write_rows(
    path: str | os.PathLike, rows: Sequence[Mapping[str, Any]], *, meta: Mapping[str, Any] | None = None
) -> None:
    """Writes the rows as .csv (the COLUMNS, shares as fractions) or .json ({**meta, "rows": rows})."""
    path = os.fspath(path)
    if path.endswith(".csv"):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    elif path.endswith(".json"):
        with open(path, "w", encoding="utf-8") as f:
            strict_json.dump({**(meta or {}), "rows": list(rows)}, f, indent=2)  # (a NaN as null)
    else:
        raise ValueError(f"--out={path!r}: the file must end in .csv or .json")
