"""SapiEnv: one attempt at a SAPI task, with the agent's code running in a Sandbox and the world in this process."""

from __future__ import annotations

from typing import Any

from ..base import StepResult, Task, Verdict
from ..reports import requirement_failure
from ..sandbox import Sandbox, SandboxLimits
from ..spec import API_PROMPT, EnvSpec, register, source_fingerprint
from .tasks import generate_tasks, make_world, verify
from .templates import Template
from .world import CallRecord, World

DEFAULT_LIMITS = SandboxLimits(wall_s=30, cpu_s=30, memory_mb=1024, output_chars=20000)


class SapiEnv:
    """Implements the Env protocol (envs/base.py) for SAPI tasks.

    `reset(task)` rebuilds the task's world from its spec and opens a fresh Sandbox whose `apis` calls go to
    `World.call`; `step(code)` runs a code block (done once `apis.supervisor.complete_task` succeeded);
    `verify()` runs the template's tests on the database diff. The API call log is in `call_log`.

    Args:
      limits: sandbox limits per code block.
    """

    def __init__(self, limits: SandboxLimits = DEFAULT_LIMITS):
        self.limits = limits
        self.world: World | None = None
        self.task: Task | None = None
        self._sandbox: Sandbox | None = None
        self._template: Template | None = None
        self._params: dict[str, Any] = {}
        self._before: dict[str, Any] = {}

    def reset(self, task: Task) -> str:
        self.close()
        self.world, self._template, self._params = make_world(dict(task.spec))
        self._before = self.world.snapshot()
        self.task = task
        self._sandbox = Sandbox(self.limits, api_handler=self.world.call)
        return task.goal

    def step(self, code: str) -> StepResult:
        if self._sandbox is None or self.world is None:
            raise RuntimeError("call reset(task) before step()")
        if self.world.completed:
            return StepResult("The task is already completed.", True)
        obs = self._sandbox.run(code)
        return StepResult(obs, self.world.completed)

    def verify(self) -> Verdict:
        if self.world is None or self._template is None:
            raise RuntimeError("call reset(task) before verify()")
        return verify(self._template, self._params, self._before, self.world)

    @property
    def call_log(self) -> list[CallRecord]:
        return self.world.log if self.world is not None else []

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


#: The SAPI-like world: AppWorld-style apps and tasks generated per seed (the fingerprint is the generator's source).
SPEC = register(
    EnvSpec(
        name="sapi",
        load_tasks=lambda split, seed: generate_tasks(split, seed=seed),
        make_env=SapiEnv,
        task_prompt=API_PROMPT,
        writer_prompt="device",
        rule_failure=requirement_failure,
        world_fingerprint=lambda: source_fingerprint("rltldr_jax.envs.sapi.tasks"),
    )
)
