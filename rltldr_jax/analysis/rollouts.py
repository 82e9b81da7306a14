"""Analyses of a training run's saved rollouts (`{workdir}/rollouts/phase_*.jsonl`, written by `save_phase`).

Three model-free analyses of the paper's appendix, each a pure function of the loaded records returning a small
dataclass, plus writers for a CSV table and a PNG plot (`rltldr_jax.analysis.reliance` has the fourth, E.5,
which needs the policy):

- `insight_evolution` (E.4, Figure 5): for every task with written insights in two or more phases, the mean
  Jaccard dissimilarity of content words between two insights of the same visit (x) and between insights of
  its first and its last visit (y). Paper: 0.19 within vs 0.82 across visits, n = 92 revisited tasks.
- `revisited_tasks` (E.2, Figure 3): success without insight in context at a task's first vs its last visit
  (paired, with a sign-flip permutation test), and the change on tasks never revisited. Paper: 0.138 → 0.253,
  n = 85, p = 0.001; never-revisited tasks +12.4 pp.
- `insight_categories` (Table 5): the share of insights in each correction category, by keyword overlap.
  Paper: Wrong capitalization 15.3 %, Unrecorded action 11.8 %, Extra parameter 11.2 %, Unsaved setting 5.5 %,
  Over-filtering 2.1 %, Argument position 1.2 %, Other 52.3 %.

Vocabulary: a *visit* is one task in one collection phase (a phase holds each of its tasks once, so a task
revisited in a later phase has a new visit); the *insights of a visit* are those the insight writer wrote
after the visit's attempts (the records' `writer_output.insight`), not the insights shown in context (which are a
subset of the same phase's written ones, repeated in every later attempt).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------
# The records are read by `rltldr_jax.agent.rollout_files.load_rollouts` (the RL/SFT trainers read rollouts too).
from rltldr_jax.agent.rollout_files import RolloutRecord  # noqa: E402


def phase_split(records: Sequence[RolloutRecord]) -> float:
    """The boundary between the first and the second half of training: phases < split are the first half.

    The midpoint of the phase range: (min + max + 1) / 2, so phases 0..9 split into 0..4 and 5..9, and phases
    0..8 into 0..4 and 5..8.
    """
    if not records:
        raise ValueError("no records: cannot split training into halves")
    phases = [r.phase for r in records]
    return (min(phases) + max(phases) + 1) / 2


def _visits(records: Iterable[RolloutRecord]) -> dict[str, dict[int, list[RolloutRecord]]]:
    """task id → phase → the visit's records (attempt order)."""
    out: dict[str, dict[int, list[RolloutRecord]]] = {}
    for r in records:
        out.setdefault(r.task_id, {}).setdefault(r.phase, []).append(r)
    for by_phase in out.values():
        for rs in by_phase.values():
            rs.sort(key=lambda r: r.attempt.index)
    return out


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.mean(xs)) if xs else math.nan


# ----------------------------------------------------------------------------------------------------
# Insight evolution (E.4)
# ----------------------------------------------------------------------------------------------------

