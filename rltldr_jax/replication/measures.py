"""What a run's evaluation curve says, as three numbers per metric: the final value, the value at the evaluation chosen
on a held-in validation set, and the area under the curve.

    measures = eval_measures(evals, select_on="eval_valid/pass@1/all")
    measures["final"]["eval_tier2/pass@1/all"], measures["selected"][...], measures["auc"][...]

`evals` are a run's evaluation records (metrics.jsonl rows of kind "eval", in order, each with `env_steps`). The
selected evaluation is the one with the highest `select_on` value (the earliest on ties; a NaN never wins): choosing a
checkpoint on held-in validation, never on a held-out tier, so that the selected values of the held-out tiers are
not optimistically biased. The area under the curve is the time-average of the metric over the environment steps
between the first and the last evaluation (trapezoids; with one evaluation, its value): a run that learns early and
keeps it scores above one that reaches the same final value late. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: The metrics measured, as suffixes of an evaluation prefix (`eval/`, `eval_train/`, `eval_<split>/`).
MEASURED = ("pass@1/all",)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def selected_index(evals: Sequence[Mapping[str, float]], select_on: str) -> int | None:
    """The index of the evaluation with the highest finite `select_on` value (the earliest on ties); None when no
    evaluation has one."""
    best: int | None = None
    for i, record in enumerate(evals):
        value = record.get(select_on, math.nan)
        if _finite(value) and (best is None or value > evals[best][select_on]):
            best = i
    return best


def area_under_curve(steps: Sequence[float], values: Sequence[float]) -> float:
    """The time-average of `values` over `steps` (trapezoids between consecutive points with finite values, divided
    by the span they cover); one point: its value; none: NaN."""
    points = [(float(s), float(v)) for s, v in zip(steps, values, strict=True) if _finite(v)]
    if not points:
        return math.nan
    if len(points) == 1 or points[-1][0] == points[0][0]:
        return points[-1][1]
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:], strict=False))
    return area / (points[-1][0] - points[0][0])


def eval_measures(
    evals: Sequence[Mapping[str, float]], *, select_on: str | None = None
) -> dict[str, dict[str, float] | int | None]:
    """{"final": {metric: value}, "selected": {...}, "auc": {...}, "selected_index": i} for every metric of the
    records whose key ends in one of `MEASURED` (`eval/pass@1/all`, `eval_tier2/pass@1/all`, ...). Without
    `select_on` (or when no evaluation has it), "selected" is empty and "selected_index" None."""
    keys = sorted({k for r in evals for k in r if k.endswith(MEASURED) and k.startswith("eval")})
    steps = [r.get("env_steps", i) for i, r in enumerate(evals)]
    index = selected_index(evals, select_on) if select_on else None
    return {
        "final": {k: evals[-1].get(k, math.nan) for k in keys} if evals else {},
        "selected": {k: evals[index].get(k, math.nan) for k in keys} if index is not None else {},
        "auc": {k: area_under_curve(steps, [r.get(k, math.nan) for r in evals]) for k in keys},
        "selected_index": index,
    }
