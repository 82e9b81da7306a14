"""The one wording of "these two trees of named arrays do not match": missing, unexpected and mis-shaped names.

Used wherever stored arrays are matched against what a model config expects (orbax restores, HF safetensors loads,
the Δθ analysis), so that every such error reads alike.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Names listed per kind before the rest are counted.
LIMIT = 12


def listing(items: Sequence[str], sep: str = ", ", limit: int = LIMIT) -> str:
    """At most `limit` items, `sep`-separated, with the total when there are more."""
    return sep.join(items[:limit]) + (f"{sep}… ({len(items)} in all)" if len(items) > limit else "")


def mismatch_problems(
    *,
    missing: Sequence[str] = (),
    unexpected: Sequence[str] = (),
    mis_shaped: Sequence[str] = (),
    what: str,
    limit: int = LIMIT,
) -> list[str]:
    """The non-empty ones of "missing {what}: …", "unexpected {what}: …", "mis-shaped {what}: …".

    Args:
      missing: names expected but not stored; unexpected: names stored but not expected (both ", "-separated).
      mis_shaped: one description per mismatching array, e.g. "name: checkpoint (2, 3) ≠ target (3, 2)" ("; "-separated:
        the descriptions hold commas).
      what: the plural noun for the entries ("tensors", "arrays").
      limit: entries listed per kind; beyond it, "… (N in all)".
    """
    named = ((f"missing {what}", missing, ", "), (f"unexpected {what}", unexpected, ", "))
    problems = [f"{kind}: {listing(items, sep, limit)}" for kind, items, sep in named if items]
    if mis_shaped:
        problems.append(f"mis-shaped {what}: {listing(mis_shaped, '; ', limit)}")
    return problems
