"""The statistics of a replication's comparisons over seeds: bootstrap confidence intervals of a difference of arm
means (paired by seed when both arms ran the seed: they share the seed's base policy), Welch's t-test, and the
two one-sided tests (TOST) of equivalence within a margin. Pure functions of per-seed values; no I/O.

    interval = paired_bootstrap(rltldr_by_seed, control_by_seed)      # {seed: value} each
    interval.diff, interval.low, interval.high                          # mean difference and its 95 % CI
    tost(lam_05, lam_0, margin=0.10).p                                  # < 0.05: equivalent within ±10 points

Values are fractions (0.25 = 25 %). The bootstrap is the percentile bootstrap over seeds (resampling whole seeds,
the unit of replication), seeded, so a report is reproducible to the digit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as sps


@dataclasses.dataclass(frozen=True)
class Interval:
    """A difference of means with its confidence interval: `diff` (a minus b), `[low, high]` at `level`, over `n`
    seeds (pairs when paired; otherwise the smaller arm's count)."""

    diff: float
    low: float
    high: float
    level: float
    n: int
    paired: bool

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _finite(values: Sequence[float]) -> np.ndarray:
    v = np.asarray([x for x in values if isinstance(x, int | float) and math.isfinite(x)], dtype=np.float64)
    return v


def paired_bootstrap(
    a: Mapping[int, float], b: Mapping[int, float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """The mean of a[s] - b[s] over the seeds both arms have (finite values), with its percentile-bootstrap interval
    (resampling seeds). Fewer than 2 pairs: NaN bounds."""
    seeds = sorted(s for s in a.keys() & b.keys() if math.isfinite(a[s]) and math.isfinite(b[s]))
    d = np.asarray([a[s] - b[s] for s in seeds], dtype=np.float64)
    if len(d) == 0:
        return Interval(math.nan, math.nan, math.nan, level, 0, True)
    if len(d) < 2:
        return Interval(float(d.mean()), math.nan, math.nan, level, len(d), True)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(d.mean()), float(low), float(high), level, len(d), True)


def mean_bootstrap(values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> Interval:
    """The mean of one arm's finite values over seeds with its percentile-bootstrap interval (`diff` is the mean,
    `paired` False). Fewer than 2 values: NaN bounds."""
    v = _finite(values)
    zero = dict.fromkeys(range(len(v)), 0.0)
    interval = paired_bootstrap(dict(enumerate(v.tolist())), zero, level=level, resamples=resamples, seed=seed)
    return dataclasses.replace(interval, paired=False)


def bootstrap_band(
    values: np.ndarray, *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The percentile-bootstrap interval of the mean over seeds at each point of a curve: `values` [seeds, points]
    (finite), whole seeds resampled (each resample draws one set of seeds for every point, so a band is the band of
    curves, not of points drawn apart). Returns (low, high), each [points]; fewer than 2 seeds: NaN."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"values has shape {v.shape}: give [seeds, points]")
    if v.shape[0] < 2:
        nan = np.full(v.shape[1], np.nan)
        return nan, nan.copy()
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.shape[0], size=(resamples, v.shape[0]))].mean(axis=1)  # [resamples, points]
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return low, high


def unpaired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """mean(a) - mean(b) with its percentile-bootstrap interval, each arm resampled on its own (arms that do not
    share seeds). Fewer than 2 values in an arm: NaN bounds."""
    x, y = _finite(a), _finite(b)
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, level, 0, False)
    diff = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, math.nan, math.nan, level, min(len(x), len(y)), False)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1) - y[
        rng.integers(0, len(y), size=(resamples, len(y)))
    ].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(diff, float(low), float(high), level, min(len(x), len(y)), False)


@dataclasses.dataclass(frozen=True)
class Welch:
    """Welch's t-test of mean(a) = mean(b): the difference, its standard error, t, the degrees of freedom
    (Welch-Satterthwaite) and the two-sided p-value."""

    diff: float
    se: float
    t: float
    df: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's unequal-variance t-test (NaN when an arm has fewer than 2 values or both have zero variance)."""
    x, y = _finite(a), _finite(b)
    if len(x) < 2 or len(y) < 2:
        return Welch(math.nan, math.nan, math.nan, math.nan, math.nan)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff, se = float(x.mean() - y.mean()), math.sqrt(va + vb)
    if se == 0:
        return Welch(diff, 0.0, math.nan, math.nan, math.nan)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    t = diff / se
    return Welch(diff, se, t, df, float(2 * sps.t.sf(abs(t), df)))


@dataclasses.dataclass(frozen=True)
class Tost:
    """Two one-sided Welch tests of equivalence, H0: |mean(a) - mean(b)| >= margin. `p` = max of the two one-sided
    p-values: below alpha, the arms are equivalent within ±margin at level alpha."""

    diff: float
    margin: float
    p_lower: float
    p_upper: float

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)


def paired_tost(a: Mapping[int, float], b: Mapping[int, float], *, margin: float) -> Tost:
    """TOST on the paired differences a[s] - b[s] over the seeds both have (finite values): two one-sided one-sample
    t-tests of the mean difference against -margin and +margin (n - 1 degrees of freedom; NaN p-values with fewer
    than 2 pairs). Differences without variance (e.g. both arms 0 on every seed) are their limit: each one-sided
    p-value is 0 when the difference is inside its bound, 1 otherwise."""
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    seeds = sorted(s for s in a.keys() & b.keys() if math.isfinite(a[s]) and math.isfinite(b[s]))
    d = np.asarray([a[s] - b[s] for s in seeds], dtype=np.float64)
    diff = float(d.mean()) if len(d) else math.nan
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) >= 2 else math.nan
    if not math.isfinite(se):
        return Tost(diff, margin, math.nan, math.nan)
    if se == 0:
        return Tost(diff, margin, float(not diff > -margin), float(not diff < margin))
    df = len(d) - 1
    p_lower = float(sps.t.sf((diff + margin) / se, df))  # H0: diff <= -margin
    p_upper = float(sps.t.cdf((diff - margin) / se, df))  # H0: diff >= +margin
    return Tost(diff, margin, p_lower, p_upper)


def tost(a: Sequence[float], b: Sequence[float], *, margin: float) -> Tost:
    """TOST with Welch's standard error and degrees of freedom (NaN p-values when `welch` has none)."""
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    w = welch(a, b)
    if not math.isfinite(w.df):
        return Tost(w.diff, margin, math.nan, math.nan)
    p_lower = float(sps.t.sf((w.diff + margin) / w.se, w.df))  # H0: diff <= -margin
    p_upper = float(sps.t.cdf((w.diff - margin) / w.se, w.df))  # H0: diff >= +margin
    return Tost(w.diff, margin, p_lower, p_upper)
