"""`EnvSpec`: everything the trainer needs to know about one environment, in one frozen object.

An environment module builds its spec and registers it (`SPEC = register(EnvSpec(...))`); the trainer, the
episode loop and the insight writer look it up by name (`get_spec(config.env.name)`, `get_spec(task.env)`), so
adding an environment touches only its own module. `config.env.name` is either the name of a built-in environment
(`BUILTIN`: its module is imported on first use, so importing this registry imports neither AppWorld nor the
LeetCode data) or an import path `package.module:SPEC` to an EnvSpec defined outside this repository; a spec
resolved from a path is registered under its `name`, which is what its tasks carry in `Task.env`.

The spec lives here rather than in `envs/base.py` because it names the agent-facing parts of an environment (its
task prompt, its writer-prompt variant, its rule insight) on top of the `Env` protocol that `base.py` defines, and
holds the registry that those parts are looked up in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from rltldr_jax.envs.base import Env, Task
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.user_modules import import_user_module

#: (rng) -> (task, insights in context as (text, number of the failed attempt it names), the demonstrated action
#: text, whether the insights are targets too): one pretraining demonstration.
PretrainExample = tuple[Task, tuple[tuple[str, int], ...], str, bool]

# The first user message of an attempt: the environment's goal with the instructions for acting. The paper's
# system/task prompt is not published (App. A shows only the writer prompt); these are written for our environments.
API_PROMPT = (
    "You are an agent that completes tasks for a user by writing Python code that calls the apps' APIs.\n"
    "Each of your turns must contain exactly one Python code block (```python ... ```); it runs in a persistent "
    "Python session where `apis` is defined, and you will see its output. Explore the APIs with "
    "`apis.api_docs.show_app_descriptions()`, `apis.api_docs.show_api_descriptions(app_name=...)` and "
    "`apis.api_docs.show_api_doc(app_name=..., api_name=...)`. Your account credentials are available through "
    "`apis.supervisor`. When the task is done, call `apis.supervisor.complete_task()` (with `answer=...` only if "
    "the task asks a question).\n\nTask: {goal}"
)
CODING_PROMPT = "{goal}\n\nAnswer with your complete solution in one Python code block (```python ... ```)."
PLAN_PROMPT = "{goal}\nWrite the plan as one Python code block."

WriterPrompt = Literal["device", "coding"]
WRITER_PROMPTS: tuple[str, ...] = ("device", "coding")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """One environment, as the trainer, the episode loop and the insight writer see it.

    Attributes:
      name: the environment's name: `config.env.name` of a built-in one, and `Task.env` of every task it loads.
      load_tasks: (split, seed) -> the tasks of `split` ("train", "eval", or the environment's own split names);
        `seed` selects generated tasks (fixed data sets ignore it). Every task's `env` must be `name`.
      make_env: (sandbox limits of `config.env`: wall/CPU seconds per step and memory) -> a fresh `Env` (one per
        concurrent episode, §3.1).
      task_prompt: the template of the first user message of every attempt, with `{goal}` for the task's goal
        (`API_PROMPT`, `CODING_PROMPT`, `PLAN_PROMPT`, or the environment's own).
      writer_prompt: which variant of the writer prompt (App. A.1, Prompt 1) reads its failed attempts: "device"
        (an agent acting through APIs; AppWorld's wording) or "coding" (a solution checked by unit tests).
      rule_failure: the verifier's report -> the one-sentence insight of the rule source (`insight.source="rule"`,
        no model: the first failed requirement as "Make sure ..."), or None when the report is not in the
        environment's format; then `agent.rule_insight.rule_insight` falls back to the report's first informative line.
        None: always the fallback.
      demonstrations: optional pretraining source (`pretrain.steps > 0`), called with `insight_prob`,
        `max_insights` and `statement_prob`, and `write_prob` and `reword_prob` when set (see
        `registry.demonstrations`); returns rng -> `PretrainExample`.
      uninformative_insight: optional control insight (`insight.source="uninformative"`, not in the paper):
        (real insight, task, seed) -> a sentence of the same form and token length that says nothing about the
        failure.
      shuffled_insight: optional control insight (`insight.source="shuffled"`, not in the paper): (real insight,
        task, seed) -> a real insight of another task's failure, true of the world but not about this task's (the
        insights shuffled across tasks).
      world_fingerprint: optional () -> a short hash of what the environment generates (pretraining caches are
        keyed on it); None: the hash of the source of the module that defines `load_tasks`.
      evaluation_probes: optional (task, the attempt's last executed code or None, success) -> {name: value}: what
        an evaluation measures of each attempt besides its success (per-rule success, where a fix is placed); each
        name's mean over the attempts of an evaluation set that report it is logged as `{prefix}/probe/{name}`.
      reference_plans: optional task -> {"oracle": an answer that obeys the hidden rules, "public": the answer public
        knowledge gives}, each as the policy writes it: the pair whose no-insight log-probabilities the probes over
        training compare (`analysis/plan_probes.py`, `launch/probe_plans.py`). None: the world has no such probe.
    """

    name: str
    load_tasks: Callable[[str, int], list[Task]]
    make_env: Callable[[SandboxLimits], Env]
    task_prompt: str
    writer_prompt: WriterPrompt = "device"
    rule_failure: Callable[[str], str | None] | None = None
    demonstrations: Callable[..., Callable[[np.random.Generator], PretrainExample]] | None = None
    uninformative_insight: Callable[[str, Task, int], str] | None = None
    shuffled_insight: Callable[[str, Task, int], str] | None = None
    world_fingerprint: Callable[[], str] | None = None
    evaluation_probes: Callable[[Task, str | None, bool], Mapping[str, float]] | None = None
    reference_plans: Callable[[Task], Mapping[str, str]] | None = None

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"EnvSpec name {self.name!r} must be non-empty and without ':'")
        if self.writer_prompt not in WRITER_PROMPTS:
            raise ValueError(
                f"EnvSpec {self.name!r}: writer_prompt={self.writer_prompt!r} is not one of {WRITER_PROMPTS}"
            )
        if "{goal}" not in self.task_prompt:
            raise ValueError(f"EnvSpec {self.name!r}: task_prompt must contain '{{goal}}' (where the task's goal goes)")


def source_fingerprint(module: str) -> str:
    """A 12-hex-digit hash of the source of `module` (worlds whose splits are fixed by their code or data)."""
    return hashlib.sha256(inspect.getsource(importlib.import_module(module)).encode()).hexdigest()[:12]


#: The built-in environments and the module that registers each one's spec (imported on first use).
BUILTIN: dict[str, str] = {
    "sapi": "rltldr_jax.envs.sapi.env",
    "leetcode": "rltldr_jax.envs.leetcode",
    "appworld": "rltldr_jax.envs.appworld",
    "craft": "rltldr_jax.envs.craft",
    "forge": "rltldr_jax.envs.forge",
}

_SPECS: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> EnvSpec:
    """Makes `spec` findable by its name (and so by `Task.env`); returns it. A second, different spec of the same
    name is an error."""
    if not isinstance(spec, EnvSpec):
        raise TypeError(f"register() takes an EnvSpec, not {type(spec).__name__}")
    known = _SPECS.get(spec.name)
    if known is not None and known is not spec:
        raise ValueError(f"another environment spec is already registered as {spec.name!r}; give yours another name")
    _SPECS[spec.name] = spec
    return spec


def _from_path(path: str) -> EnvSpec:
    module_name, _, attr = path.partition(":")
    fix = "give env.name as package.module:SPEC, an importable module and the name of an EnvSpec in it"
    if not module_name or not attr or ":" in attr:
        raise ValueError(f"env.name={path!r} is not of the form package.module:SPEC; {fix}")
    try:
        module = import_user_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"env.name={path!r}: cannot import module {module_name!r} ({e}); {fix} (run from the directory that "
            "contains the package, or install it)"
        ) from e
    except Exception as e:  # a broken module: its own error, on one line
        raise ValueError(
            f"env.name={path!r}: importing {module_name!r} failed with {type(e).__name__}: {e}; fix that module"
        ) from e
    if not hasattr(module, attr):
        raise ValueError(f"env.name={path!r}: module {module_name!r} has no attribute {attr!r}; {fix}")
    spec = getattr(module, attr)
    if not isinstance(spec, EnvSpec):
        raise ValueError(
            f"env.name={path!r}: {module_name}.{attr} is a {type(spec).__name__}, not an EnvSpec; "
            "define it as rltldr_jax.envs.spec.EnvSpec(...)"
        )
    if spec.name in BUILTIN and module_name != BUILTIN[spec.name]:
        raise ValueError(
            f"env.name={path!r}: its spec is named {spec.name!r}, the name of a built-in environment; rename it"
        )
    return register(spec)


def get_spec(name: str) -> EnvSpec:
    """The spec of environment `name`: a registered or built-in name, or an import path `package.module:SPEC`
    (imported and registered under the spec's name). ValueError, in one line naming the fix, otherwise."""
    spec = _SPECS.get(name)
    if spec is not None:
        return spec
    if ":" in name:
        return _from_path(name)
    if name in BUILTIN:
        importlib.import_module(BUILTIN[name])
        return _SPECS[name]
    raise ValueError(
        f"unknown environment {name!r}; choose one of {', '.join(BUILTIN)} (config.env.name), or give "
        "package.module:SPEC of an EnvSpec defined elsewhere (resolving it registers its name for its tasks)"
    )


def env_name_error(name: Any) -> str | None:
    """Why `name` is not a valid `config.env.name` (one line), or None."""
    if not isinstance(name, str):
        return f"env.name={name!r} must be a string: one of {', '.join(BUILTIN)}, or package.module:SPEC"
    if name in BUILTIN:  # (not imported here: validating a config loads no environment)
        return None
    try:
        get_spec(name)
    except ValueError as e:
        return str(e)
    return None
