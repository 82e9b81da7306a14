"""The base experiment config: every key of `rltldr_jax.settings.Settings` as an ml_collections ConfigDict (what
`--config.KEY=VALUE` flags and the ablations override), its validation, and the shared preset helpers.

Every key, its default (the paper's SAPI/AppWorld setting, Table 4 and §3–A.4 of arXiv 2609.37633), its documentation
and its bounds or choices are declared once, in `rltldr_jax/settings.py`. Environment files (`configs/sapi.py`,
`configs/appworld.py`, `configs/leetcode.py`, `configs/replicate.py`) start from `get_config()` and change what differs;
`ablations.py` holds every table row as named overrides.

Validation (`validate`) runs in every launcher after all overrides: an unknown key, a value of the wrong
type, a value outside its choices or range, or an inconsistent combination is a `ConfigError` that names the
key and says how to fix it. `ablations.resolve` then returns the validated config as `Settings`, the typed tree every
library part takes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import ml_collections

from rltldr_jax.agent.collector import exact_group_size_error
from rltldr_jax.agent.eval_set import split_names
from rltldr_jax.engines.engine import top_k_error
from rltldr_jax.engines.factory import engine_kind_error, engine_settings_error
from rltldr_jax.engines.jax_engine import decode_group_error
from rltldr_jax.envs.registry import CONTROLS, control_insight
from rltldr_jax.envs.spec import env_name_error
from rltldr_jax.loss_terms import LOSS_TERMS, terms_error
from rltldr_jax.models import hub
from rltldr_jax.models.lora import lora_error
from rltldr_jax.models.presets import checkpoint_needed_error, preset_error
from rltldr_jax.settings import Settings, as_dict, value_errors
from rltldr_jax.sharding import mesh_sizes_error
from rltldr_jax.train.batching import length_buckets_error
from rltldr_jax.train.loggers import wandb_error
from rltldr_jax.train.step import lr_decay_error, weight_decay_error


def get_config() -> ml_collections.ConfigDict:
    """The paper's RLTL;DR configuration (SAPI/AppWorld column of Table 4): every key of `rltldr_jax.settings.Settings`
    with its default (each documented there, with its bounds or choices), and the coefficient keys of loss terms
    registered from outside the package (`loss_terms.register_loss_term`) with their defaults."""
    c = ml_collections.ConfigDict(as_dict(Settings()))
    for term in LOSS_TERMS.values():
        for key, default in ((term.coef, term.default_coef), *((k, 0.0) for k in term.params)):
            if key not in c.loss:
                c.loss[key] = float(default)
    return c


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """An invalid configuration; the message names the key and the fix."""


def get(config: ml_collections.ConfigDict, key: str) -> Any:
    """The value at a dotted key; ConfigError naming the first missing part."""
    node: Any = config
    for i, part in enumerate(key.split(".")):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ConfigError(f"unknown config key {'.'.join(key.split('.')[: i + 1])!r} (in {key!r})")
        node = node[part]
    return node


def _loss_terms_errors(c: ml_collections.ConfigDict) -> list[str]:
    """What is wrong with `loss.terms` and its coefficients: an unregistered term, a missing coefficient key, or every
    coefficient 0 in an RL run."""
    problem = terms_error(c.loss.terms)
    if problem:
        return [problem]
    coefs = [LOSS_TERMS[name.strip()].coef for name in c.loss.terms.split(",") if name.strip()]
    missing = [key for key in coefs if key not in c.loss]
    if missing:
        return [
            f"loss.terms={c.loss.terms!r} needs the key(s) {', '.join('loss.' + k for k in missing)}: import the "
            "module that registers the term before building the config"
        ]
    if c.mode == "rl" and all(c.loss[key] == 0 for key in coefs):
        names = ", ".join(f"loss.{key}" for key in coefs)
        return [f"the coefficients of every term of loss.terms ({names}) are 0: nothing would be trained"]
    return []


def _cross_checks(c: ml_collections.ConfigDict) -> list[str]:
    """Combinations that are individually valid but inconsistent."""
    errors = []
    if c.mode == "rl" and c.rollout.group_size < 2:
        errors.append(
            f"rollout.group_size={c.rollout.group_size}: nothing can be learned from one attempt per task (its GRPO "
            "advantage is 0, and insights only reach later attempts of the same task); use rollout.group_size >= 2"
        )
    errors += _loss_terms_errors(c)
    try:
        splits = split_names(c.eval.splits)
        if c.eval.select_on and c.eval.select_on not in splits:
            errors.append(f"eval.select_on={c.eval.select_on!r} is not one of eval.splits={c.eval.splits!r}")
    except ValueError as e:
        errors.append(str(e))
    if c.rollout.thinking and c.rollout.max_think_tokens == 0:
        errors.append("rollout.thinking=True needs rollout.max_think_tokens > 0 (or set rollout.thinking=False)")
    if c.insight.first_k_max_successes > c.insight.first_k:
        errors.append(
            f"insight.first_k_max_successes={c.insight.first_k_max_successes} exceeds insight.first_k="
            f"{c.insight.first_k}: the rule would always insert"
        )
    errors += filter(None, [preset_error(c.model.preset, c.model.checkpoint)])  # (reads config.json, no weights)
    servers = [a for a in c.engine.servers.split(",") if a.strip()]
    http_servers = [a for a in c.engine.http_servers.split(",") if a.strip()]
    if http_servers and len(http_servers) != len(servers):
        errors.append(
            f"engine.http_servers lists {len(http_servers)} URLs for {len(servers)} engine.servers; "
            "give one per server, same order"
        )
    if c.insight.source == "teacher" and not (c.insight.teacher.checkpoint or c.insight.teacher.servers):
        errors.append(
            "insight.source='teacher' needs insight.teacher.checkpoint (an HF directory, run embedded) or "
            "insight.teacher.servers (host:port of gRPC servers hosting the teacher)"
        )
    if c.insight.source in CONTROLS:
        try:
            control_insight(c.env.name, c.insight.source)
        except ValueError as e:
            errors.append(str(e))
    if c.insight.teacher.checkpoint and c.insight.teacher.servers:
        errors.append("give insight.teacher.checkpoint or insight.teacher.servers, not both")
    if c.model.lora.rank > 0:
        errors += filter(None, [lora_error(c.model.lora.targets)])
    elif c.model.lora.dropout > 0:
        errors.append(
            f"model.lora.dropout={c.model.lora.dropout} without adapters (model.lora.rank=0): it drops the adapters' "
            "input; set model.lora.rank > 0, or model.lora.dropout=0"
        )
    # Rules that the library parts also enforce: each lives once, in the module that needs it.
    errors += filter(
        None,
        [
            exact_group_size_error(c.rollout.exact_group_size, c.rollout.workers_per_task, prefix="rollout."),
            weight_decay_error(c.optim.name, c.optim.weight_decay),
            lr_decay_error(
                c.sft.learning_rate if c.mode == "sft" else c.optim.learning_rate,
                c.optim.end_learning_rate,
                c.optim.decay_steps,
                prefix="optim.",
            ),
            top_k_error(c.rollout.top_k, prefix="rollout."),
            mesh_sizes_error(c.mesh.data, c.mesh.fsdp, c.mesh.tensor),
            decode_group_error(c.engine.max_batch, c.engine.decode_group, prefix="engine."),
            length_buckets_error(c.batch.length_buckets, c.batch.pad_to_multiple, c.rollout.max_context_tokens),
            wandb_error(c.logging.wandb),
        ],
    )
    if c.loss.insight_rollouts != "in_context" and c.insight.schedule == "never":
        errors.append(
            f"loss.insight_rollouts={c.loss.insight_rollouts!r} needs insight-conditioned attempts, but "
            "insight.schedule='never' inserts none"
        )
    if c.insight.content == "strategy" and c.loss.lam > 0:
        errors.append(
            "insight.content='strategy' (SGE) inserts attempt summaries, not insights: set loss.lam=0 (SGE has no "
            "insight SFT)"
        )
    return errors


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks every choice and range declared in `rltldr_jax/settings.py` (and that every float is finite), the
    registries (`env.name`, `engine.kind`, `loss.terms`) and every combination; raises one ConfigError
    listing all problems.

    Returns the config unchanged, so `validate(get_config())` can be chained.
    """
    errors = value_errors(lambda key: get(config, key))
    # engine.kind follows the engine registry (a package.module:name value imports the module that registers it).
    if problem := engine_kind_error(config.engine.kind):
        errors.append(problem)
    # env.name: a built-in environment or package.module:SPEC (an EnvSpec defined elsewhere): envs/spec.py checks it
    if (env_error := env_name_error(get(config, "env.name"))) is not None:
        errors.append(env_error)
    if not errors:
        errors += _cross_checks(config)
    if errors:
        raise ConfigError(
            "invalid config:\n  - " + "\n  - ".join(errors) + "\n(set values with --config.KEY=VALUE; every key is "
            "documented in rltldr_jax/settings.py)"
        )
    return config


