"""Environments by name (`config.env.name`): thin lookups of each environment's `EnvSpec` (envs/spec.py).

A name is a built-in environment (`ENV_NAMES`; its module registers its spec when first looked up) or an import
path `package.module:SPEC` to an EnvSpec defined outside this repository.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rltldr_jax.envs.base import Env, Task
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import BUILTIN, EnvSpec, PretrainExample, get_spec, source_fingerprint

ENV_NAMES = tuple(BUILTIN)


def load_tasks(name: str, split: str, *, seed: int = 0) -> list[Task]:
    """The tasks of `split` ("train" or "eval"; AppWorld also takes its own split names) of environment `name`.

    `seed` selects generated tasks (the SAPI-like and crafting worlds; forge's evaluation splits ignore it); LeetCode
    and AppWorld data are fixed.
    """
    spec = get_spec(name)
    tasks = spec.load_tasks(split, seed)
    wrong = next((t for t in tasks if t.env != spec.name), None)
    if wrong is not None:
        raise ValueError(
            f"environment {spec.name!r} loaded task {wrong.task_id!r} with env={wrong.env!r}; every task's env must "
            f"be its spec's name, {spec.name!r}"
        )
    return tasks


def make_env(name: str, *, step_timeout_s: float = 30.0, memory_limit_mb: int = 1024) -> Env:
    """A fresh Env of environment `name`, with the sandbox limits of `config.env` (one per concurrent episode)."""
    spec = get_spec(name)
    return spec.make_env(SandboxLimits(wall_s=step_timeout_s, cpu_s=step_timeout_s, memory_mb=memory_limit_mb))


def demonstrations(
    name: str,
    *,
    insight_prob: float = 0.6,
    max_insights: int = 4,
    statement_prob: float = 0.0,
    write_prob: float = 0.0,
    reword_prob: float = 0.0,
) -> Callable[[np.random.Generator], PretrainExample]:
    """The pretraining source of environment `name`: rng -> (task, insights in context as (text, number of the
    failed attempt it names), the demonstrated action text, whether the insights are targets too).

    Only the small-scale replication's worlds (craft, forge) have one (`pretrain.steps > 0` needs it).
    `insight_prob` is the share of demonstrations with insights to act on, at most `max_insights` of them;
    `statement_prob` the share whose insights state true public rules, to be learnt as targets (the
    declarative-pretraining experiment); `write_prob` the share of those with (made-up) insights whose insights are
    learnt as targets too (the policy writes insights); `reword_prob` the share of sentences phrased in another
    wording than the verifier's. A source is only asked for the options set away from their defaults (a world
    added without `write_prob` still serves the defaults).
    """
    spec = get_spec(name)
    if spec.demonstrations is None:
        raise ValueError(
            f"environment {name!r} has no pretraining demonstrations; pretrain.steps > 0 needs a world "
            "that has them: env.name='craft' or 'forge'"
        )
    options = {"insight_prob": insight_prob, "max_insights": max_insights, "statement_prob": statement_prob}
    options |= {k: v for k, v in (("write_prob", write_prob), ("reword_prob", reword_prob)) if v}
    return spec.demonstrations(**options)


def world_fingerprint(name: str) -> str:
    """A hash of what environment `name` generates — its task splits and (for worlds that have them) a fixed sample
    of pretraining demonstrations: caches of what was pretrained on them (train/pretrain.py) are invalid once it
    changes. A spec without its own: the source of the module that defines its `load_tasks`."""
    spec = get_spec(name)
    if spec.world_fingerprint is not None:
        return spec.world_fingerprint()
    return source_fingerprint(spec.load_tasks.__module__)


#: The control insight sources (not in the paper): source -> (the EnvSpec field that implements it, the worlds that
#: have it).
CONTROLS: dict[str, tuple[str, str]] = {
    "uninformative": ("uninformative_insight", "env.name='craft' or 'forge'"),
    "shuffled": ("shuffled_insight", "env.name='forge'"),
}


def control_insight(name: str, source: str) -> Callable[[str, Task, int], str]:
    """The control insight `source` (a key of `CONTROLS`) of environment `name`: (real insight, task, seed) -> the
    sentence that replaces it. "uninformative": the same form and token length, no information about the failure;
    "shuffled": a real insight of another task's failure. Only the small-scale replication's worlds have them."""
    field, worlds = CONTROLS[source]
    control = getattr(get_spec(name), field)
    if control is None:
        raise ValueError(
            f"environment {name!r} has no {source} control insights; insight.source={source!r} needs a world that "
            f"has them: {worlds}"
        )
    return control


def uninformative_insight(name: str) -> Callable[[str, Task, int], str]:
    """`control_insight(name, "uninformative")`."""
    return control_insight(name, "uninformative")


def spec_of(name: str) -> EnvSpec:
    """The EnvSpec of environment `name` (a built-in name, a registered name or `package.module:SPEC`)."""
    return get_spec(name)
