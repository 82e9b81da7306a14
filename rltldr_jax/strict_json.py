"""JSON the way every file of the package writes it: strict (RFC 8259), so that any reader (`jq`, a browser, a
JavaScript dashboard, `json.loads(..., parse_constant=...)` that refuses NaN) parses it.

    text = dumps({"pass@1": float("nan"), "steps": np.int64(3)})   # '{"pass@1": null, "steps": 3}'
    dump(summary, f, indent=1)                                      # the same into an open file
    nan_for_null(json.load(f)["final"])                             # a reader that wants numbers back

A non-finite float (NaN, ±inf; numpy's too) is written as `null`, never as the bare `NaN` / `Infinity` that Python's
`json` writes by default and that JSON has no words for; numpy scalars and arrays become Python numbers and lists.
The values' exact non-finite kind is lost: files that keep it (TensorBoard event files) say so where they are written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, recursively through mappings (keys kept), lists and
    tuples (as lists); numpy scalars and arrays become Python values. Anything else is returned as it is (the
    `default` of `dumps` then decides)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """`json.dumps` of `finite(value)` with `allow_nan=False`: non-finite floats as `null` (module docstring).
    `default` converts other objects (as `json.dumps`'s, e.g. `str` for a config's odd values); its result is made
    `finite` too. Other keyword arguments go to `json.dumps` (indent, sort_keys, ...)."""
    strict_default = None if default is None else (lambda o: finite(default(o)))
    return json.dumps(finite(value), allow_nan=False, default=strict_default, **kwargs)


def dump(value: Any, f: IO[str], *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
    """`dumps` into the open text file `f`."""
    f.write(dumps(value, default=default, **kwargs))


def nan_for_null(value: Any) -> Any:
    """The inverse of `finite` for a part of a file that holds only numbers: every None (`null`) becomes NaN,
    recursively through mappings and lists. Apply it to the numeric parts only: elsewhere `null` may mean "none"."""
    if value is None:
        return math.nan
    if isinstance(value, Mapping):
        return {k: nan_for_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_for_null(v) for v in value]
    return value
