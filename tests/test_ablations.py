"""One tiny phase of every baseline and ablation of configs/ablations.py, checking that the loss terms that must be
on are on and those that must be off are off (issue: "no SFT gradient when λ = 0; no insight in any context under
GRPO; the RLTF-FM term only on writer-context tokens"), and the offline SFT rows of Table 2 on saved rollouts.

Every RL entry with a code path of its own (SAME_CODE_PATH_AS lists those that differ from another only in the size of
a number) runs `Trainer.run_phase()` on the tiny preset (1 task, 2 attempts of 1 step, tiny budgets; the filters are
off so that the all-failure group of a random policy still reaches every loss term), then checks:
- the step's loss is exactly grpo_coef·L_GRPO + λ·L_SFT + writer_sft_coef·L_writer with the entry's coefficients (one
  optimizer step per phase), so a term whose weight is 0 contributes nothing;
- what reached each term: insight tokens only when insights are in context (or in insights-only examples for
  off-policy), writer tokens only with a writer-SFT weight, detached (ratio-free) examples only for RLTF-SD;
- what was written and inserted: none under GRPO, SGE summaries of every attempt, each content variant's format.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from helpers import tiny_config, tiny_run_config

from rltldr_jax.config import ablations, base
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained
from rltldr_jax.train.loop import Trainer

RL = [name for name, a in ablations.ABLATIONS.items() if a.overrides.get("mode") != "sft"]
SFT = [name for name, a in ablations.ABLATIONS.items() if a.overrides.get("mode") == "sft"]
# One entry per code path runs by default (~15 s each on 2 cores; the defaults, `rltldr`, also run in
# test_train_loop.py, and `grpo`'s path, insight.schedule=never, in the replication's smoke grid,
# tests/test_replication.py); the other entries with a code path of their own run with `pytest -m slow` (~25 CPU
# s each): these differ from the default ones in coefficients, thresholds, content and generator.
DEFAULT = {"sge", "rltf_sd", "off_policy", "rltldr_rltf_fm", "sft_rollouts_100", "sftldr_dedup"}
# Entries that differ from another entry, on the tiny preset, only in the size of a number (a coefficient, a threshold,
# a cap on the insights kept, a rollout count), never in whether it is 0: they run that entry's code on other numbers,
# so their own phase would check nothing new (in one tiny phase of 2 attempts, at most one insight exists and a random
# policy's success rate is below every threshold). test_entries_that_share_a_code_path_differ_only_in_numbers checks
# that each still does; an entry not listed here runs its own phase.
SAME_CODE_PATH_AS = {
    "lambda_0.01": "rltldr",
    **{f"insights_{n}": "rltldr" for n in (1, 2, 4, 8, 16)},
    **{f"fig4_ratio_{r}": "rltldr" for r in ("0.5", "1", "2", "5", "10", "100")},
    "fig4_ratio_0": "no_grpo",
    **{f"threshold_{t}_lambda_0.1": "rltldr" for t in ("0.1", "0.33", "0.5")},
    "generator_nonthinking": "rltldr",  # the tiny preset's insights are written without thinking already
    "teacher_nonthinking_nfb1": "teacher_nonthinking",
    "teacher_thinking_nfb1": "teacher_thinking",
    "sft_rollouts_1k": "sft_rollouts_100",
}


def _params(names):
    return [
        pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in names if n not in SAME_CODE_PATH_AS
    ]


def _code_path(name: str) -> tuple:
    """Every key that some entry overrides, at entry `name`'s value on the tiny preset, with each number (not a
    bool) replaced by whether it is 0: two entries with one code path run the same code on different numbers."""
    config = ablations.apply(tiny_config(validate=False), name)
    keys = sorted({key for a in ablations.ABLATIONS.values() for key in a.overrides})
    path = []
    for key in keys:
        value = config
        for part in key.split("."):
            value = value[part]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        path.append((key, ("zero" if value == 0 else "nonzero") if number else value))
    return tuple(path)


def test_entries_that_share_a_code_path_differ_only_in_numbers():
    """Each entry of SAME_CODE_PATH_AS has the code path of the entry that runs for it (which itself runs), and every
    entry that runs has a code path of its own: a new entry, or a change that gives a listed one a path of its own
    (a new key, a 0), fails here until it runs its own phase."""
    running = [name for name in ablations.ABLATIONS if name not in SAME_CODE_PATH_AS]
    for name, twin in SAME_CODE_PATH_AS.items():
        assert twin in running, (name, twin)
        assert _code_path(name) == _code_path(twin), f"{name} no longer shares {twin}'s code path: let it run"
    paths = [_code_path(name) for name in running]
    assert len(set(paths)) == len(paths), "two running entries share a code path: list one in SAME_CODE_PATH_AS"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny random 2-layer Qwen 3.5 as the "teacher" of the Table 3 generator rows (its own embedded engine)."""
    path = tmp_path_factory.mktemp("teacher") / "hf"
    save_pretrained(
        ModelSpec(dataclasses.replace(get_preset("tiny"), num_hidden_layers=2, layer_types=())).build(seed=3), path
    )
    return str(path)


