"""The second replication round's pre-registered analysis: every number its pre-registration names, computed from the
grid's results.csv rows, whichever way each falls. Pure functions; no I/O but `read_results`.

    rows = read_results("runs/replicate_v2/results.csv")
    numbers = analyse(rows, base)          # {name: Number}, the pre-registered ones in a fixed order
    print(analysis_markdown(numbers))

The plan (docs/replication/v2/preregistration.md; fixed before the grid ran, changed only by a commit before it):
- **Primary** (P-tier2, P-tier3): no-insight Pass@1 on tier 2 (held-out targets) and on tier 3 (held-out gated items
  of trained kinds: rule generalisation), at the evaluation chosen on `valid` (`_selected`), `rltldr` minus
  `strict_control`, paired by seed (the two arms of a seed share its base policy), with the 95 % percentile bootstrap
  interval over seeds. A tier "reproduces" when the interval's lower end is above 0. The two tiers answer two
  questions (targets, rules), each reported on its own: no correction across them.
- **λ** (L): tier 1 (held-in tasks) no-insight Pass@1 at the selected evaluation, `rltldr` (λ = 0.5) minus `lambda_0`,
  paired by seed (seeds 0–9: `lambda_0`'s): superiority when the 95 % bootstrap interval's lower end is above 0;
  otherwise equivalence within ±10 points by paired TOST at α = 0.05; otherwise inconclusive.
- **Sanity** (S): every GRPO arm's tier-1 no-insight Pass@1 (final and selected) is 0 on every seed; `rltldr`'s
  tier-4 value (a wholly held-out kind) has a 95 % bootstrap upper end below 5 points; the base policy's i.i.d.
  Pass@64 is 0 on every seed.
- **Secondary** (reported, no decision): the primary differences on `final` and `auc`; `rltldr` minus
  `shuffled_control` on tiers 2 and 3; round one's held-in gain checked again on tier 1 (`rltldr` minus
  `strict_control` and minus `grpo`, selected); every arm's mean and 95 % interval per tier and measure.

Intervals: 95 % percentile bootstrap over seeds, 10,000 resamples, numpy seed 0 (`stats.py`); a difference resamples
the seeds both arms ran (paired), an arm's mean its own seeds. Given the pre-registered seeds of each arm
(`analyse(..., seeds=)`), only those count, and a number computed on fewer says which are missing in its decision:
an incomplete grid never passes for a complete one.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence

from rltldr_jax.replication.stats import Interval, mean_bootstrap, paired_bootstrap, paired_tost

#: The evaluation sets (env `forge`'s) and the measures of results.csv (report.SPLIT_MEASURES' suffixes).
TIERS = ("valid", "tier1", "tier2", "tier3", "tier4")
MEASURES = {"final": "", "selected": "_selected", "auc": "_auc"}
PRIMARY_TIERS = ("tier2", "tier3")
PRIMARY_MEASURE = "selected"
LAMBDA_TIER = "tier1"
TOST_MARGIN = 0.10
TIER4_CEILING = 0.05
GRPO_ARMS = ("grpo", "grpo_k64", "grpo_hot")
LEVEL = 0.95
ALPHA = 0.05

#: arm -> seed -> column -> value.
Table = Mapping[str, Mapping[int, Mapping[str, float]]]
#: arm -> its pre-registered seeds.
Seeds = Mapping[str, Sequence[int]]


@dataclasses.dataclass(frozen=True)
class Number:
    """One pre-registered number: what it is, its value (a difference with its interval, or one value), the
    decision it supports ("" for a secondary one) and its role (primary, lambda, sanity, secondary)."""

    role: str
    what: str
    interval: Interval | None = None
    value: float = math.nan
    decision: str = ""
    p: float = math.nan
    n: int = 0  # (a single value's seeds; an interval has its own)


def column(tier: str, measure: str) -> str:
    """results.csv's column of a tier's no-insight Pass@1 under `measure` (final, selected, auc)."""
    return f"{tier}_pass1_no_insight{MEASURES[measure]}"


def read_results(path: str) -> dict[str, dict[int, dict[str, float]]]:
    """results.csv as arm -> seed -> column -> value (numbers only; empty cells are NaN)."""
    table: dict[str, dict[int, dict[str, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            values = {}
            for k, v in row.items():
                if k in ("arm", "seed", "workdir"):
                    continue
                try:
                    values[k] = float(v) if v != "" else math.nan
                except ValueError:
                    continue
            table.setdefault(row["arm"], {})[int(row["seed"])] = values
    return table


def by_seed(table: Table, arm: str, col: str) -> dict[int, float]:
    """{seed: value} of `arm` in column `col` (seeds without a finite value left out)."""
    return {s: v[col] for s, v in table.get(arm, {}).items() if math.isfinite(v.get(col, math.nan))}


def _difference(table: Table, a: str, b: str, col: str) -> Interval:
    return paired_bootstrap(by_seed(table, a, col), by_seed(table, b, col), level=LEVEL)


def pinned(table: Table, seeds: Seeds) -> dict[str, dict[int, Mapping[str, float]]]:
    """`table` with each arm of `seeds` cut to its pre-registered seeds (other arms as they are)."""
    return {arm: {s: v for s, v in rows.items() if arm not in seeds or s in seeds[arm]} for arm, rows in table.items()}


def seed_list(seeds: Sequence[int]) -> str:
    """Seeds as short text, runs of consecutive ones as ranges: [0, 1, 2, 5, 7, 8] -> "0–2, 5, 7–8"."""
    parts: list[str] = []
    ordered = sorted(set(seeds))
    start = 0
    for i, seed in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != seed + 1:
            first = ordered[start]
            parts.append(str(seed) if first == seed else f"{first}–{seed}")
            start = i + 1
    return ", ".join(parts)


def missing_runs(table: Table, seeds: Seeds) -> str:
    """The pre-registered (arm, seed) rows `table` lacks, as text ("rltldr 16–19; grpo 2"); "" when none."""
    lost = {arm: [s for s in arm_seeds if s not in table.get(arm, {})] for arm, arm_seeds in seeds.items()}
    return "; ".join(f"{arm} {seed_list(v)}" for arm, v in lost.items() if v)


def _missing(table: Table, seeds: Seeds | None, arms: Sequence[str], *cols: str) -> str:
    """The pre-registered seeds of `arms` without a finite value in each of `cols`, as text ("strict_control 7, 12");
    "" when none (or no `seeds`)."""
    if seeds is None:
        return ""
    parts = []
    for arm in arms:
        present = set.intersection(*(set(by_seed(table, arm, col)) for col in cols))
        lost = sorted(set(seeds.get(arm, ())) - present)
        if lost:
            parts.append(f"{arm} {seed_list(lost)}")
    return "; ".join(parts)


def _flag(decision: str, missing: str) -> str:
    return f"{decision}; missing seeds: {missing}" if missing else decision


def analyse(
    table: Table, base: Mapping[int, Mapping[str, float]] | None = None, seeds: Seeds | None = None
) -> list[Number]:
    """Every pre-registered number (module docstring), in the pre-registration's order. `seeds`: each arm's
    pre-registered seeds (only they count; a number short of some says which in its decision); None: every seed
    in `table`."""
    if seeds is not None:
        table = pinned(table, seeds)
    out: list[Number] = []
    for tier in PRIMARY_TIERS:
        col = column(tier, PRIMARY_MEASURE)
        diff = _difference(table, "rltldr", "strict_control", col)
        verdict = "reproduced" if diff.low > 0 else "not reproduced" if math.isfinite(diff.low) else "no data"
        verdict = _flag(verdict, _missing(table, seeds, ("rltldr", "strict_control"), col))
        out.append(Number("primary", f"{tier} selected: rltldr − strict_control", diff, decision=verdict))
    col = column(LAMBDA_TIER, PRIMARY_MEASURE)
    diff = _difference(table, "rltldr", "lambda_0", col)
    tost = paired_tost(by_seed(table, "rltldr", col), by_seed(table, "lambda_0", col), margin=TOST_MARGIN)
    if not math.isfinite(diff.low):
        verdict = "no data"
    elif diff.low > 0:
        verdict = "λ = 0.5 superior"
    elif tost.p < ALPHA:
        verdict = f"equivalent within ±{TOST_MARGIN * 100:.0f} points"
    else:
        verdict = "inconclusive"
    lam_seeds = None if seeds is None else {**seeds, "rltldr": seeds.get("lambda_0", ())}  # (the pairs: lambda_0's)
    verdict = _flag(verdict, _missing(table, lam_seeds, ("rltldr", "lambda_0"), col))
    out.append(Number("lambda", f"{LAMBDA_TIER} selected: rltldr (λ=0.5) − lambda_0", diff, decision=verdict, p=tost.p))
    for arm in GRPO_ARMS:
        cols = [column("tier1", m) for m in ("final", "selected")]
        values = [v for c in cols for v in by_seed(table, arm, c).values()]
        top = max(values) if values else math.nan
        verdict = "no data" if not values else "holds" if top == 0 else "fails"
        verdict = _flag(verdict, _missing(table, seeds, (arm,), *cols))
        n = len(set(by_seed(table, arm, cols[0])) | set(by_seed(table, arm, cols[1])))
        what = f"{arm}: max over seeds of tier1 final/selected (expected 0)"
        out.append(Number("sanity", what, value=top, decision=verdict, n=n))
    col = column("tier4", PRIMARY_MEASURE)
    tier4 = mean_bootstrap(list(by_seed(table, "rltldr", col).values()))
    if not math.isfinite(tier4.high):
        verdict = "no data" if tier4.n == 0 else "too few seeds"
    else:
        verdict = "holds" if tier4.high < TIER4_CEILING else "fails"
    verdict = _flag(verdict, _missing(table, seeds, ("rltldr",), col))
    what = f"rltldr tier4 selected (upper end expected < {TIER4_CEILING * 100:.0f} points)"
    out.append(Number("sanity", what, tier4, decision=verdict))
    if base:
        k = max(int(key.split("@")[1]) for c in base.values() for key in c if key.startswith("iid_pass@"))
        iid = {s: c.get(f"iid_pass@{k}", math.nan) for s, c in base.items()}
        expected = sorted({s for arm_seeds in seeds.values() for s in arm_seeds}) if seeds is not None else sorted(iid)
        finite = [v for s, v in iid.items() if s in expected and math.isfinite(v)]
        top = max(finite) if finite else math.nan
        verdict = "no data" if not finite else "holds" if top == 0 else "fails"
        lost = [s for s in expected if not math.isfinite(iid.get(s, math.nan))]
        verdict = _flag(verdict, f"base {seed_list(lost)}" if lost else "")
        what = f"base i.i.d. Pass@{k} on the hard training tasks, max over seeds (expected 0)"
        out.append(Number("sanity", what, value=top, decision=verdict, n=len(finite)))
    for tier in PRIMARY_TIERS:
        for measure in ("final", "auc"):
            diff = _difference(table, "rltldr", "strict_control", column(tier, measure))
            out.append(Number("secondary", f"{tier} {measure}: rltldr − strict_control", diff))
        diff = _difference(table, "rltldr", "shuffled_control", column(tier, PRIMARY_MEASURE))
        out.append(Number("secondary", f"{tier} selected: rltldr − shuffled_control", diff))
    col = column(LAMBDA_TIER, PRIMARY_MEASURE)  # round one's held-in gain, checked again on tier 1
    for reference in ("strict_control", "grpo"):
        diff = _difference(table, "rltldr", reference, col)
        out.append(Number("secondary", f"{LAMBDA_TIER} selected: rltldr − {reference}", diff))
    return out


def beside(table: Table, arm: str, reference: str, measure: str = PRIMARY_MEASURE) -> list[Number]:
    """`arm` minus `reference` on every tier under `measure`, paired by seed, with 95 % bootstrap intervals: an arm
    added after the pre-registration (e.g. `rltldr_lora` beside `rltldr`), reported with no decision."""
    return [
        Number(
            "not pre-registered",
            f"{tier} {measure}: {arm} − {reference}",
            _difference(table, arm, reference, column(tier, measure)),
        )
        for tier in TIERS
    ]


def arm_table(table: Table, arms: Sequence[str], measure: str = PRIMARY_MEASURE) -> str:
    """Markdown: per arm, seeds and each tier's mean with its 95 % bootstrap interval, in %, under `measure`."""
    lines = [
        f"| arm | seeds | {' | '.join(TIERS)} |",
        "|---|---|" + "---|" * len(TIERS),
    ]
    for arm in arms:
        if arm not in table:
            continue
        cells = []
        for tier in TIERS:
            values = list(by_seed(table, arm, column(tier, measure)).values())
            m = mean_bootstrap(values)
            cells.append(_ci(m) if values else "–")
        lines.append(f"| {arm} | {len(table[arm])} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}" if math.isfinite(x) else "nan"


def _ci(i: Interval) -> str:
    if not math.isfinite(i.low):
        return f"{100 * i.diff:.1f}" if math.isfinite(i.diff) else "–"
    return f"{100 * i.diff:.1f} [{100 * i.low:.1f}, {100 * i.high:.1f}]"


def analysis_markdown(numbers: Sequence[Number]) -> str:
    """The pre-registered numbers as a markdown table (points; differences with 95 % intervals over seeds)."""
    lines = ["| role | number | value (points) | 95 % CI | n | decision |", "|---|---|---|---|---|---|"]
    for n in numbers:
        if n.interval is not None:
            i = n.interval
            ci = f"[{_pct(i.low)}, {_pct(i.high)}]" if math.isfinite(i.low) else "–"
            value, count = _pct(i.diff), str(i.n)
        else:
            value, ci = (f"{100 * n.value:.1f}" if math.isfinite(n.value) else "nan"), "–"
            count = str(n.n) if n.n else "–"
        decision = n.decision + (f" (TOST p = {n.p:.3f})" if math.isfinite(n.p) else "")
        lines.append(f"| {n.role} | {n.what} | {value} | {ci} | {count} | {decision} |")
    return "\n".join(lines)


def as_records(numbers: Sequence[Number]) -> list[dict[str, float | str]]:
    """The numbers as flat records (e.g. for a JSON file or a data frame)."""
    out = []
    for n in numbers:
        i = n.interval
        out.append(
            {
                "role": n.role,
                "what": n.what,
                "value": i.diff if i is not None else n.value,
                "low": i.low if i is not None else math.nan,
                "high": i.high if i is not None else math.nan,
                "n": i.n if i is not None else n.n,
                "decision": n.decision,
                "tost_p": n.p,
            }
        )
    return out
