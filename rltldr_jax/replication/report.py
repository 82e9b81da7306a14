"""The replication's outputs: results.csv (one row per arm and seed), results.md (mean ± std over seeds, next to
the paper's and a third-party toy replication's numbers), curves.png (no-insight Pass@1 against environment steps),
split_curves.png (the same per evaluation set, with 95 % bootstrap bands over seeds: a world with tiers) and
insight_curves.png (Fig. 11 on the base policy).

    write_results(summaries, base, out)       # summaries: run_one's dicts; base: {seed: base_checks dict}

Each file is written next to its place and then moved there (`replaced`), so a reader (or another launcher of the
same grid) never sees a half-written table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rltldr_jax.analysis.rollouts import new_figure, save_figure, write_csv
from rltldr_jax.replication.grid import read_metrics
from rltldr_jax.replication.measures import eval_measures
from rltldr_jax.replication.stats import bootstrap_band

COLUMNS = (
    "arm",
    "seed",
    "train_pass1_no_insight",
    "heldout_pass1_no_insight",
    "train_pass1_insight",
    "env_steps",
    "walltime_s",
    "lam",
    "workdir",
    "train_pass1_no_insight_best",
)

#: Reference numbers: (train, eval) no-insight Pass@1 in %. The paper: Table 2 (642-task SAPI split, Qwen 3.5 9B;
#: GRPO from §4.2, "stays at 0-1 %"). The toy: a third-party replication (avikds, a 0.12M-parameter transformer in a
#: hidden-rule crafting world, one seed, held-out targets as eval).
PAPER = {
    "grpo": "0-1 / 0-1",
    "lambda_0.5": "21.5 / 18.9",
    "lambda_0": "6.1 / 13.2",
    "lambda_0.01": "9.3 / 14.0",
    "sft_only": "20.0 / 17.0",
    "sftldr": "17.8 / 16.8",
}
TOY = {
    "grpo": "0.0 / 0.0",
    "lambda_0": "64.0 / 51.0",
    "lambda_0.03": "73.2 / 53.8",
    "lambda_0.5": "0.0 / 1.0",
    "sftldr": "0.0 / 0.0",
}


def replaced(path: str, write: Callable[[str], object]) -> str:
    """`write(tmp)` to a temporary file next to `path`, then the file moved onto `path` in one step (`os.replace`);
    returns `path`. The temporary file is removed if `write` fails."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _stats(values: Sequence[float]) -> tuple[float, float, int]:
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return math.nan, math.nan, 0
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, len(v)


def _pct(mean: float, std: float, n: int) -> str:
    if n == 0:
        return "n/a"
    return f"{100 * mean:.1f} ± {100 * std:.1f}" if n > 1 else f"{100 * mean:.1f}"