#: English function words removed before the Jaccard overlap (our list; the paper does not give one): articles,
#: pronouns and determiners, prepositions, conjunctions, auxiliary and modal verbs, negations, quantifiers and
#: common adverbs. Task vocabulary ("make sure", "instead", "use", "api") is kept: it is content.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a an the
    i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself she her
    hers herself it its itself they them their theirs themselves this that these those who whom whose which what
    and or but nor so yet if then else than because while although though whether as
    of to in on at by for with from into onto upon about above below over under between among through during
    before after again against within without across along around off out up down via per
    is am are was were be been being do does did doing done have has had having
    can could shall should will would may might must
    not no don't doesn't didn't isn't aren't wasn't weren't won't can't cannot shouldn't wouldn't it's that's
    there's there here where when why how
    all any both each every few more most other some such only own same very too also just even still
    """.split()  # noqa: SIM905
)

_WORD = re.compile(r"[a-z0-9]+(?:['_][a-z0-9]+)*")


def content_words(text: str, stop_words: frozenset[str] = STOP_WORDS) -> frozenset[str]:
    """The set of content words of `text`: lowercased runs of letters/digits (snake_case identifiers and
    contractions stay one word), minus `stop_words`."""
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in stop_words)


def jaccard_dissimilarity(a: str, b: str, stop_words: frozenset[str] = STOP_WORDS) -> float:
    """1 − |A ∩ B| / |A ∪ B| of the content-word sets of `a` and `b` (0 when both have no content word)."""
    x, y = content_words(a, stop_words), content_words(b, stop_words)
    union = x | y
    return 0.0 if not union else 1.0 - len(x & y) / len(union)


@dataclasses.dataclass(frozen=True)
class TaskEvolution:
    """One revisited task of `insight_evolution`.

    Attributes:
      within: mean dissimilarity over all pairs of insights of the same visit (pairs inside the first visit and
        pairs inside the last visit, pooled); NaN when neither visit has two insights.
      across: mean dissimilarity over all pairs (one insight of the first visit, one of the last).
      n_within_pairs, n_across_pairs: how many pairs each mean is over.
    """

    task_id: str
    first_phase: int
    last_phase: int
    n_first: int
    n_last: int
    within: float
    across: float
    n_within_pairs: int
    n_across_pairs: int


@dataclasses.dataclass(frozen=True)
class EvolutionResult:
    """E.4. `mean_within` averages the tasks whose `within` is defined (`n_within` of them); `mean_across`
    averages all `n_tasks`."""

    tasks: tuple[TaskEvolution, ...]
    mean_within: float
    mean_across: float
    n_tasks: int
    n_within: int

    def summary(self) -> dict[str, float | int]:
        return {
            "mean_within": self.mean_within,
            "mean_across": self.mean_across,
            "n_tasks": self.n_tasks,
            "n_within": self.n_within,
        }


def insight_evolution(records: Sequence[RolloutRecord], *, stop_words: frozenset[str] = STOP_WORDS) -> EvolutionResult:
    """Within-visit vs across-visit dissimilarity of the insights written for each revisited task (E.4).

    A task counts when at least two of its visits (phases) have written insights; its first and last such visit
    are compared. Every pair is used (the paper averages over sampled pairs; all pairs is the exact mean).
    Means over tasks are unweighted (one point per task, as in Figure 5).
    """
    tasks = []
    for task_id, by_phase in sorted(_visits(records).items()):
        written = {p: [t for r in rs if (t := r.written_insight)] for p, rs in by_phase.items()}
        phases = sorted(p for p, ins in written.items() if ins)
        if len(phases) < 2:
            continue
        first, last = written[phases[0]], written[phases[-1]]
        within_pairs = [*itertools.combinations(first, 2), *itertools.combinations(last, 2)]
        across_pairs = list(itertools.product(first, last))
        tasks.append(
            TaskEvolution(
                task_id,
                phases[0],
                phases[-1],
                len(first),
                len(last),
                within=_mean(jaccard_dissimilarity(a, b, stop_words) for a, b in within_pairs),
                across=_mean(jaccard_dissimilarity(a, b, stop_words) for a, b in across_pairs),
                n_within_pairs=len(within_pairs),
                n_across_pairs=len(across_pairs),
            )
        )
    within = [t.within for t in tasks if not math.isnan(t.within)]
    return EvolutionResult(tuple(tasks), _mean(within), _mean(t.across for t in tasks), len(tasks), len(within))


# ----------------------------------------------------------------------------------------------------
# Revisited tasks (E.2)
# ----------------------------------------------------------------------------------------------------


def paired_permutation_pvalue(
    differences: Sequence[float], *, max_resamples: int = 100_000, seed: int = 0
) -> tuple[float, str]:
    """Two-sided p-value of a paired sign-flip permutation test of mean(differences) = 0.

    Under H0 each paired difference is as likely to have the opposite sign; the p-value is the share of sign
    assignments whose |sum| is at least the observed |sum|. Zero differences are dropped (they do not change
    the sum). Exact (all 2^m assignments) when 2^m <= max_resamples, else Monte Carlo with `max_resamples`
    draws (seeded). Computed by `scipy.stats.permutation_test` (scipy comes with jax).

    Returns:
      (p-value, a description of the test); (nan, ...) with no pair, 1.0 when every difference is zero.
    """
    from scipy import stats

    d = np.asarray(differences, np.float64)
    if d.size == 0:
        return math.nan, "no pairs"
    d = d[d != 0]
    if d.size == 0:
        return 1.0, "all paired differences are zero"
    exact = 2.0**d.size <= max_resamples
    res = stats.permutation_test(
        (d,),
        lambda x, axis: np.sum(x, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=max_resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    how = "exact" if exact else f"Monte Carlo, {max_resamples} draws"
    return float(res.pvalue), f"paired sign-flip permutation test ({how}, {d.size} nonzero differences)"


@dataclasses.dataclass(frozen=True)
class RevisitedTask:
    """One revisited task: success rate without insight in context at its first and last visit (n attempts)."""

    task_id: str
    first_phase: int
    last_phase: int
    first_rate: float
    last_rate: float
    n_first: int
    n_last: int


@dataclasses.dataclass(frozen=True)
class RevisitResult:
    """E.2.

    Attributes:
      tasks: the paired revisited tasks.
      n, mean_first, mean_last, change: the pairs' count, their mean success at first / last visit, last − first.
      p_value, test: the paired test (see `paired_permutation_pvalue`).
      unpaired_revisited: tasks seen in several phases but with fewer than two visits that have an attempt
        without insight (left out of the pairs).
      split: phases < split are the first half of training (`phase_split`).
      never_n_first, never_n_second: never-revisited tasks visited in the first / second half.
      never_first, never_second, never_change: their mean success without insight, and second − first.
    """

    tasks: tuple[RevisitedTask, ...]
    n: int
    mean_first: float
    mean_last: float
    change: float
    p_value: float
    test: str
    unpaired_revisited: int
    split: float
    never_n_first: int
    never_n_second: int
    never_first: float
    never_second: float
    never_change: float

    def summary(self) -> dict[str, float | int | str]:
        return {
            "n": self.n,
            "mean_first": self.mean_first,
            "mean_last": self.mean_last,
            "change": self.change,
            "p_value": self.p_value,
            "test": self.test,
            "unpaired_revisited": self.unpaired_revisited,
            "split_phase": self.split,
            "never_n_first_half": self.never_n_first,
            "never_n_second_half": self.never_n_second,
            "never_first_half": self.never_first,
            "never_second_half": self.never_second,
            "never_change": self.never_change,
        }


def revisited_tasks(records: Sequence[RolloutRecord], *, max_resamples: int = 100_000, seed: int = 0) -> RevisitResult:
    """First vs last visit of revisited tasks, without insight in context, and never-revisited tasks (E.2).

    A visit's success rate is the share of its attempts *without insights in context* that succeeded (the
    paper's deconfounded metric, App. D); a visit with no such attempt has none and is skipped. A task is
    revisited when it appears in more than one phase; its first and last visits with a rate are paired. Means
    are over tasks (macro). The never-revisited change (INFERRED, the paper gives only "+12.4 pp"): the mean
    rate of never-revisited tasks visited in the second half of training minus that of those visited in the
    first half (halves by `phase_split` over all records).
    """
    split = phase_split(records)
    pairs: list[RevisitedTask] = []
    unpaired = 0
    never: dict[bool, list[float]] = {False: [], True: []}  # second half? → rates
    for task_id, by_phase in sorted(_visits(records).items()):
        rated = {}
        for p, rs in by_phase.items():
            plain = [r.success for r in rs if not r.with_insights]
            if plain:
                rated[p] = (float(np.mean(plain)), len(plain))
        if len(by_phase) == 1:
            if rated:
                ((p, (rate, _)),) = rated.items()
                never[p >= split].append(rate)
            continue
        if len(rated) < 2:
            unpaired += 1
            continue
        first, last = min(rated), max(rated)
        pairs.append(
            RevisitedTask(task_id, first, last, rated[first][0], rated[last][0], rated[first][1], rated[last][1])
        )
    diffs = [t.last_rate - t.first_rate for t in pairs]
    p, test = paired_permutation_pvalue(diffs, max_resamples=max_resamples, seed=seed)
    mean_first, mean_last = _mean(t.first_rate for t in pairs), _mean(t.last_rate for t in pairs)
    never_first, never_second = _mean(never[False]), _mean(never[True])
    return RevisitResult(
        tuple(pairs),
        len(pairs),
        mean_first,
        mean_last,
        mean_last - mean_first,
        p,
        test,
        unpaired,
        split,
        len(never[False]),
        len(never[True]),
        never_first,
        never_second,
        never_second - never_first,
    )


# ----------------------------------------------------------------------------------------------------
# Insight categories (Table 5)
# ----------------------------------------------------------------------------------------------------

OTHER = "Other"

#: Table 5's correction categories with our keyword lists (the paper only says the groups "are identified by
#: lexical overlap"). Keywords are matched as whole words or phrases in the lowercased insight; an insight goes
#: to the category with the most distinct matching keywords (ties: the earlier category of this table), or to
#: "Other" when none matches. The lists were written from Table 5's example insights and their obvious variants.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Wrong capitalization",
        (
            "uppercase",
            "upper case",
            "upper-case",
            "lowercase",
            "lower case",
            "lower-case",
            "capitalization",
            "capitalisation",
            "capitalize",
            "capitalise",
            "capitalized",
            "capitalised",
            "capital",
            "capital letter",
            "capital letters",
            "case-sensitive",
            "case sensitive",
            "casing",
            "enum",
            "enums",
            "enum value",
        ),
    ),
    (
        "Unrecorded action",
        (
            "record",
            "records",
            "recorded",
            "history",
            "event",
            "events",
            "mark",
            "marked",
            "marking",
            "as read",
            "track",
            "tracked",
            "rather than just viewing",
            "instead of just viewing",
        ),
    ),
    (
        "Extra parameter",
        (
            "without passing",
            "extra parameter",
            "extra argument",
            "unnecessary parameter",
            "unnecessary argument",
            "omit",
            "omitting",
            "do not pass",
            "don't pass",
            "should not include",
            "not include",
            "answer parameter",
            "parameter",
            "parameters",
        ),
    ),
    (
        "Unsaved setting",
        (
            "setting",
            "settings",
            "preference",
            "preferences",
            "saved",
            "save",
            "persist",
            "persists",
            "persisted",
            "default",
            "configuration",
            "database",
        ),
    ),
    (
        "Over-filtering",
        (
            "filter",
            "filters",
            "filtering",
            "filtered",
            "no results",
            "too restrictive",
            "too narrow",
        ),
    ),
    (
        "Argument position",
        (
            "positional",
            "position",
            "first argument",
            "second argument",
            "keyword argument",
            "argument order",
            "order of arguments",
            "order of the arguments",
        ),
    ),
)

CATEGORY_NAMES: tuple[str, ...] = (*(name for name, _ in CATEGORIES), OTHER)


def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    return re.compile(r"(?<![a-z0-9_])" + re.escape(keyword) + r"(?![a-z0-9_])")


_CATEGORY_PATTERNS = tuple((name, tuple(_keyword_pattern(k) for k in keywords)) for name, keywords in CATEGORIES)


def category_scores(text: str) -> dict[str, int]:
    """Per category of `CATEGORIES`, how many of its distinct keywords occur in `text`."""
    low = text.lower()
    return {name: sum(bool(p.search(low)) for p in patterns) for name, patterns in _CATEGORY_PATTERNS}


def classify_insight(text: str) -> str:
    """The category of one insight (see `CATEGORIES`): the most keyword matches, ties to the earlier one."""
    scores = category_scores(text)
    best = max(scores.values(), default=0)
    return OTHER if best == 0 else next(name for name, s in scores.items() if s == best)


@dataclasses.dataclass(frozen=True)
class CategoryResult:
    """Table 5: insights per category (`CATEGORY_NAMES` order), their shares, and each insight's category."""

    counts: dict[str, int]
    shares: dict[str, float]
    n: int
    insights: tuple[tuple[str, str, int, str], ...]  # (task_id, category, phase, insight text)

    def summary(self) -> dict[str, float | int]:
        return {"n": self.n, **{f"share[{k}]": v for k, v in self.shares.items()}}


