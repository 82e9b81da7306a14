"""Pretraining a small policy from scratch on an environment's demonstrations (the small-scale replication).

    config = ensure_pretrained(config)        # pretrains (or finds the cached result) when pretrain.steps > 0
    config.model.checkpoint                   # -> runs/pretrained/craft-replicate_s-<hash>: HF weights + tokenizer.json

A pretrained LLM arrives knowing its world's public rules and able to act on advice in its context; a policy
trained from scratch must be taught both before RL (the paper's App. B checks that insights help the base policy
before training). `pretrain` does that on `envs.registry.demonstrations(env.name)`: each demonstration is a task,
the insights in its context and the action that solves the task under the public rules while obeying the
insights. Examples are built by the same `ContextBuilder` as the RL contexts (task message, insight messages in
the paper's format, generation prompt, the action + `<|im_end|>`), and the loss is the NLL of the action tokens
(and of the insight tokens of demonstrations whose insights state true rules, `pretrain.statement_prob`), run by
the same sharded step as RL with λ = 1 and no
GRPO term.

The tokenizer is a small byte-level BPE with Qwen's ChatML and `<think>` special tokens
(`tokenization.train_chatml_tokenizer`), trained on the texts of demonstrations drawn with a fixed seed, so every
seed and every preset of one world share it. The result is an ordinary HF checkpoint directory (config.json,
model.safetensors, tokenizer.json) that `model.checkpoint` and every launcher take, plus `pretrain.json` (the
settings and the loss curve). It is cached under `pretrain.cache_dir` by a hash of everything it depends on
(`pretrain_key`), written to a temporary directory and renamed when complete, so an interrupted run never leaves a
half checkpoint that a later run would take. A run stopped on the way (SIGTERM/SIGINT: at the next pool of
demonstrations; a kill: since the last save) continues where its state was saved (`resume_dir`: parameters,
optimizer state, the demonstrations' generator, the loss curve; saved every `SAVE_EVERY_SECONDS` and on a stop),
to the same bytes as a run never stopped. The replication's base policies (seeds 0-2 of `configs/replicate.py`)
ship with the package (`SHIPPED_DIR`, 1 MB each) and are used when their key matches (`pretrain.shipped`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from rltldr_jax import strict_json
from rltldr_jax.agent.episode import task_text
from rltldr_jax.agent.step_examples import Example
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.envs.registry import demonstrations, world_fingerprint
from rltldr_jax.envs.spec import get_spec
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained
from rltldr_jax.models.hf import CorruptCheckpointError
from rltldr_jax.settings import Pretrain, Settings, as_dict, build, replace
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.tokenization import INSIGHT_SCAFFOLD, ContextBuilder, Insight, Step, Tokenizer, train_chatml_tokenizer
from rltldr_jax.train.batching import pack
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import LossConfig
from rltldr_jax.train.stopping import RunStopped, StopSignals, signal_name

log = logging.getLogger(__name__)

#: Bumped when the pretraining recipe changes in a way the config does not show (invalidates cached checkpoints).
RECIPE_VERSION = 1
#: Demonstrations whose texts train the tokenizer (fixed seed: one tokenizer per world and vocabulary size).
TOKENIZER_CORPUS = 4000
#: Example lengths are padded to a multiple of this; a step's demonstrations are sorted by length into
#: `LENGTH_BUCKETS` batches so that short examples are not padded to the longest.
PAD_MULTIPLE = 64
LENGTH_BUCKETS = 4


#: Pretraining saves its state (`resume_dir`) at the first pool boundary after this many seconds since the last save,
#: and when asked to stop.
SAVE_EVERY_SECONDS = 300.0
#: `resume_dir` is the checkpoint's directory with this suffix.
RESUME_SUFFIX = ".resume"


#: Pretrain settings added after base policies shipped: they enter `pretrain_key` only when set away from their
#: defaults (which reproduce the earlier recipe), so the shipped base policies keep their keys.
LATER_KEYS = ("write_prob", "reword_prob")


def pretrain_key(config: Settings) -> str:
    """A hash of everything the pretrained checkpoint depends on: the pretrain settings (cache_dir excluded;
    `LATER_KEYS` only when not default), the architecture, dtypes, environment (and the source of its world:
    `registry.world_fingerprint`), insight cap, seed and the recipe version."""
    p = config.pretrain
    defaults = as_dict(Pretrain())
    parts = {
        "pretrain": {
            k: v
            for k, v in as_dict(p).items()
            if k not in ("cache_dir", "shipped") and not (k in LATER_KEYS and v == defaults[k])
        },
        "preset": config.model.preset,
        "architecture": get_preset(config.model.preset).to_hf_dict(),
        "dtype": [config.model.dtype, config.model.param_dtype],
        "env": config.env.name,
        "world": world_fingerprint(config.env.name),
        "max_insights": config.insight.max_insights,
        "thinking": config.rollout.thinking,
        "seed": config.seed,
        "recipe": RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def pretrained_dir(config: Settings) -> str:
    """Where the pretrained checkpoint of `config` lives: {cache_dir}/{env}-{preset}-s{seed}-{hash}."""
    cache = config.pretrain.cache_dir or os.path.join("runs", "pretrained")
    env = get_spec(config.env.name).name  # (an import path's ':' never in a file name)
    name = f"{env}-{config.model.preset}-s{config.seed}-{pretrain_key(config)}"
    return os.path.abspath(os.path.join(cache, name))


#: Base policies shipped with the package, named like `pretrained_dir`'s directories (the replication's seeds).
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "replication", "base_policies")


def shipped_dir(config: Settings) -> str | None:
    """The shipped base policy with `config`'s pretraining key, or None (none shipped, or `pretrain.shipped` off).
    Rebuild them after a change to the world or the recipe (`python launch/pretrain.py --config=configs/replicate.py
    --config.seed=S --config.pretrain.shipped=False
    --config.pretrain.cache_dir=rltldr_jax/replication/base_policies`)."""
    if not config.pretrain.shipped:
        return None
    path = os.path.join(SHIPPED_DIR, os.path.basename(pretrained_dir(config)))
    return path if os.path.isfile(os.path.join(path, "pretrain.json")) else None


def find_pretrained(config: Settings) -> str | None:
    """The checkpoint `pretrain` would return without training: the cached one, else the shipped one, else None."""
    cached = pretrained_dir(config)
    if os.path.isfile(os.path.join(cached, "pretrain.json")):
        return cached
    shipped = shipped_dir(config)
    if shipped is not None:
        log.info(
            "base policy: %s, shipped with the package (--config.pretrain.shipped=False pretrains it instead)", shipped
        )
    return shipped


def resume_dir(config: Settings) -> str:
    """Where an unfinished pretraining of `config` keeps its state (an orbax checkpoint, `Checkpointer`): beside the
    checkpoint it will write, `{pretrained_dir}.resume`; removed once that checkpoint is complete."""
    return pretrained_dir(config) + RESUME_SUFFIX


def saved_step(state: str) -> int | None:
    """The step an unfinished pretraining's saved state (`resume_dir`) continues from; None when there is none."""
    if not os.path.isdir(state):
        return None
    with Checkpointer(state, keep=1, create=False) as saved:
        return saved.latest_step()