def _config(name: str, workdir: str, request: pytest.FixtureRequest):
    # The shared tiny run (tests/helpers.py), with 1 action of a few tokens per attempt: at most 2 step examples
    # and 1 insights-only example, so one optimizer step per phase.
    c = tiny_run_config(
        workdir,
        1,
        {
            "train.checkpoint_every": 1000,
            "rollout.max_steps": 1,
            "rollout.max_think_tokens": 2,
            "rollout.max_action_tokens": 4,
            "insight.max_think_tokens": 2,
            "insight.max_action_tokens": 4,
        },
    )
    teacher = ablations.ABLATIONS[name].overrides.get("insight.source") == "teacher"  # the teacher is built only then
    extra = {"insight.teacher.checkpoint": request.getfixturevalue("teacher_dir")} if teacher else {}
    return ablations.resolve(c, name, extra)


def _phase(name: str, tmp_path, request: pytest.FixtureRequest):
    config = _config(name, str(tmp_path / name), request)
    trainer = Trainer(config)
    try:
        metrics = trainer.run_phase()
    finally:
        trainer.close()
    lines = open(os.path.join(str(tmp_path / name), "rollouts", "phase_00000.jsonl")).read().splitlines()
    return config, metrics, [json.loads(x) for x in lines]


@pytest.mark.parametrize("name", _params(RL))
def test_one_tiny_phase_of_every_rl_entry(name, tmp_path, request):
    config, m, rollouts = _phase(name, tmp_path, request)
    c = config.loss
    conditioned = [r for r in rollouts if r["insights"]]
    assert m["update/optimizer_steps"] == 1 and m["rollout/counts/attempts"] == 2
    # The step's loss uses exactly the entry's coefficients: a zero weight means no gradient from that term.
    expected = (
        c.grpo_coef * m["update/grpo_loss"]
        + c.lam * m["update/sft_nll"]
        + c.writer_sft_coef * m["update/writer_sft_nll"]
    )
    np.testing.assert_allclose(m["update/loss"], expected, rtol=1e-5, atol=1e-6)
    assert m["update/grpo_tokens"] > 0  # the (zero-advantage) actions reach the GRPO term

    if config.insight.schedule == "never":  # GRPO: nothing written, no insight in any context, no SFT target
        assert m["insight/written"] == 0 and not conditioned and m["update/sft_tokens"] == 0
    elif config.insight.source == "teacher":  # the random teacher's reply is no JSON: counted, nothing inserted
        assert m["insight/parse_failures"] >= 1 and m["insight/written"] == 0 and not conditioned
    else:  # a random policy fails attempt 1: attempt 2 sees its insight (every schedule allows it here)
        assert [len(r["insights"]) for r in rollouts] == [0, 1]
    if c.insight_rollouts == "in_context":
        assert (m["update/sft_tokens"] > 0) == bool(conditioned) and m["update/detached_examples"] == 0
    elif c.insight_rollouts == "off_policy":  # insights removed from the 2 step examples; 1 insights-only example
        assert m["filter/examples"] == 2 + len(conditioned) and m["update/sft_tokens"] > 0
    else:  # self_distill: the conditioned attempt trains without ratio, without insight in context
        assert m["update/detached_examples"] == len(conditioned) == 1 and m["update/sft_tokens"] == 0
    if c.writer_sft_coef > 0 and c.writer_sft_filter == "all":  # RLTF-FM: the insight in the writer's context
        assert m["filter/writer_examples"] == m["insight/written"] > 0 and m["update/writer_sft_tokens"] > 0
    else:  # off, or self-play (only after a next success; a random policy never succeeds)
        assert m["filter/writer_examples"] == 0 and m["update/writer_sft_tokens"] == 0

    written = [i["text"] for r in conditioned for i in r["insights"]]
    content = config.insight.content
    if content == "strategy":  # SGE: summaries of every attempt (successes too), under the SGE prompt
        assert config.insight.after == "any" and all(t.startswith("Attempt 1 took 1 step") for t in written)
    elif content == "feedback":
        assert all(t.startswith(("The verifier found", "Make sure")) for t in written)
    elif content.startswith("summary_feedback"):
        assert all(t.startswith("Attempt 1 took") and "\n\n" in t for t in written)
    elif config.insight.source == "rule":
        assert all(t.startswith("Make sure") for t in written)
    assert all(len(r["insights"]) <= config.insight.max_insights for r in rollouts)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, builder):
    """A saved phase as an RLTL;DR run writes it (save_phase): task A solved at attempt 2 after an insight, task B
    failed twice, its second attempt with an insight."""
    from rltldr_jax.agent.collector import PhaseResult
    from rltldr_jax.agent.episode import Attempt, StepRecord
    from rltldr_jax.agent.rollout_files import save_phase
    from rltldr_jax.envs import Task, Verdict
    from rltldr_jax.tokenization import Insight

    tok = builder.tokenizer

    def step(action: str) -> StepRecord:
        ids = (
            *tok.encode("Plan."),
            tok.think_end_id,
            *tok.encode("\n\n"),
            *tok.encode(f"```python\n{action}\n```"),
            tok.im_end_id,
        )
        return StepRecord(ids, (False,) * len(ids), tuple([-0.5] * len(ids)), action, "ok", 0)

    a, b = Task("sapi/a", "Do A.", "sapi", "train"), Task("sapi/b", "Do B.", "sapi", "train")
    hint_a, hint_b = Insight("Remember to paginate.", 1), Insight("Save the setting.", 1)
    attempts = (
        Attempt(a, 1, (), (step("x = 1"),), "completed", Verdict(False, "r", 0, 1)),
        Attempt(a, 2, (hint_a,), (step("x = 2"), step("y = 3")), "completed", Verdict(True, "", 1, 1)),
        Attempt(b, 1, (), (step("z = 1"),), "completed", Verdict(False, "r", 0, 1)),
        Attempt(b, 2, (hint_b,), (step("z = 2"),), "completed", Verdict(False, "r", 0, 1)),
        Attempt(b, 3, (hint_b,), (step("z = 3"),), "completed", Verdict(False, "r", 0, 1)),
    )
    run = tmp_path_factory.mktemp("rltldr_run")
    save_phase(run / "rollouts" / "phase_00000.jsonl", 0, PhaseResult(attempts, ()))
    return str(run), tok, (hint_a, hint_b)