def insight_categories(records: Sequence[RolloutRecord], *, unique: bool = False) -> CategoryResult:
    """Shares of the written insights per correction category (Table 5).

    Args:
      records: the run's records; every written insight (`writer_output.insight`) is classified once.
      unique: count each distinct insight text once (per task) instead of every time it was written.

    Raises:
      ValueError: the records hold no written insight (a run without insight writer, e.g. GRPO).
    """
    items = [(r.task_id, r.phase, t) for r in records if (t := r.written_insight)]
    if unique:  # keep each (task, text) at its first occurrence
        seen: set[tuple[str, str]] = set()
        items = [it for it in items if (it[0], it[2]) not in seen and not seen.add((it[0], it[2]))]
    if not items:
        raise ValueError(
            "the rollouts hold no written insight (writer_output.insight): was the run trained without an "
            "insight writer (insight.schedule='never', the GRPO baseline)?"
        )
    classified = tuple((tid, classify_insight(t), p, t) for tid, p, t in items)
    counts = {name: 0 for name in CATEGORY_NAMES}
    for _, cat, _, _ in classified:
        counts[cat] += 1
    n = len(classified)
    return CategoryResult(counts, {k: v / n for k, v in counts.items()}, n, classified)


# ----------------------------------------------------------------------------------------------------
# Writers: CSV tables and PNG plots (matplotlib's Agg canvas, no pyplot state)
# ----------------------------------------------------------------------------------------------------


