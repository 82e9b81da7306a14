"""What a person reads: the per-phase and evaluation lines, metrics.jsonl, and the end-of-run summary."""

from __future__ import annotations

import json
import math

from rltldr_jax.train.report import MetricsLog, eval_line, phase_line, run_summary

NAN, INF = float("nan"), float("inf")
PHASE = {
    "rollout/pass@1/no_insight": 0.125,
    "rollout/pass@1/insight": NAN,
    "rollout/counts/env_steps": 412.0,
    "insight/written": 6.0,
    "update/sft_nll": 4.2104,
    "update/loss": INF,
    "update/optimizer_steps": 4.0,
    "update/skipped_nonfinite": 0.0,
    "time/collect_s": 12.34,
    "time/update_s": 4.51,
}


def test_phase_line_is_short_and_shows_nonfinite_values():
    assert phase_line(3, 1234, PHASE) == (
        "phase 3: 1,234 env steps (+412) | pass@1 0.125 no insight, nan with | 6 insights | sft nll 4.210 | loss inf "
        "| 12.3 s collect, 4.5 s update"
    )
    skipped = phase_line(3, 1234, PHASE | {"update/skipped_nonfinite": 2.0, "update/loss": -INF})
    assert "loss -inf" in skipped and "2 steps SKIPPED (non-finite loss or gradient)" in skipped
    assert "no update (no examples)" in phase_line(1, 10, PHASE | {"update/optimizer_steps": 0.0})
    assert "sft nll nan" in phase_line(1, 10, {"update/optimizer_steps": 1.0})  # a missing metric is shown, not dropped


def test_eval_line():
    metrics = {"eval/pass@1/all": 0.125, "eval/pass@2/all": 0.25, "eval/counts/tasks": 4.0}
    assert eval_line(3, metrics, attempts_per_task=2, seconds=12.34) == (
        "eval after phase 3: pass@1 0.125, pass@2 0.250 (4 tasks × 2 attempts, 12.3 s)"
    )


def test_metrics_jsonl_records_every_metric_and_drops_redone_phases(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    log = MetricsLog(path, keep_through_phase=0)
    log.write("phase", 1, 412, PHASE)
    log.write("phase", 2, 800, PHASE)
    log.write("eval", 2, 800, {"eval/pass@1/all": 0.5})
    with open(path, "a") as f:
        f.write('{"kind": "phase", "phase": 3, "env_st')  # a line cut short by a kill
    records = [json.loads(line) for line in open(path).read().splitlines()[:3]]
    assert [(r["kind"], r["phase"], r["env_steps"]) for r in records] == [
        ("phase", 1, 412),
        ("phase", 2, 800),
        ("eval", 2, 800),
    ]
    assert set(PHASE) <= set(records[0])
    assert records[0]["rollout/pass@1/insight"] is None and records[0]["update/loss"] is None  # NaN/inf: JSON null
    assert records[0]["rollout/pass@1/no_insight"] == 0.125
    assert not any(isinstance(v, float) and math.isnan(v) for v in records[0].values())
    MetricsLog(path, keep_through_phase=1)  # resumed from checkpoint 1: phase 2 and its evaluation are redone
    assert [json.loads(line)["phase"] for line in open(path)] == [1]


def test_run_summary_names_the_outputs_and_next_commands():
    text = run_summary(
        "/runs/sapi tiny", launch_dir="launch", config_args=["--config=configs/sapi.py:tiny", "--config.seed=1"]
    )
    assert "outputs in /runs/sapi tiny:" in text and "/runs/sapi tiny/metrics.jsonl" in text
    assert "tensorboard --logdir '/runs/sapi tiny/tb'" in text
    assert (
        "python launch/eval.py --config=configs/sapi.py:tiny --config.seed=1 '--checkpoint=/runs/sapi tiny/checkpoints'"
        in text
    )
    assert "python launch/analyze_rollouts.py '--run=/runs/sapi tiny'" in text
    assert "rollouts" not in run_summary("/r", launch_dir="launch", config_args=[], rollouts=False)
    # From the console script rltldr-train: the console scripts' names.
    text = run_summary("/r", launch_dir=None, config_args=["--config=configs/sapi.py:tiny"])
    assert "  rltldr-eval --config=configs/sapi.py:tiny --checkpoint=/r/checkpoints" in text
    assert "  rltldr-analyze-rollouts --run=/r" in text