def arm_order(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Arms in the order they first appear."""
    return list(dict.fromkeys(s["arm"] for s in summaries))


def arm_names(summaries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each arm shown once: arm -> its label in the table and the curves, skipping an arm whose runs are the same
    runs as an earlier arm's (e.g. `lambda_0.03`, run once for `rltldr`), which labels that earlier arm as
    `rltldr (= lambda_0.03)` instead of a second, identical row and a curve drawn over the first."""
    runs = {
        arm: sorted(str(s.get("workdir", "")) for s in summaries if s["arm"] == arm) for arm in arm_order(summaries)
    }
    same: dict[str, list[str]] = {}  # arm shown -> the other arms that are its runs
    for arm, workdirs in runs.items():
        owner = next((a for a in same if all(workdirs) and runs[a] == workdirs), None)
        if owner is None:
            same[arm] = []
        elif _runs_arm(workdirs) == arm:  # the runs are named after this arm (runs/rltldr-s0): it names the row
            same = {(arm if a == owner else a): ([owner, *also] if a == owner else also) for a, also in same.items()}
        else:
            same[owner].append(arm)
    return {arm: arm + (f" (= {', '.join(also)})" if also else "") for arm, also in same.items()}


def _runs_arm(workdirs: Sequence[str]) -> str:
    """The arm a run's directory is named after (`runs/rltldr-s0` -> rltldr), "" when they disagree."""
    names = {os.path.basename(w.rstrip("/")).rpartition("-s")[0] for w in workdirs}
    return names.pop() if len(names) == 1 else ""


def table_legend(summaries: Sequence[Mapping[str, Any]]) -> str:
    """What results.md's columns mean (units, where the reference numbers come from, which λ `rltldr` uses)."""
    lams = sorted({float(s["lam"]) for s in summaries if s["arm"] == "rltldr" and "lam" in s})
    rltldr = (
        f" Here `rltldr` trains with λ = {', '.join(f'{x:g}' for x in lams)}"
        + (" (the paper's λ is 0.5)." if lams and lams != [0.5] else ".")
        if lams
        else ""
    )
    return (
        "How to read it: every Pass@1 is the share of tasks solved, in % (mean ± sample standard deviation over the "
        "seeds; per run, the success over its evaluation tasks and their attempts), *no-insight* means attempts "
        "without insights in context (what the policy does on its own). *train* is the held-in evaluation set of "
        "training tasks, *held-out* the held-out one; *with insights* is the success of the training attempts that "
        "had insights in context. Final values are at the run's last evaluation; *best evaluation* is the highest "
        "held-in value over the run's evaluations (chosen on the held-in set, so optimistic). *env steps* are the "
        "environment steps of training, *minutes* the run's wall time. *paper* is the paper's Table 2 (SAPI, Qwen 3.5 "
        "9B; GRPO from §4.2), *toy* a third-party toy replication (a 0.12M-parameter transformer in a hidden-rule "
        "crafting world, one seed): other worlds and models, shown for direction only. An arm that is the same runs "
        f"as another is one row, named `a (= b)`.{rltldr}"
    )


def results_table(summaries: Sequence[Mapping[str, Any]], base: Mapping[int, Mapping[str, float]]) -> str:
    """The markdown table: per arm, mean ± std over seeds (Pass@1 in %), with the paper's and the toy's numbers."""
    lines = [
        "| arm | seeds | train no-insight Pass@1 | held-out no-insight Pass@1 | train Pass@1 with insights "
        "| train no-insight Pass@1, best evaluation | env steps | "
        "minutes | paper (train / eval) | toy (train / held-out) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if base:
        tr, ho = (
            _stats([b["heldin_pass@1"] for b in base.values()]),
            _stats([b["heldout_pass@1"] for b in base.values()]),
        )
        ins = _stats([b["sequential_pass@1_insight"] for b in base.values()])
        lines.append(
            f"| base policy (step 0) | {tr[2]} | {_pct(*tr)} | {_pct(*ho)} | {_pct(*ins)} | | 0 | | 4 / 4 (base) | |"
        )
    for arm, label in arm_names(summaries).items():
        rows = [s for s in summaries if s["arm"] == arm]
        cols = [
            _stats([r[k] for r in rows])
            for k in ("train_pass1_no_insight", "heldout_pass1_no_insight", "train_pass1_insight")
        ]
        best = [
            r["train_pass1_no_insight_best"] if "train_pass1_no_insight_best" in r else best_train_pass1(r)
            for r in rows
        ]
        cols.append(_stats(best))
        steps = int(np.mean([r["env_steps"] for r in rows]))
        minutes = np.mean([r["walltime_s"] for r in rows]) / 60
        same = f"lambda_{rows[0]['lam']:g}" if arm == "rltldr" else arm  # rltldr is the λ arm it equals
        lines.append(
            f"| {label} | {len(rows)} | {' | '.join(_pct(*c) for c in cols)} | {steps:,} | {minutes:.1f} | "
            f"{PAPER.get(same, '')} | {TOY.get(same, '')} |"
        )
    return "\n".join(lines)


#: A grid's pre-registered analysis: (arm -> seed -> results.csv column -> value, seed -> base checks) -> markdown.
Analysis = Callable[[Mapping[str, Mapping[int, Mapping[str, float]]], Mapping[int, Mapping[str, float]]], str]

#: The three measures of an evaluation set in results.csv (replication/measures.py): column suffix -> measure.
SPLIT_MEASURES = {"": "final", "_selected": "selected", "_auc": "auc"}


def split_names_of(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The `eval.splits` sets the runs measured (`eval_<split>/pass@1/all` in their summaries' measures), in order of
    first appearance: a world's tiers ("valid", "tier1", ..., "tier4"); none for round one's runs."""
    names: dict[str, None] = {}
    for s in summaries:
        for key in s.get("measures", {}).get("final", {}):
            split = key.removesuffix("/pass@1/all").removeprefix("eval_")
            if key.startswith("eval_") and split != "train":
                names[split] = None
    return list(names)


def split_columns(splits: Sequence[str]) -> list[str]:
    """results.csv's columns of the evaluation sets: `{split}_pass1_no_insight` (final), `..._selected` (at the
    evaluation chosen on held-in validation, `eval.select_on`) and `..._auc` (area under the curve)."""
    return [f"{split}_pass1_no_insight{suffix}" for split in splits for suffix in SPLIT_MEASURES]


def split_values(summary: Mapping[str, Any], splits: Sequence[str]) -> list[float]:
    """A summary's values of `split_columns(splits)` (NaN where it has none).

    An offline run summarised before its `measures` held its one evaluation gets them from that evaluation
    (`evaluation_records`: only `env.eval_split`'s set was kept; final = selected = AUC for one evaluation)."""
    measures = summary.get("measures", {})
    if summary.get("config", {}).get("mode") == "sft" and not measures.get("final"):
        measures = eval_measures(evaluation_records(summary))
        measures["selected"] = measures["final"]
    return [
        measures.get(measure, {}).get(f"eval_{split}/pass@1/all", math.nan)
        for split in splits
        for measure in SPLIT_MEASURES.values()
    ]


def splits_table(summaries: Sequence[Mapping[str, Any]], splits: Sequence[str]) -> str:
    """Per arm and evaluation set: no-insight Pass@1 in %, mean ± std over seeds, final / selected on validation / area
    under the curve."""
    lines = [
        "| arm | seeds | " + " | ".join(f"{s}: final / selected / AUC" for s in splits) + " |",
        "|---|---|" + "---|" * len(splits),
    ]
    for arm in arm_order(summaries):
        rows = [split_values(s, splits) for s in summaries if s["arm"] == arm]
        cells = []
        for i in range(len(splits)):
            stats = [_stats([r[3 * i + j] for r in rows]) for j in range(3)]
            cells.append(" / ".join(_pct(*st) for st in stats))
        lines.append(f"| {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_train_pass1(summary: Mapping[str, Any]) -> float:
    """The highest no-insight Pass@1 on the training tasks over a run's evaluations (NaN without any).

    Next to the final value because a run's last evaluation is one draw of a noisy, sometimes collapsing, curve: on
    the quick replication the same seed ended at 0.0, 37.5, 38.8 and 38.1 % under four update layouts that differ
    only in float rounding, and runs that reached 23 % collapsed to 0 by the last phase.
    """
    _, held_in, _ = curve_points(summary, None)
    finite = held_in[np.isfinite(held_in)]
    return float(finite.max()) if finite.size else math.nan


def base_table(base: Mapping[int, Mapping[str, float]]) -> str:
    """The base policy's checks (App. B) per seed, as a markdown table (Pass@k in %; the insight advantage, a
    difference of success rates, in percentage points)."""
    if not base:
        return ""
    keys = list(next(iter(base.values())))
    lines = ["| check | " + " | ".join(f"seed {s}" for s in base) + " |", "|---" * (len(base) + 1) + "|"]
    for k in keys:
        cells = []
        for b in base.values():
            v = b.get(k, math.nan)
            cells.append(
                "n/a" if not math.isfinite(v) else (f"{100 * v:+.1f}" if k == "insight_advantage" else f"{100 * v:.1f}")
            )
        lines.append(f"| {k + (' (points)' if k == 'insight_advantage' else '')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_points(
    summary: Mapping[str, Any], base: Mapping[str, float] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(env steps, held-in Pass@1, held-out Pass@1) of a run's evaluations, the base policy's at step 0 first."""
    steps, held_in, held_out = [], [], []
    if base:
        steps.append(0)
        held_in.append(base["heldin_pass@1"])
        held_out.append(base["heldout_pass@1"])
    for r in read_metrics(summary["workdir"]):
        if r["kind"] == "eval":
            steps.append(r["env_steps"])
            held_in.append(r.get("eval_train/pass@1/all", math.nan))
            held_out.append(r.get("eval/pass@1/all", math.nan))
    return np.asarray(steps, float), np.asarray(held_in, float), np.asarray(held_out, float)


def plot_curves(summaries: Sequence[Mapping[str, Any]], base: Mapping[int, Mapping[str, float]], path: str) -> str:
    """curves.png: no-insight Pass@1 (%) against environment steps, held-in and held-out side by side, one line per
    RL arm (mean over seeds, ±std band; evaluations at the same steps in every seed)."""
    fig = new_figure(11, 4.2)
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    styles = ("-", "--", "-.", ":")
    for i, (arm, label) in enumerate(arm_names(summaries).items()):
        rows = [s for s in summaries if s["arm"] == arm and s["env_steps"] > 0]
        if not rows:
            continue
        points = [curve_points(r, base.get(r["seed"])) for r in rows]
        n = min(len(p[0]) for p in points)
        steps = points[0][0][:n]
        for ax, which in zip(axes, (1, 2), strict=True):
            ys = np.stack([p[which][:n] for p in points]) * 100
            mean, std = ys.mean(0), ys.std(0, ddof=1) if len(ys) > 1 else np.zeros(n)
            (line,) = ax.plot(  # (line styles cycle: arms on the same values stay distinguishable)
                steps, mean, styles[i % len(styles)], marker="o", markersize=3, label=f"{label} (n={len(rows)})"
            )
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    for ax, title in zip(axes, ("training tasks (held-in)", "held-out targets"), strict=True):
        ax.set_xlabel("environment steps")
        ax.set_ylabel("no-insight Pass@1 (%)")
        ax.set_ylim(-2, 100)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return save_figure(fig, path)


def _evals(workdir: str) -> list[dict[str, Any]]:
    """A run's evaluation records (metrics.jsonl)."""
    return [r for r in read_metrics(workdir) if r["kind"] == "eval"]


def evaluation_records(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A run's evaluation records, in order: an RL run's from its metrics.jsonl; an offline run's one evaluation from
    its summary (`final`; in a summary from before it kept every set, only `eval/`, which is `env.eval_split`'s)."""
    if summary.get("env_steps", 0) > 0:
        return _evals(summary["workdir"])
    final = dict(summary.get("final", {}))
    split = summary.get("config", {}).get("env", {}).get("eval_split")
    if split and not any(k.startswith(f"eval_{split}/") for k in final):
        final |= {f"eval_{split}/{k.removeprefix('eval/')}": v for k, v in final.items() if k.startswith("eval/")}
    return [final] if final else []


#: eval_probes.csv's columns: one row per run, measure (the final evaluation, the one selected on validation),
#: evaluation set and probe (the world's `EnvSpec.evaluation_probes`, logged as `eval_<set>/probe/<name>`).
PROBE_COLUMNS = ("arm", "seed", "measure", "set", "probe", "value")


def probe_rows(summaries: Sequence[Mapping[str, Any]], splits: Sequence[str]) -> list[list[Any]]:
    """The evaluation probes of every run on `splits`, at its final evaluation and at the one selected on held-in
    validation (`measures.selected_index`; an offline run's one evaluation is both), as `PROBE_COLUMNS` rows."""
    rows: list[list[Any]] = []
    for s in summaries:
        records = evaluation_records(s)
        if not records:
            continue
        chosen = s.get("measures", {}).get("selected_index") if s.get("env_steps", 0) > 0 else 0
        for measure, i in (("final", len(records) - 1), ("selected", chosen)):
            if i is None or not 0 <= i < len(records):
                continue
            for key, value in sorted(records[i].items()):
                prefix, probe, name = key.partition("/probe/")
                split = prefix.removeprefix("eval_")
                if probe and prefix.startswith("eval_") and split in splits:
                    rows.append([s["arm"], s["seed"], measure, split, name, value])
    return rows


def _probe_order(name: str) -> tuple[int, str]:
    """Per-rule success first, then the fix probe, then its per-item form (forge's names; others after, by name)."""
    for rank, start in enumerate(("rule_", "fix/", "fix_")):
        if name.startswith(start):
            return rank, name
    return 3, name


def probes_table(rows: Sequence[Sequence[Any]], split: str, arms: Sequence[str], measure: str = "selected") -> str:
    """Markdown: one row per probe of `split`, one column per arm: the mean over seeds in % (seeds with a value in
    parentheses when fewer than the arm's), under `measure`."""
    mine = [r for r in rows if r[3] == split and r[2] == measure]
    names = sorted({r[4] for r in mine}, key=_probe_order)
    present = [a for a in arms if any(r[0] == a for r in mine)]
    seeds = {a: len({r[1] for r in mine if r[0] == a}) for a in present}
    lines = [
        "| probe | " + " | ".join(f"{a} ({seeds[a]})" for a in present) + " |",
        "|---|" + "---|" * len(present),
    ]
    for name in names:
        cells = []
        for arm in present:
            values = [r[5] for r in mine if r[0] == arm and r[4] == name and math.isfinite(r[5])]
            mean = f"{100 * sum(values) / len(values):.1f}" if values else "–"
            cells.append(mean if len(values) in (0, seeds[arm]) else f"{mean} ({len(values)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_curves(
    summaries: Sequence[Mapping[str, Any]], split: str, evals: Mapping[str, list[dict[str, Any]]] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per RL arm (offline arms have no environment steps): (env steps [points], no-insight Pass@1 [seeds, points]) on
    the evaluation set `split` (`eval_{split}/pass@1/all` of each evaluation), cut to the evaluations every seed has.
    `evals` (workdir -> its evaluation records) spares reading each run's metrics again for every set."""
    curves = {}
    for arm in arm_order(summaries):
        runs = []
        for s in summaries:
            if s["arm"] == arm and s["env_steps"] > 0:
                records = evals[s["workdir"]] if evals is not None else _evals(s["workdir"])
                runs.append(
                    ([r["env_steps"] for r in records], [r.get(f"eval_{split}/pass@1/all", math.nan) for r in records])
                )
        n = min((len(steps) for steps, _ in runs), default=0)
        if n:
            curves[arm] = (np.asarray(runs[0][0][:n], float), np.asarray([ys[:n] for _, ys in runs], float))
    return curves


def plot_split_curves(summaries: Sequence[Mapping[str, Any]], splits: Sequence[str], path: str) -> str:
    """split_curves.png: no-insight Pass@1 (%) against environment steps, one panel per evaluation set (a world's
    tiers), one line per RL arm: the mean over seeds with its 95 % percentile-bootstrap band (whole seeds resampled,
    `stats.bootstrap_band`; no band for one seed)."""
    fig = new_figure(4.2 * len(splits), 4.2)
    styles = ("-", "--", "-.", ":")
    evals = {s["workdir"]: _evals(s["workdir"]) for s in summaries if s["env_steps"] > 0}  # (read once)
    for j, split in enumerate(splits):
        ax = fig.add_subplot(1, len(splits), j + 1)
        for i, (arm, (steps, ys)) in enumerate(split_curves(summaries, split, evals).items()):
            ys = ys * 100
            (line,) = ax.plot(steps, ys.mean(0), styles[i % len(styles)], label=f"{arm} (n={len(ys)})")
            low, high = bootstrap_band(ys)
            if np.isfinite(low).any():
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xlabel("environment steps")
        ax.set_ylim(-2, 100)
        ax.set_title(split)
        ax.grid(alpha=0.3)
        if j == 0:
            ax.set_ylabel("no-insight Pass@1 (%), mean and 95 % CI over seeds")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    return save_figure(fig, path)


def write_results(
    summaries: Sequence[Mapping[str, Any]],
    base: Mapping[int, Mapping[str, float]],
    out: str,
    *,
    title: str = "",
    notes: str = "",
    analysis: Analysis | None = None,
) -> list[str]:
    """results.csv, results.md and curves.png in `out` (and split_curves.png when the runs measured evaluation sets,
    eval_probes.csv when their world probes its evaluations); returns their paths. `analysis` (a grid's pre-registered
    analysis: the results as arm -> seed -> column -> value, and the base checks -> a markdown section) adds its
    section to results.md."""
    summaries = [{**s, "train_pass1_no_insight_best": best_train_pass1(s)} for s in summaries]
    splits = split_names_of(summaries)  # (none for round one's world: its columns stay as they were)
    columns = [*COLUMNS, *split_columns(splits)]
    rows = [
        [os.path.relpath(s[c], out) if c == "workdir" else s[c] for c in COLUMNS] + split_values(s, splits)
        for s in summaries
    ]  # (workdir relative to out)
    os.makedirs(out, exist_ok=True)
    paths = [replaced(os.path.join(out, "results.csv"), lambda p: write_csv(p, columns, rows))]
    md = [
        f"# {title or 'Small-scale replication'}",
        "",
        results_table(summaries, base),
        "",
        table_legend(summaries),
        "",
    ]
    if splits:
        md += [
            "## Evaluation sets: no-insight Pass@1 (%)",
            "",
            splits_table(summaries, splits),
            "",
            "Curves per set: split_curves.png (mean over seeds, 95 % percentile-bootstrap band).",
            "",
        ]
    if base:
        md += ["## Base policy before RL (App. B): checks per seed", "", base_table(base), ""]
    if analysis is not None:
        table: dict[str, dict[int, dict[str, float]]] = {}
        for row in rows:
            values = dict(zip(columns, row, strict=True))
            numbers = {k: v for k, v in values.items() if isinstance(v, int | float) and k not in ("arm", "seed")}
            table.setdefault(values["arm"], {})[int(values["seed"])] = numbers
        md += [analysis(table, base), ""]
    probes = probe_rows(summaries, splits)
    if probes:
        paths.append(replaced(os.path.join(out, "eval_probes.csv"), lambda p: write_csv(p, PROBE_COLUMNS, probes)))
        md += [
            "## Evaluation probes (%): at the evaluation selected on validation, mean over seeds",
            "",
            "What the world measures of each no-insight evaluation attempt (its `evaluation_probes`; in `forge`:",
            "`rule_<kind>/pass@1`, success on the tasks that gather an item of that kind; `fix/<class>`, the share of",
            "gated gathers reached holding the right tool, a wrong one, every tool or none; `fix_<item>/<class>`, the",
            "same for the first gather of a held-out gated item). Per seed, and at the final evaluation too:",
            "eval_probes.csv. In parentheses: the runs (or, in a cell, the seeds) that have a value.",
            "",
        ]
        arms = arm_order(summaries)
        for split in splits:
            if any(r[3] == split for r in probes):
                md += [f"### {split}", "", probes_table(probes, split, arms), ""]
    if notes:
        md += [notes, ""]

    def write_md(p: str) -> None:
        with open(p, "w", encoding="utf-8") as f:
            f.write("\n".join(md))

    paths.append(replaced(os.path.join(out, "results.md"), write_md))
    paths.append(replaced(os.path.join(out, "curves.png"), lambda p: plot_curves(summaries, base, p)))
    if splits:
        paths.append(replaced(os.path.join(out, "split_curves.png"), lambda p: plot_split_curves(summaries, splits, p)))
    return paths