def build_tokenizer(config: Settings) -> Tokenizer:
    """The world's small tokenizer: BPE on the task messages, insight messages and actions of `TOKENIZER_CORPUS`
    demonstrations (seed 0; their insights reworded as pretraining's, `pretrain.reword_prob`), plus the chat
    scaffolding's words."""
    draw = demonstrations(
        config.env.name,
        insight_prob=1.0,
        max_insights=config.insight.max_insights,
        reword_prob=config.pretrain.reword_prob,
    )
    rng = np.random.default_rng(0)
    texts = ["user\n", "assistant\n", "\n\n"] * 64
    for _ in range(TOKENIZER_CORPUS):
        task, insights, act, _ = draw(rng)
        texts += [task_text(task), act, *(INSIGHT_SCAFFOLD.format(n=n) + text for text, n in insights)]
    return train_chatml_tokenizer(texts, config.pretrain.vocab_size)


def demonstration_example(
    task: Any, insights: tuple[tuple[str, int], ...], act: str, insight_targets: bool, builder: ContextBuilder
) -> Example:
    """One demonstration as a training example: the RL context of its first step with the action as the sampled
    step; the SFT target (`insight_mask`) is the action (+ the insight sentences when `insight_targets`)."""
    tok = builder.tokenizer
    action_ids = (*tok.encode(act), tok.im_end_id)
    ctx = builder.build(task_text(task), [Insight(t, n) for t, n in insights], (), Step(action_ids))
    target = ctx.action_mask | (ctx.insight_mask if insight_targets else False)
    n = len(ctx)
    return Example(ctx.ids, np.zeros(n, np.float32), np.zeros(n, bool), target, 0.0, task.task_id, 0, 0)


