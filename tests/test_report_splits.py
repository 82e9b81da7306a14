"""results.csv / results.md with evaluation sets (eval.splits: a world's tiers): one column per set and measure;
round one's runs (no sets) keep their columns."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest

from rltldr_jax.replication.report import COLUMNS, split_columns, split_curves, split_names_of, write_results


def _summary(arm: str, seed: int, tier2: float, workdir: str, *, tiers: bool = True) -> dict:
    measures = {"final": {}, "selected": {}, "auc": {}, "selected_index": None}
    if tiers:
        measures = {
            "final": {"eval/pass@1/all": 0.0, "eval_valid/pass@1/all": 0.5, "eval_tier2/pass@1/all": tier2},
            "selected": {"eval/pass@1/all": 0.1, "eval_valid/pass@1/all": 0.6, "eval_tier2/pass@1/all": tier2 + 0.1},
            "auc": {"eval/pass@1/all": 0.05, "eval_valid/pass@1/all": 0.4, "eval_tier2/pass@1/all": tier2 / 2},
            "selected_index": 1,
        }
    return {
        "arm": arm,
        "seed": seed,
        "workdir": workdir,
        "lam": 0.5,
        "train_pass1_no_insight": 0.0,
        "heldout_pass1_no_insight": 0.0,
        "train_pass1_insight": math.nan,
        "env_steps": 64,
        "walltime_s": 60.0,
        "measures": measures,
    }


def test_split_columns_per_set_and_measure(tmp_path):
    out = str(tmp_path)
    summaries = [_summary("rltldr", s, t, os.path.join(out, "runs", f"r{s}")) for s, t in ((0, 0.2), (1, 0.4))]
    assert split_names_of(summaries) == ["valid", "tier2"]
    assert split_columns(["tier2"]) == [
        "tier2_pass1_no_insight",
        "tier2_pass1_no_insight_selected",
        "tier2_pass1_no_insight_auc",
    ]
    write_results(summaries, {}, out)
    with open(os.path.join(out, "results.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[: len(COLUMNS)] == list(COLUMNS)  # round one's columns first, unchanged
    assert [float(r["tier2_pass1_no_insight"]) for r in rows] == [0.2, 0.4]
    assert [float(r["tier2_pass1_no_insight_selected"]) for r in rows] == pytest.approx([0.3, 0.5])
    assert [float(r["valid_pass1_no_insight_auc"]) for r in rows] == [0.4, 0.4]
    md = open(os.path.join(out, "results.md"), encoding="utf-8").read()
    # tier 2 of rltldr over 2 seeds: final 30.0 ± 14.1, selected 40.0 ± 14.1, AUC 15.0 ± 7.1
    assert "| rltldr | 2 | 50.0 ± 0.0 / 60.0 ± 0.0 / 40.0 ± 0.0 | 30.0 ± 14.1 / 40.0 ± 14.1 / 15.0 ± 7.1 |" in md


def test_round_one_runs_keep_their_columns(tmp_path):
    out = str(tmp_path)
    write_results([_summary("grpo", 0, 0.0, os.path.join(out, "g"), tiers=False)], {}, out)
    with open(os.path.join(out, "results.csv"), encoding="utf-8") as f:
        assert next(csv.reader(f)) == list(COLUMNS)
    assert "Evaluation sets" not in open(os.path.join(out, "results.md"), encoding="utf-8").read()


def test_the_checks_line_shows_each_evaluation_set():
    from rltldr_jax.replication.driver import checks_line

    checks = {
        "iid_pass@1": 0.0,
        "iid_pass@64": 0.0,
        "sequential_pass@8": 0.7,
        "sequential_pass@1_insight": 0.25,
        "heldin_pass@1": 0.0,
        "heldout_pass@1": 0.0,
        "tier3_pass@1": 0.125,
        "easy_pass@1": 0.9,
    }
    line = checks_line(checks)
    assert "held-in 0.0 %, held-out 0.0 %, tier3 12.5 %, public-rule tasks 90.0 %" in line, line
    del checks["tier3_pass@1"]
    assert "held-out 0.0 %, public-rule tasks 90.0 %" in checks_line(checks)  # round one's line, unchanged


def test_split_curves_per_set_with_every_seed_cut_to_the_evaluations_all_have(tmp_path):
    """split_curves.png's data: per RL arm, the evaluations' env steps and each seed's Pass@1 on one set, cut to the
    evaluations every seed has (a seed stopped early has fewer); offline arms (no env steps) have no curve."""
    out = str(tmp_path)

    def run(arm, seed, tier2, env_steps=64):
        workdir = os.path.join(out, "runs", f"{arm}-s{seed}")
        os.makedirs(workdir)
        with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
            for i, value in enumerate(tier2):
                f.write(json.dumps({"kind": "phase", "env_steps": 32 * i + 16}) + "\n")
                f.write(json.dumps({"kind": "eval", "env_steps": 32 * i, "eval_tier2/pass@1/all": value}) + "\n")
        return {**_summary(arm, seed, tier2[-1], workdir), "env_steps": env_steps}

    summaries = [run("rltldr", 0, [0.0, 0.25, 0.5]), run("rltldr", 1, [0.0, 0.5]), run("sftldr", 0, [0.1], 0)]
    curves = split_curves(summaries, "tier2")
    assert list(curves) == ["rltldr"]
    steps, ys = curves["rltldr"]
    assert steps.tolist() == [0.0, 32.0] and ys.tolist() == [[0.0, 0.25], [0.0, 0.5]]
    assert all(math.isnan(v) for v in split_curves(summaries, "tier3")["rltldr"][1].ravel())  # (not measured)
    paths = write_results(summaries, {}, out)
    assert os.path.basename(paths[-1]) == "split_curves.png" and os.path.getsize(paths[-1]) > 0
