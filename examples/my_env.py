"""A tiny environment defined outside the package: `--config.env.name=examples.my_env:SPEC`.

Each task asks for one word to be printed. The agent's code is never run (no sandbox is needed): `step` reads the
word from a `print("...")` call in the code block, and the verifier's report names what was missing, which
`rule_failure` turns into the one-sentence insight of the rule source (`insight.source="rule"`, §3.2).
"""

from __future__ import annotations

import re

from rltldr_jax.envs.base import StepResult, Task, Verdict
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import EnvSpec

NAME = "echo_words"
WORDS = {"train": ("apple", "river", "stone", "cloud"), "eval": ("maple", "ember")}
_PRINT = re.compile(r"""print\(\s*["']([^"']*)["']\s*\)""")
_MISSING = re.compile(r"^Expected the output '([a-z]+)'; got (.*)\.$")


def load_tasks(split: str, seed: int) -> list[Task]:
    """The split's tasks (fixed: `seed` selects nothing)."""
    if split not in WORDS:
        raise ValueError(f"unknown split {split!r} of {NAME} (expected one of {', '.join(WORDS)})")
    return [Task(f"{NAME}/{w}", f"Print the word {w}.", NAME, split, {"word": w}) for w in WORDS[split]]


class EchoEnv:
    """The Env protocol (rltldr_jax/envs/base.py): one attempt at a time; one code block ends the attempt."""

    def __init__(self) -> None:
        self.word: str | None = None
        self.printed: str | None = None

    def reset(self, task: Task) -> str:
        self.word, self.printed = str(task.spec["word"]), None
        return task.goal

    def step(self, code: str) -> StepResult:
        match = _PRINT.search(code)
        self.printed = match.group(1) if match else ""
        return StepResult(self.printed or "(no output)", True)

    def verify(self) -> Verdict:
        if self.printed == self.word:
            return Verdict(True, "All 1 tests passed.", 1, 1)
        got = "no output" if not self.printed else repr(self.printed)
        report = f"Expected the output {self.word!r}; got {got}."
        return Verdict(False, report, 0, 1, (report,))

    def close(self) -> None:
        pass


def rule_failure(report: str) -> str | None:
    """The report's missing word as an insight, or None (then the generic fallback of `rule_insight`)."""
    match = _MISSING.match(report.strip())
    if match is None:
        return None
    return f"Make sure your code prints exactly {match.group(1)!r} (this attempt had {match.group(2)})."


def _make_env(limits: SandboxLimits) -> EchoEnv:
    return EchoEnv()  # the code is read, never run: the sandbox limits are not needed


SPEC = EnvSpec(
    name=NAME,
    load_tasks=load_tasks,
    make_env=_make_env,
    task_prompt="{goal}\nWrite one Python code block that prints it.",
    writer_prompt="device",
    rule_failure=rule_failure,
)