def run_errors(config: Any, *, weights: bool = True) -> list[str]:
    """What a valid config still lacks to run here, each in one line (empty when nothing): the servers its engine
    backend needs (`engine.servers`, `engine.http_servers`), the weights a non-tiny preset needs (`model.checkpoint`,
    or `pretrain.steps` > 0). Reads no weights and connects nowhere: the launchers check it right after resolving
    the config (and `--dry_run` reports it), before anything heavy is built. A config may be valid and not runnable
    as given: the paper's presets leave the servers and the checkpoint to the command line. `weights=False`: a
    launcher that finds the weights elsewhere (eval's --checkpoint or the workdir's latest) checks the servers only."""
    return list(
        filter(
            None,
            [
                engine_settings_error(config.engine),
                checkpoint_needed_error(config.model.preset, config.model.checkpoint, config.pretrain.steps)
                if weights
                else None,
            ],
        )
    )


def override(config: ml_collections.ConfigDict, values: dict[str, Any]) -> ml_collections.ConfigDict:
    """Sets dotted keys in place; an unknown key is a ConfigError. Returns the config."""
    for key, value in values.items():
        parent, _, leaf = key.rpartition(".")
        node = get(config, parent) if parent else config
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise ConfigError(f"unknown config key {key!r}; every key is documented in rltldr_jax/settings.py")
        try:
            node[leaf] = value
        except TypeError as e:
            raise ConfigError(f"{key}={value!r}: {e}") from e
    return config