def _optimizer(config: Settings) -> optax.GradientTransformation:
    p = config.pretrain
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        p.learning_rate,
        max(1, min(p.warmup_steps, p.steps - 1)),
        max(p.steps, 2),
        end_value=p.learning_rate * 0.05,
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=p.weight_decay))


def pretrain(config: Settings, *, progress: bool = False, on_log: Callable[[int, float], None] | None = None) -> str:
    """Pretrains `config.model.preset` from random weights (seed `config.seed`) on the environment's
    demonstrations, or returns the cached (or shipped, `shipped_dir`) result; returns the checkpoint directory.

    Args:
      config: a validated config with `pretrain.steps > 0`.
      progress: a progress bar over the steps.
      on_log: called with (step, mean NLL of the last steps) about 20 times per run.

    Raises:
      RunStopped: SIGTERM or SIGINT arrived (in the main thread); the state is saved at the next pool of
        demonstrations (`resume_dir`) and the same call continues from it; a second signal stops at once
        (`Interrupted`), continuing later from the last periodic save.
    """
    p = config.pretrain
    if p.steps <= 0:
        raise ValueError("pretrain.steps is 0: nothing to pretrain (set --config.pretrain.steps=N)")
    found = find_pretrained(config)
    if found is not None:
        return found
    out = pretrained_dir(config)
    t0 = time.time()
    tokenizer = build_tokenizer(config)
    arch = get_preset(config.model.preset)
    if tokenizer.vocab_size > arch.vocab_size:
        raise ValueError(
            f"pretrain.vocab_size={p.vocab_size} exceeds the vocabulary of model.preset={config.model.preset} "
            f"({arch.vocab_size}): lower it"
        )
    builder = ContextBuilder(tokenizer, thinking=config.rollout.thinking)
    spec = ModelSpec(arch, dtype=getattr(jnp, config.model.dtype), param_dtype=getattr(jnp, config.model.param_dtype))
    model = spec.build(seed=config.seed)
    mesh, loss_cfg = build(MeshConfig, config.mesh), LossConfig(lam=1.0, grpo_coef=0.0)
    update = ShardedUpdate(mesh, model, _optimizer(config), loss_cfg, micro_batch_size=p.batch_size)
    draw = demonstrations(
        config.env.name,
        insight_prob=p.insight_prob,
        max_insights=config.insight.max_insights,
        statement_prob=p.statement_prob,
        write_prob=p.write_prob,
        reword_prob=p.reword_prob,
    )
    rng = np.random.default_rng([config.seed, 1])
    key = pretrain_key(config)
    saved = Checkpointer(resume_dir(config), keep=1, async_save=False)
    with saved, StopSignals(defer=True) as signals:
        state = _restore(saved, update, rng, key)
        step, curve, window = state["step"], state["curve"], state["window"]
        seconds, resumed = state["seconds"], state["resumed_from"]
        bar = None
        if progress:
            from rltldr_jax import progress as bars

            bar = bars.bar(p.steps, "pretrain", unit="step", initial=step)
        last_save, last_saved_step = time.monotonic(), (step if resumed else None)
        try:
            while step < p.steps:
                # A pool boundary: everything the rest of the run depends on is in the state below.
                due = signals.requested or time.monotonic() - last_save >= SAVE_EVERY_SECONDS
                if due and step != last_saved_step:
                    state = {"key": key, "step": step, "curve": curve, "window": window, "resumed_from": resumed}
                    state["seconds"] = seconds + time.time() - t0
                    saved.save(step, params=update.params, opt_state=update.opt_state, rng=None, meta=_meta(state, rng))
                    last_save, last_saved_step = time.monotonic(), step
                if signals.requested:
                    raise RunStopped(
                        signals.requested,
                        f"pretraining stopped by {signal_name(signals.requested)} at step {step} of {p.steps}; its "
                        f"state is saved in {resume_dir(config)}: the same command continues it",
                    )
                pool = [demonstration_example(*draw(rng), builder) for _ in range(p.batch_size * LENGTH_BUCKETS)]
                pool.sort(key=len)
                for k in range(LENGTH_BUCKETS):
                    if step == p.steps:
                        break
                    (batch,) = pack(
                        pool[k * p.batch_size : (k + 1) * p.batch_size],
                        micro_batch_size=p.batch_size,
                        grad_accum_steps=1,
                        pad_to_multiple=PAD_MULTIPLE,
                    )
                    nll = float(update.step(batch)["sft_nll"])
                    if not np.isfinite(nll):
                        raise FloatingPointError(
                            f"pretraining diverged at step {step} (NLL {nll}): lower pretrain.learning_rate"
                        )
                    window.append(nll)
                    step += 1
                    if bar is not None:
                        bar.update(1)
                    if step % max(1, p.steps // 20) == 0 or step == p.steps:
                        curve.append((step, float(np.mean(window))))
                        window = []
                        if on_log is not None:
                            on_log(*curve[-1])
        finally:
            if bar is not None:
                bar.close()
        requested = signals.requested  # during the last pool: the run is finished and saved, then stops
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(update.model(), tmp)
    tokenizer.save(tmp)
    record = {
        "key": key,
        "seconds": seconds + time.time() - t0,
        "nll_curve": curve,
        "pretrain": as_dict(p),
        "preset": config.model.preset,
        "env": config.env.name,
        "seed": config.seed,
    }
    if resumed:
        record["resumed_from"] = resumed  # the steps a stopped run continued from
    with open(os.path.join(tmp, "pretrain.json"), "w", encoding="utf-8") as f:
        strict_json.dump(record, f, indent=1)  # (a NaN loss as null)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    os.replace(tmp, out)
    shutil.rmtree(resume_dir(config), ignore_errors=True)
    log.info("pretrained %s in %.0f s (final NLL %.4f)", out, record["seconds"], curve[-1][1])
    if requested:
        raise RunStopped(requested, f"stopped by {signal_name(requested)} once pretraining had finished ({out})")
    return out


def _meta(state: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The JSON of a pretraining state: `state` and the demonstrations' generator (its 128-bit integers as text)."""
    gen = rng.bit_generator.state
    return {**state, "rng": {**gen, "state": {k: str(v) for k, v in gen["state"].items()}}}


def _restore(saved: Checkpointer, update: ShardedUpdate, rng: np.random.Generator, key: str) -> dict[str, Any]:
    """The state of the run to continue (its parameters and optimizer state put into `update`, its generator's state
    into `rng`), or a fresh start's when there is none; a damaged one is reported and started afresh."""
    fresh = {"step": 0, "curve": [], "window": [], "seconds": 0.0, "resumed_from": []}
    if saved.latest_step() is None:
        return fresh
    params, opt_state = update.abstract()
    try:
        restored = saved.restore(abstract_params=params, abstract_opt_state=opt_state)
    except CorruptCheckpointError as e:
        log.warning("the saved pretraining state is damaged (%s): pretraining from the start", e)
        return fresh
    meta = restored.meta
    if meta.get("key") != key:
        raise ValueError(
            f"{saved.directory} holds the state of another pretraining (key {meta.get('key')}, not {key}): remove it"
        )
    update.params, update.opt_state = restored.params, restored.opt_state
    gen = meta["rng"]
    rng.bit_generator.state = {**gen, "state": {k: int(v) for k, v in gen["state"].items()}}
    log.info("pretraining continues from step %d (state saved in %s)", meta["step"], saved.directory)
    return {
        "step": meta["step"],
        "curve": [(int(s), float(v)) for s, v in meta["curve"]],
        "window": [float(v) for v in meta["window"]],
        "seconds": float(meta["seconds"]),
        "resumed_from": [*meta["resumed_from"], meta["step"]],
    }


def ensure_pretrained(config: Settings, *, progress: bool = False) -> Settings:
    """`config` itself when it needs no pretraining (pretrain.steps == 0 or model.checkpoint set); else a copy
    whose `model.checkpoint` is the (cached or new) pretrained checkpoint."""
    if config.pretrain.steps <= 0 or config.model.checkpoint:
        return config
    path = pretrain(config, progress=progress)
    return replace(config, {"model.checkpoint": path})
