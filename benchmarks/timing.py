"""Shared timing for the benchmark scripts (imported as `from timing import best_of` when run from benchmarks/)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best wall time of each function over `repeat` rounds, the functions taking turns within each round (so that
    a change in the machine's load hits all of them alike), after one warm-up call each."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best