#: Config keys holding a file or directory: made absolute by `absolute_paths` when the config is resolved.
PATH_KEYS = (
    "workdir",
    "tokenizer",
    "model.checkpoint",
    "model.base_checkpoint",
    "insight.teacher.checkpoint",
    "insight.teacher.tokenizer",
    "engine.weight_sync_dir",
    "sft.rollouts_dir",
    "pretrain.cache_dir",
    "compile.cache_dir",
    "logging.wandb_dir",
)


def absolute_path(path: str) -> str:
    """`path` made absolute against the current working directory (`~` expanded), so that it means the same from
    any directory and to libraries that need absolute paths (orbax). "" and URLs (gs://...) stay as they are; a
    trailing `:STEP` of a training checkpoint (`DIR:3`) is kept."""
    if not path or "://" in path:
        return path
    head, sep, tail = path.rpartition(":")
    if sep and head and tail.isdigit():
        return f"{os.path.abspath(os.path.expanduser(head))}:{tail}"
    return os.path.abspath(os.path.expanduser(path))


#: The `PATH_KEYS` naming an HF model or tokenizer, which also take a hub id `org/name[@revision]` (`model_path`).
HUB_KEYS: dict[str, Literal["model", "tokenizer"]] = {
    "model.checkpoint": "model",
    "model.base_checkpoint": "model",
    "tokenizer": "tokenizer",
    "insight.teacher.checkpoint": "model",
    "insight.teacher.tokenizer": "tokenizer",
}


def model_path(value: str, what: Literal["model", "tokenizer"] = "model") -> str:
    """`absolute_path` of a value naming an HF model (or tokenizer), where a hub id `org/name[@revision]` that is not
    an existing local path is first resolved to its snapshot directory in the local HF cache, downloaded there if
    needed (`rltldr_jax.models.hub.resolve`: `HubError` when it cannot be). A `DIR:STEP` is kept."""
    return absolute_path(hub.resolve(value, what=what))


def absolute_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Makes every non-empty `PATH_KEYS` value absolute (relative to the current directory), and resolves a hub id
    in a `HUB_KEYS` key to its local snapshot (`model_path`), in place; returns the config. Launchers call it once,
    where the config enters (`ablations.resolve`, after validation). A hub id that cannot be resolved is a
    ConfigError naming the key."""
    for key in PATH_KEYS:
        parent, _, leaf = key.rpartition(".")
        node = get(config, parent) if parent else config
        if key in HUB_KEYS:
            try:
                node[leaf] = model_path(node[leaf], HUB_KEYS[key])
            except hub.HubError as e:
                raise ConfigError(f"{key}={node[leaf]!r}: {e}") from None
        else:
            node[leaf] = absolute_path(node[leaf])
    return config


def apply_tiny(c: ml_collections.ConfigDict) -> None:
    """Shrinks any paper config to a tiny random Qwen 3.5 on the embedded engine: a few phases in CPU minutes.

    The insight source is `rule` (insights by rule from the verifier's report), so an untrained model still exercises
    insertion and the SFT mask.
    """
    override(
        c,
        {
            "name": "tiny",
            "model.preset": "tiny",
            "model.dtype": "float32",
            "model.param_dtype": "float32",
            "model.remat": False,
            "env.max_observation_chars": 600,
            "env.step_timeout_s": 5.0,
            "rollout.tasks_per_phase": 2,
            "rollout.group_size": 4,
            "rollout.max_steps": 3,
            "rollout.max_think_tokens": 16,
            "rollout.max_action_tokens": 48,
            "rollout.max_context_tokens": 2048,
            "insight.source": "rule",
            "loss.sft_on_filtered": True,  # a random policy never succeeds: only L_SFT can move it
            "insight.thinking": False,
            "insight.max_think_tokens": 0,
            "insight.max_action_tokens": 64,
            "optim.learning_rate": 1e-4,
            "batch.micro_batch_size": 4,
            "batch.grad_accum_steps": 1,
            "batch.pad_to_multiple": 1024,  # one example length: train_step compiles once
            "mesh.data": -1,
            "mesh.fsdp": 1,
            "engine.kind": "jax",
            "engine.max_batch": 8,
            "train.env_step_budget": 0,
            "train.max_phases": 3,
            "eval.every": 0,
            "eval.num_tasks": 4,
            "eval.attempts_per_task": 2,
        },
    )


PresetFn = Callable[[ml_collections.ConfigDict], None]


def from_presets(presets: dict[str, PresetFn], preset: str | None, default: str = "paper") -> ml_collections.ConfigDict:
    """`get_config()` with one named preset applied (the `:preset` of `--config=configs/X.py:preset`)."""
    name = preset or default
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
    config = get_config()
    presets[name](config)
    return config
