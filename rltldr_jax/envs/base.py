"""What every environment provides: tasks, a resumable task order, and the Env protocol.

An attempt at a task is: `goal = env.reset(task)`; then `env.step(code)` for each code block the agent writes,
until `done`; then `env.verify()`. The verifier's report (the failed tests) is privileged: only the insight
writer sees it, never the acting policy. Environments run the agent's code in `envs.sandbox.Sandbox`; world
state the verifier reads lives outside the sandbox, so agent code can only change it through the APIs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
      task_id: unique within its environment, stable across runs (used for groups, metrics and checkpoints).
      goal: the instruction the agent sees (the user message of the attempt context).
      env: the name of its environment's `EnvSpec` ("sapi", "leetcode", "appworld", "craft", "forge", or an
        external spec's), by which the episode loop and the insight writer look the spec up.
      split: "train", "eval", ...
      spec: environment-specific, JSON-serialisable data from which the env rebuilds the task (e.g. the
        template and parameters of a SAPI task, the problem id of a LeetCode task).
    """

    task_id: str
    goal: str
    env: str
    split: str
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self) | {"spec": dict(self.spec)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one code execution returns: the observation text and whether the attempt is over (the agent
    called the completion API, or the environment ended it)."""

    observation: str
    done: bool


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The verifier's result for one attempt.

    Attributes:
      success: every test passed.
      report: the privileged failed-tests text (AppWorld style: the failed requirements with the agent's
        values, never the ground truth); shown only to the insight writer.
      num_passed, num_tests: test counts (num_tests may be 0 when the attempt never ran, e.g. a malformed action).
      failures: the requirement text of each failed test, in order.
    """

    success: bool
    report: str
    num_passed: int
    num_tests: int
    failures: tuple[str, ...] = ()


class Env(Protocol):
    """One environment instance runs one attempt at a time (episodes run many instances concurrently)."""

    def reset(self, task: Task) -> str:
        """Starts an attempt at `task` in a fresh world and sandbox; returns the goal text."""
        ...

    def step(self, code: str) -> StepResult:
        """Runs one code block of the agent; returns the observation and whether the attempt is over."""
        ...

    def verify(self) -> Verdict:
        """Checks the attempt (callable once the attempt is over, or early to score an unfinished attempt)."""
        ...

    def close(self) -> None:
        """Releases the sandbox process and any other resources."""
        ...


class TaskSource:
    """The tasks of one split in a deterministic, seeded order, with a cursor that checkpoints can restore.

    Each epoch is a fresh permutation (seed, epoch); `take(n)` continues where the last call stopped and
    crosses epoch boundaries, never repeating a task within one call of at most the split's size (`take`).
    `state()` / `restore(state)` make a resumed run see the same tasks.

    Args:
      tasks: the split's tasks (ids must be unique).
      seed: order seed.
      shuffle: False keeps the given order (e.g. for evaluation).
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, shuffle: bool = True):
        if not tasks:
            raise ValueError("a TaskSource needs at least one task")
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"duplicate task ids in the split: {dup}")
        self.tasks = list(tasks)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return len(self.tasks)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.tasks))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def take(self, n: int) -> list[Task]:
        """The next `n` tasks (wrapping into the next epoch).

        When `n` is at most the split's size, the tasks of one call are distinct (a phase has one group per task):
        where a call wraps into the next epoch, a task it already took at the end of the previous epoch is skipped
        in the new one (that epoch visits it one time fewer). A call that wraps without such a repeat takes the
        plain permutations, so only a call that would have repeated a task changes. A larger `n` repeats tasks.
        """
        distinct = n <= len(self.tasks)
        out: list[Task] = []
        taken: set[int] = set()
        while len(out) < n:
            order = self._order(self.epoch)
            while len(out) < n and self.position < len(order):
                i = int(order[self.position])
                self.position += 1
                if distinct and i in taken:  # taken at the end of the previous epoch, in this same call
                    continue
                out.append(self.tasks[i])
                taken.add(i)
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_tasks": len(self.tasks)}

    def restore(self, state: Mapping[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed or state.get("num_tasks", len(self.tasks)) != len(self.tasks):
            raise ValueError(
                f"task cursor {dict(state)} was saved for a different split "
                f"(seed {self.seed}, {len(self.tasks)} tasks here)"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