def write_csv(path: str | os.PathLike, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Writes a CSV (floats with 6 significant digits, NaN as "nan"); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def cell(x: Any) -> Any:
        return f"{x:.6g}" if isinstance(x, float) else x

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([cell(x) for x in row] for row in rows)
    return path


def write_summary_csv(path: str | os.PathLike, summary: Mapping[str, Any]) -> str:
    """A two-column (metric, value) CSV of a result's `summary()`."""
    return write_csv(path, ("metric", "value"), summary.items())


def new_figure(width: float = 5.0, height: float = 4.0):
    """A matplotlib Figure not registered with pyplot (no global state; saved through the Agg canvas)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def save_figure(fig, path: str | os.PathLike) -> str:
    """Writes `fig` as a PNG at `path` (directories created); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")  # a bare Figure saves through the Agg canvas
    return path


def write_evolution(result: EvolutionResult, out_dir: str | os.PathLike) -> list[str]:
    """evolution.csv (summary), evolution_tasks.csv (one row per task), evolution.png (Figure 5)."""
    paths = [
        write_summary_csv(os.path.join(out_dir, "evolution.csv"), result.summary()),
        write_csv(
            os.path.join(out_dir, "evolution_tasks.csv"),
            [f.name for f in dataclasses.fields(TaskEvolution)],
            (dataclasses.astuple(t) for t in result.tasks),
        ),
    ]
    fig = new_figure()
    ax = fig.add_subplot()
    ok = [t for t in result.tasks if not math.isnan(t.within)]
    ax.scatter([t.within for t in ok], [t.across for t in ok], s=14, alpha=0.7)
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
    ax.set(
        xlim=(-0.02, 1.02),
        ylim=(-0.02, 1.02),
        xlabel="dissimilarity within a visit",
        ylabel="dissimilarity first vs last visit",
        title=(
            f"within {result.mean_within:.2f} (n={result.n_within}) "
            f"vs across {result.mean_across:.2f} (n={result.n_tasks})"
        ),
    )
    paths.append(save_figure(fig, os.path.join(out_dir, "evolution.png")))
    return paths


def write_revisits(result: RevisitResult, out_dir: str | os.PathLike) -> list[str]:
    """revisits.csv (summary), revisits_tasks.csv (one row per paired task), revisits.png (Figure 3)."""
    paths = [
        write_summary_csv(os.path.join(out_dir, "revisits.csv"), result.summary()),
        write_csv(
            os.path.join(out_dir, "revisits_tasks.csv"),
            [f.name for f in dataclasses.fields(RevisitedTask)],
            (dataclasses.astuple(t) for t in result.tasks),
        ),
    ]
    fig = new_figure(7.0, 4.0)
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for t in result.tasks:
        ax.plot([0, 1], [t.first_rate, t.last_rate], color="tab:blue", alpha=0.15, lw=1)
    ax.plot([0, 1], [result.mean_first, result.mean_last], color="tab:red", lw=2.5, marker="o", label="mean")
    ax.set(
        xticks=[0, 1],
        xticklabels=["first visit", "last visit"],
        ylim=(-0.05, 1.05),
        ylabel="success without insight",
        title=f"Revisited (n={result.n}, p={result.p_value:.3g})",
    )
    ax.legend(loc="upper left")
    bx.bar([0, 1], [result.never_first, result.never_second], color=["tab:grey", "tab:green"])
    bx.set(
        xticks=[0, 1],
        xticklabels=[f"1st half\n(n={result.never_n_first})", f"2nd half\n(n={result.never_n_second})"],
        ylim=(0, 1),
        title=f"Never revisited ({100 * result.never_change:+.1f} pp)",
    )
    paths.append(save_figure(fig, os.path.join(out_dir, "revisits.png")))
    return paths


def write_categories(result: CategoryResult, out_dir: str | os.PathLike) -> list[str]:
    """categories.csv (category, count, share), categories_insights.csv (each insight), categories.png."""
    paths = [
        write_csv(
            os.path.join(out_dir, "categories.csv"),
            ("category", "count", "share"),
            ((k, result.counts[k], result.shares[k]) for k in CATEGORY_NAMES),
        ),
        write_csv(
            os.path.join(out_dir, "categories_insights.csv"),
            ("task_id", "category", "phase", "insight"),
            result.insights,
        ),
    ]
    fig = new_figure(6.0, 3.5)
    ax = fig.add_subplot()
    names = list(CATEGORY_NAMES)[::-1]
    ax.barh(names, [100 * result.shares[k] for k in names])
    ax.set(xlabel="share of insights (%)", title=f"Insight categories (n={result.n})")
    paths.append(save_figure(fig, os.path.join(out_dir, "categories.png")))
    return paths