@pytest.mark.parametrize("name", _params(SFT))
def test_offline_sft_entries(name, saved_run, tmp_path):
    from rltldr_jax.train.sft import run_sft

    run, tok, (hint_a, hint_b) = saved_run
    c = tiny_config(
        {
            "workdir": str(tmp_path / name),
            "sft.epochs": 1,
            "eval.num_tasks": 1,
            "eval.attempts_per_task": 1,
            "rollout.max_steps": 1,
            "rollout.max_think_tokens": 2,
            "rollout.max_action_tokens": 4,
            "batch.pad_to_multiple": 512,
        },
        validate=False,
    )
    config = ablations.resolve(c, name, {"sft.rollouts_dir": run})
    metrics = run_sft(config)
    s = config.sft
    per_step = len(tok.encode("Plan.")) + 1 + len(tok.encode("\n\n")) + len(tok.encode("```python\nx = 2\n```")) + 1
    if s.data == "rollouts":  # the one successful attempt (2 steps), every sampled token; insights not trained
        assert (
            metrics["sft/attempts"] == 1
            and metrics["sft/examples"] == 2
            and metrics["sft/target_tokens"] == 2 * per_step
        )
    elif s.deduplicate:  # unique (task, insight): 2 examples, each insight once
        assert metrics["sft/examples"] == 2
        assert metrics["sft/target_tokens"] == len(tok.encode(hint_a.text)) + len(tok.encode(hint_b.text))
    else:  # every insight-conditioned attempt's (task, insights)
        assert metrics["sft/examples"] == 3
        assert metrics["sft/target_tokens"] == len(tok.encode(hint_a.text)) + 2 * len(tok.encode(hint_b.text))
    assert metrics["sft/optimizer_steps"] == 1 and np.isfinite(metrics["sft/nll"]) and "eval/pass@1/all" in metrics
    assert os.listdir(os.path.join(str(tmp_path / name), "checkpoints")) == ["1"]


def test_sft_needs_its_data(saved_run, tmp_path):
    from rltldr_jax.train.sft import run_sft

    def tiny():
        return tiny_config({"workdir": str(tmp_path / "x")}, validate=False)

    with pytest.raises(ValueError, match="sft.rollouts_dir is empty"):
        run_sft(ablations.resolve(tiny(), "sftldr"))
    with pytest.raises(ValueError, match="mode='sft'"):
        run_sft(base.validate(tiny()))
    with pytest.raises(FileNotFoundError, match="rollout.save_rollouts=True"):
        run_sft(ablations.resolve(tiny(), "sftldr", {"sft.rollouts_dir": str(tmp_path)}))
    # A workdir that holds a run, or that another process runs in, is refused before anything is read or built.
    from rltldr_jax.train.resume import RunExistsError, WorkdirInUseError, lock_workdir

    config = ablations.resolve(tiny(), "sftldr", {"sft.rollouts_dir": str(tmp_path)})
    os.makedirs(tmp_path / "x" / "checkpoints" / "1")
    with pytest.raises(RunExistsError, match="already holds a run"):
        run_sft(config)
    held = lock_workdir(str(tmp_path / "x"))
    try:
        with pytest.raises(WorkdirInUseError, match="in use by another process"):
            run_sft(config, restart=True)
    finally:
        held.close()
    with pytest.raises(FileNotFoundError, match="rollout.save_rollouts=True"):  # --restart moved the old run aside
        run_sft(config, restart=True)
    assert [d for d in os.listdir(tmp_path) if d.startswith("x.old-")] and not os.path.exists(
        tmp_path / "x" / "checkpoints"
    )
