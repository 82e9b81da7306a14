"""Requirement tests over the database diff, and the AppWorld-style report.

A template's `check(v, params)` calls `v.test(requirement, ok, got)` for each requirement. Requirement texts
and `got` strings describe what is required and what the AGENT did (its values), never the ground truth.
`Checker.finish` adds the standard tests (task completed, answer given only for QA tasks, no other changes)
and returns a `Verdict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..base import Verdict
from .world import World, diff

RULE = "────────────"
# Side-effect tables that record reads (search history); changes there are not collateral damage unless a
# template checks them itself.
IGNORED = frozenset({"finance.search_history"})


@dataclasses.dataclass
class _Test:
    requirement: str
    ok: bool
    got: str


class Checker:
    """Collects requirement tests for one attempt.

    Args:
      before: the initial database.
      world: the world after the attempt (its db, answer, completion state and call log).
    """

    def __init__(self, before: Mapping[str, Any], world: World):
        self.before = before
        self.after = world.db
        self.world = world
        self.diff = diff(before, world.db)
        self.tests: list[_Test] = []

    # ---- lookups for templates -------------------------------------------------------------------
    def table(self, key: str, which: str = "after") -> list[dict]:
        app, table = key.split(".")
        return (self.after if which == "after" else self.before)[app][table]

    def record(self, key: str, record_id: Any, which: str = "after") -> dict | None:
        return next((r for r in self.table(key, which) if r["id"] == record_id), None)

    def added(self, key: str) -> list[dict]:
        return self.diff.get(key, {}).get("added", [])

    def removed(self, key: str) -> list[dict]:
        return self.diff.get(key, {}).get("removed", [])

    def changed(self, key: str) -> list[tuple[dict, dict]]:
        return self.diff.get(key, {}).get("changed", [])

    # ---- tests -------------------------------------------------------------------------------------
    def test(self, requirement: str, ok: bool, got: Any = "") -> bool:
        """Records one requirement; `got` shows the agent's value(s) when it fails."""
        self.tests.append(_Test(requirement, bool(ok), got if isinstance(got, str) else repr(got)))
        return bool(ok)

    def no_other_changes(self, allowed: Mapping[str, Any]) -> None:
        """Collateral damage: only the allowed changes may appear in the diff.

        Args:
          allowed: {"app.table": "*"} allows any change in the table; {"app.table": {"ids": {id: fields or "*"},
            "added": n}} allows changes of the listed fields of the listed records and up to n added records.
        """
        extra: list[str] = []
        for key, d in self.diff.items():
            if key in IGNORED:
                continue
            rule = allowed.get(key)
            if rule == "*":
                continue
            rule = rule or {}
            ids, n_add = rule.get("ids", {}), rule.get("added", 0)
            if len(d["added"]) > n_add:
                extra += [f"{key}: added {r}" for r in d["added"][n_add:]]
            extra += [f"{key}: removed {r}" for r in d["removed"] if r["id"] not in ids]
            for old, new in d["changed"]:
                fields = ids.get(old["id"]) if old["id"] in ids else ()
                if fields == "*":
                    continue
                bad = {
                    k: (old.get(k), new.get(k))
                    for k in set(old) | set(new)
                    if old.get(k) != new.get(k) and k not in fields
                }
                if bad:
                    extra.append(
                        f"{key}: record {old['id']} changed "
                        + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(bad.items()))
                    )
        self.test(
            "assert no other changes were made to the database than the ones the task asks for (no collateral changes)",
            not extra,
            "unexpected changes:\n" + "\n".join(extra[:8]),
        )

    def finish(self, qa: bool, answer_ok: bool | None, allowed: Mapping[str, Any]) -> Verdict:
        """Adds the standard tests and builds the Verdict."""
        w = self.world
        tests, self.tests = self.tests, []
        self.test(
            "assert the task was marked as completed with apis.supervisor.complete_task",
            w.completed,
            "complete_task was not called successfully",
        )
        self.tests += tests
        if qa:
            self.test(
                "assert the answer passed to apis.supervisor.complete_task(answer=...) is correct",
                bool(answer_ok),
                f"answer={w.answer!r}",
            )
        else:
            self.test(
                "assert apis.supervisor.complete_task was called without an answer, since this task asks no question",
                w.answer is None,
                f"answer={w.answer!r}",
            )
        self.no_other_changes(allowed)
        return report(self.tests)


def report(tests: list[_Test]) -> Verdict:
    """The AppWorld-style report text and the Verdict."""
    passed = [t for t in tests if t.ok]
    failed = [t for t in tests if not t.ok]
    lines = [
        f"{RULE} Overall Stats {RULE}",
        f"Num Passed Tests : {len(passed)}",
        f"Num Failed Tests : {len(failed)}",
        f"Num Total  Tests : {len(tests)}",
    ]
    if passed:
        lines.append(f"{RULE} Passes {RULE}")
        for t in passed:
            lines += [">> Passed Requirement", t.requirement]
    if failed:
        lines.append(f"{RULE} Fails {RULE}")
        for t in failed:
            lines += [">> Failed Requirement", t.requirement, "----------", f"AssertionError: got {t.got}", ""]
    return Verdict(
        success=not failed,
        report="\n".join(lines).rstrip() + "\n",
        num_passed=len(passed),
        num_tests=len(tests),
        failures=tuple(t.requirement for t in failed),
    )
