"""The rollout files: how a phase's attempts are written to `{workdir}/rollouts/phase_*.jsonl` and read back.

One JSON line per attempt (`save_phase`): the phase, the task, the attempt's index, the insights in its context,
its steps (token ids, forced flags, logprobs, code, observation, weight version), its end and verdict, and the
insight writer's output for it. `record_from_json` / `load_rollouts` rebuild the dataclasses (`RolloutRecord`) for
the offline SFT baselines, the analyses and the replication checks.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rltldr_jax.agent.episode import Attempt, StepRecord
from rltldr_jax.envs.base import Task, Verdict
from rltldr_jax.tokenization import Insight

if TYPE_CHECKING:
    from rltldr_jax.agent.collector import PhaseResult

# ----------------------------------------------------------------------------------------------------
# Writing a phase
# ----------------------------------------------------------------------------------------------------


def save_phase(path: str | os.PathLike, phase: int, result: PhaseResult) -> None:
    """Writes a phase's attempts and the insight writer's outputs as JSON lines (the offline SFT baselines and
    analyses read them)."""
    written = {(tid, idx): j for tid, idx, j in result.writer_outputs}
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for a in result.attempts:
            j = written.get((a.task.task_id, a.index))
            record: dict[str, Any] = {
                "phase": phase,
                "task": json.loads(a.task.to_json()),
                "attempt": a.index,
                "insights": [{"text": i.text, "attempt": i.attempt} for i in a.insights],
                "end": a.end,
                "success": a.success,
                "verdict": dataclasses.asdict(a.verdict),
                "steps": [dataclasses.asdict(s) for s in a.steps],
                "writer_output": None
                if j is None
                else {"insight": j.insight, "fields": j.fields, "parse_error": j.parse_error},
            }
            f.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------------------------------
# Reading saved phases back (offline SFT, analyses)
# ----------------------------------------------------------------------------------------------------

PHASE_GLOB = "phase_*.jsonl"


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
    """One saved attempt (one JSON line of `save_phase`), with the real dataclasses rebuilt.

    Attributes:
      phase: the collection phase (0-based; the policy that sampled it had weight version `phase`).
      attempt: the attempt (task, 1-based index, insights in context, steps with token ids, end, verdict).
      writer_output: the insight writer's result for this attempt ({"insight", "fields", "parse_error"}), or None
        when no insight was written for it (a success under RLTL;DR, or no writer).
    """

    phase: int
    attempt: Attempt
    writer_output: Mapping[str, Any] | None

    @property
    def task_id(self) -> str:
        return self.attempt.task.task_id

    @property
    def success(self) -> bool:
        return self.attempt.success

    @property
    def with_insights(self) -> bool:
        """True if insights were in the attempt's context."""
        return bool(self.attempt.insights)

    @property
    def written_insight(self) -> str | None:
        """The insight written after this attempt (None if none was written or it was empty)."""
        text = (self.writer_output or {}).get("insight")
        return text if isinstance(text, str) and text.strip() else None


def record_from_json(raw: Mapping[str, Any]) -> RolloutRecord:
    """A `RolloutRecord` from one decoded JSON line of `save_phase` (KeyError/TypeError on a foreign format)."""
    task = Task(**raw["task"])
    insights = tuple(Insight(i["text"], int(i["attempt"])) for i in raw["insights"])
    steps = tuple(
        StepRecord(
            action_ids=tuple(int(t) for t in s["action_ids"]),
            forced=tuple(bool(f) for f in s["forced"]),
            logprobs=tuple(float(x) for x in s["logprobs"]),
            code=s["code"],
            observation=s["observation"],
            weight_version=int(s["weight_version"]),
        )
        for s in raw["steps"]
    )
    v = raw["verdict"]
    verdict = Verdict(
        bool(v["success"]), v["report"], int(v["num_passed"]), int(v["num_tests"]), tuple(v.get("failures", ()))
    )
    attempt = Attempt(task, int(raw["attempt"]), insights, steps, raw["end"], verdict)
    if attempt.success != bool(raw["success"]):
        raise ValueError(
            f"record of {task.task_id} attempt {raw['attempt']}: success {raw['success']} ≠ verdict {verdict.success}"
        )
    # ("judgement": the key in rollout files written before the insight writer's output was named so)
    return RolloutRecord(int(raw["phase"]), attempt, raw.get("writer_output", raw.get("judgement")))


def rollouts_dir(run: str | os.PathLike) -> str:
    """The directory holding a run's `phase_*.jsonl`: `{run}/rollouts`, or `run` itself if it holds them."""
    run = os.fspath(run)
    sub = os.path.join(run, "rollouts")
    if os.path.isdir(sub) or not glob.glob(os.path.join(run, PHASE_GLOB)):
        return sub
    return run


def load_rollouts(run: str | os.PathLike) -> list[RolloutRecord]:
    """Every saved attempt of a run, ordered by (phase, task id, attempt index).

    Args:
      run: the run's workdir (e.g. `runs/sapi-rltldr`, reading `runs/sapi-rltldr/rollouts/phase_*.jsonl`), or
        the rollouts directory itself.

    Raises:
      FileNotFoundError: no phase files (the run was trained without `rollout.save_rollouts=True`).
      ValueError: a line that is not a `save_phase` record, naming the file and line.
    """
    directory = rollouts_dir(run)
    files = sorted(glob.glob(os.path.join(directory, PHASE_GLOB)))
    if not files:
        raise FileNotFoundError(
            f"no rollouts found: {directory!r} has no {PHASE_GLOB} files. "
            "Offline SFT and the analyses read the attempts a run saves "
            "with rollout.save_rollouts=True (on by default); pass --run=<the run's workdir> "
            "(e.g. runs/sapi-rltldr), or retrain with --config.rollout.save_rollouts=True."
        )
    records: list[RolloutRecord] = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append(record_from_json(json.loads(line)))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ValueError(
                        f"{path}:{n} is not a rollout record as rltldr_jax.agent.rollout_files.save_phase writes them "
                        f"({type(e).__name__}: {e})"
                    ) from e
    records.sort(key=lambda r: (r.phase, r.task_id, r.attempt.index))
    return records
