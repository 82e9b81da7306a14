"""The second replication round's pre-registered analysis on a hand-made table: every decision rule, with numbers
computed by hand (paired TOST at 2 degrees of freedom has a closed-form t distribution)."""

import math

import pytest

from rltldr_jax.replication.preregistered import (
    analyse,
    analysis_markdown,
    arm_table,
    beside,
    column,
    missing_runs,
    read_results,
    seed_list,
)
from rltldr_jax.replication.stats import mean_bootstrap, paired_tost


def _t2_cdf(t: float) -> float:
    """Student's t CDF at 2 degrees of freedom: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_paired_tost_by_hand():
    a, b = {0: 0.3, 1: 0.4, 2: 0.5, 9: 0.7}, {0: 0.3, 1: 0.35, 2: 0.5}  # seed 9: unpaired, left out
    t = paired_tost(a, b, margin=0.1)  # d = 0, .05, 0: mean 1/60, sd .05/sqrt(3), se 1/60
    assert t.diff == pytest.approx(1 / 60)
    assert t.p_lower == pytest.approx(1 - _t2_cdf(7.0)) and t.p_upper == pytest.approx(_t2_cdf(-5.0))
    assert t.p == pytest.approx(0.018875, abs=1e-6)
    assert math.isnan(paired_tost({0: 0.1}, {0: 0.1}, margin=0.1).p)  # one pair: no test
    assert paired_tost({0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}, margin=0.1).p == 0  # no variance, inside: equivalent
    assert paired_tost({0: 0.2, 1: 0.2}, {0: 0.0, 1: 0.0}, margin=0.1).p == 1  # no variance, outside
    with pytest.raises(ValueError, match="margin"):
        paired_tost(a, b, margin=0)


def test_mean_bootstrap_brackets_the_mean():
    m = mean_bootstrap([0.1, 0.2, 0.3, math.nan])
    assert m.diff == pytest.approx(0.2) and 0.1 <= m.low < 0.2 < m.high <= 0.3 and m.n == 3 and not m.paired


def _table():
    def rows(arm_values):
        return {seed: values for seed, values in enumerate(arm_values)}

    sel = lambda tier: column(tier, "selected")  # noqa: E731
    fin = lambda tier: column(tier, "final")  # noqa: E731
    return {
        "rltldr": rows(
            {sel("tier2"): v2, sel("tier3"): 0.2, sel("tier1"): v1, sel("tier4"): v4, fin("tier2"): 0.1}
            for v2, v1, v4 in ((0.3, 0.3, 0.0), (0.4, 0.4, 0.0), (0.5, 0.5, 0.01))
        ),
        "strict_control": rows({sel("tier2"): v, sel("tier3"): 0.2, fin("tier2"): 0.1} for v in (0.1, 0.1, 0.2)),
        "lambda_0": rows({sel("tier1"): v} for v in (0.3, 0.35, 0.5)),
        "grpo": rows({sel("tier1"): 0.0, fin("tier1"): 0.0} for _ in range(3)),
        "grpo_hot": rows({sel("tier1"): v, fin("tier1"): 0.0} for v in (0.0, 0.0125, 0.0)),
    }


def test_every_decision_rule_on_a_hand_made_table():
    numbers = {n.what: n for n in analyse(_table(), {0: {"iid_pass@64": 0.0}, 1: {"iid_pass@64": 0.0}})}
    p2 = numbers["tier2 selected: rltldr − strict_control"]
    assert (
        p2.interval.diff == pytest.approx(0.8 / 3)
        and p2.interval.low == pytest.approx(0.2)
        and p2.decision == "reproduced"
    )
    p3 = numbers["tier3 selected: rltldr − strict_control"]
    assert p3.interval.diff == 0 and p3.decision == "not reproduced"
    lam = numbers["tier1 selected: rltldr (λ=0.5) − lambda_0"]
    assert lam.interval.diff == pytest.approx(1 / 60) and lam.interval.low == 0  # not superior: a 0 difference
    assert lam.p == pytest.approx(0.018875, abs=1e-6) and lam.decision == "equivalent within ±10 points"
    assert numbers["grpo: max over seeds of tier1 final/selected (expected 0)"].decision == "holds"
    assert numbers["grpo_k64: max over seeds of tier1 final/selected (expected 0)"].decision == "no data"
    hot = numbers["grpo_hot: max over seeds of tier1 final/selected (expected 0)"]
    assert hot.value == 0.0125 and hot.decision == "fails"
    tier4 = numbers["rltldr tier4 selected (upper end expected < 5 points)"]
    assert tier4.interval.diff == pytest.approx(0.01 / 3) and tier4.decision == "holds"
    iid = numbers["base i.i.d. Pass@64 on the hard training tasks, max over seeds (expected 0)"]
    assert iid.decision == "holds" and iid.n == 2
    assert numbers["tier2 final: rltldr − strict_control"].interval.diff == 0
    assert math.isnan(numbers["tier2 selected: rltldr − shuffled_control"].interval.diff)  # no such arm: NaN
    assert numbers["tier1 selected: rltldr − grpo"].interval.diff == pytest.approx(0.4)  # (round one's held-in gain)
    assert math.isnan(numbers["tier1 selected: rltldr − strict_control"].interval.diff)  # (no tier-1 control values)
    text = analysis_markdown(list(numbers.values()))
    assert "| primary | tier2 selected: rltldr − strict_control | +26.7 |" in text and "TOST p = 0.019" in text
    assert "| sanity | grpo_hot: max over seeds of tier1 final/selected (expected 0) | 1.2 | – | 3 | fails |" in text
    assert "| rltldr | 3 | – | 40.0 [30.0, 50.0] | 40.0 [" in arm_table(_table(), ["rltldr", "nope"])


def test_results_csv_round_trip(tmp_path):
    from rltldr_jax.replication.report import write_csv

    path = str(tmp_path / "results.csv")
    write_csv(path, ["arm", "seed", column("tier2", "selected"), "workdir"], [["rltldr", 3, 0.25, "runs/x"]])
    assert read_results(path) == {"rltldr": {3: {column("tier2", "selected"): 0.25}}}


def test_an_added_arm_is_reported_beside_its_reference_outside_the_preregistered_analysis():
    from rltldr_jax.config import replicate_v2 as v2

    table = dict(_table())
    sel = column("tier2", "selected")
    table["rltldr_lora"] = {0: {sel: 0.2}, 1: {sel: 0.5}, 2: {sel: 0.4}, 7: {sel: 0.9}}  # seed 7: no rltldr to pair
    numbers = {n.what: n for n in beside(table, "rltldr_lora", "rltldr")}
    diff = numbers["tier2 selected: rltldr_lora − rltldr"]
    assert diff.interval.diff == pytest.approx((-0.1 + 0.1 - 0.1) / 3) and diff.interval.n == 3
    assert diff.role == "not pre-registered" and diff.decision == ""
    assert math.isnan(numbers["valid selected: rltldr_lora − rltldr"].interval.diff)  # no values: NaN, not 0
    text = v2.analysis(table, None)
    pre_registered, added = text.split("## Not pre-registered: rltldr_lora beside rltldr")
    assert "rltldr_lora" not in pre_registered  # (the pre-registered tables hold only pre-registered arms)
    assert "| not pre-registered | tier2 selected: rltldr_lora − rltldr | -3.3 |" in added
    assert "| rltldr_lora | 4 | – | – | 50.0 [" in added
    assert "rltldr_lora" not in v2.analysis(_table(), None)  # (no section without the arm's runs)


def test_seed_lists_are_short():
    assert seed_list([8, 0, 1, 2, 5, 7]) == "0–2, 5, 7–8" and seed_list([3]) == "3" and seed_list([]) == ""


def test_only_the_preregistered_seeds_count_and_a_short_number_says_which_are_missing():
    """With the arms' pre-registered seeds: an extra seed is left out, a missing one named in every decision that
    lacks it, and the base check skips a NaN wherever it sits (counting it missing) instead of failing or hiding it."""
    table = {arm: dict(rows) for arm, rows in _table().items()}
    sel2 = column("tier2", "selected")
    table["rltldr"][9] = {sel2: 0.9}  # not pre-registered: must not count
    seeds = {"rltldr": (0, 1, 2), "strict_control": (0, 1, 2, 3), "lambda_0": (0, 1, 2), "grpo": (0, 1, 2, 3)}
    for base in (
        {0: {"iid_pass@64": 0.0}, 3: {"iid_pass@64": math.nan}},
        {3: {"iid_pass@64": math.nan}, 0: {"iid_pass@64": 0.0}},
    ):
        numbers = {n.what: n for n in analyse(table, base, seeds)}
        p2 = numbers["tier2 selected: rltldr − strict_control"]
        assert p2.interval.diff == pytest.approx(0.8 / 3) and p2.interval.n == 3  # (seed 9 left out)
        assert p2.decision == "reproduced; missing seeds: strict_control 3"
        assert numbers["tier1 selected: rltldr (λ=0.5) − lambda_0"].decision == "equivalent within ±10 points"
        grpo = numbers["grpo: max over seeds of tier1 final/selected (expected 0)"]
        assert grpo.n == 3 and grpo.decision == "holds; missing seeds: grpo 3"
        iid = numbers["base i.i.d. Pass@64 on the hard training tasks, max over seeds (expected 0)"]
        assert iid.value == 0 and iid.n == 1 and iid.decision == "holds; missing seeds: base 1–3"
    assert missing_runs(table, seeds) == "strict_control 3; grpo 3" and missing_runs(table, {"rltldr": (0, 9)}) == ""
