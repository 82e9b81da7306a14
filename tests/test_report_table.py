"""results.md's main table: one row per distinct set of runs, a legend of its columns, consistent units."""

from __future__ import annotations

from rltldr_jax.replication.report import arm_names, base_table, results_table, table_legend


def _summary(arm: str, seed: int, workdir: str, train: float, lam: float = 0.03) -> dict:
    return {
        "arm": arm,
        "seed": seed,
        "workdir": workdir,
        "lam": lam,
        "train_pass1_no_insight": train,
        "heldout_pass1_no_insight": 0.0,
        "train_pass1_insight": 0.5,
        "train_pass1_no_insight_best": train,
        "env_steps": 100,
        "walltime_s": 60.0,
    }


def test_an_arm_that_is_another_arms_runs_is_one_row_named_after_both():
    summaries = [
        _summary("grpo", 0, "runs/grpo-s0", 0.0, lam=0.0),
        _summary("rltldr", 0, "runs/rltldr-s0", 0.25),
        _summary("rltldr", 1, "runs/rltldr-s1", 0.75),
        _summary("lambda_0.03", 0, "runs/rltldr-s0", 0.25),
        _summary("lambda_0.03", 1, "runs/rltldr-s1", 0.75),
        _summary("lambda_0", 0, "runs/lambda_0-s0", 0.5, lam=0.0),
    ]
    assert arm_names(summaries) == {"grpo": "grpo", "rltldr": "rltldr (= lambda_0.03)", "lambda_0": "lambda_0"}
    table = results_table(summaries, {})
    rows = [line for line in table.splitlines()[2:]]
    assert [r.split(" | ")[0] for r in rows] == ["| grpo", "| rltldr (= lambda_0.03)", "| lambda_0"]
    assert "| rltldr (= lambda_0.03) | 2 | 50.0 ± 35.4 |" in table  # (25 and 75 %: sample std 35.4)
    legend = table_legend(summaries)
    assert "in %" in legend and "Here `rltldr` trains with λ = 0.03 (the paper's λ is 0.5)." in legend
    assert table_legend([_summary("rltldr", 0, "w", 0.1, lam=0.5)]).endswith("Here `rltldr` trains with λ = 0.5.")


def test_base_checks_keep_one_unit_per_kind():
    table = base_table({0: {"iid_pass@64": 0.0, "sequential_pass@8": 0.604, "insight_advantage": 0.256}})
    assert "| sequential_pass@8 | 60.4 |" in table and "| insight_advantage (points) | +25.6 |" in table


def test_the_row_is_named_after_the_arm_whose_runs_they_are_whatever_the_order():
    first = [_summary("lambda_0.03", 0, "out/runs/rltldr-s0", 0.2), _summary("rltldr", 0, "out/runs/rltldr-s0", 0.2)]
    assert arm_names(first) == {"rltldr": "rltldr (= lambda_0.03)"}
    assert arm_names(first[::-1]) == {"rltldr": "rltldr (= lambda_0.03)"}
