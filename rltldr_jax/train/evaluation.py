"""Evaluation (§4.1, App. D.1): held-out tasks, a fixed number of attempts per task, no insights.

    metrics, result = evaluate(engine, builder, config, make_env=..., tag=phase)
    metrics["eval/pass@1/all"], metrics["eval/pass@8/all"]       # macro over tasks

Every task gets exactly `eval.attempts_per_task` attempts (the collector's exact mode: an evaluation must not
give easy tasks more samples), with the insight schedule "never" and no insight writer, so the policy one-shots
every attempt as at test time. Pass@k is the unbiased estimator averaged over tasks (metrics.py). The tasks
(`eval_tasks`) and the metrics' view of the attempts (`attempt_records`) are `agent.eval_set`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from rltldr_jax import strict_json
from rltldr_jax.agent.collector import Collector, PhaseResult
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.eval_set import attempt_records, eval_tasks, split_eval_tasks
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.chat_template import check_chat_format
from rltldr_jax.engines.engine import GenerationEngine
from rltldr_jax.envs import Env, Task, get_spec
from rltldr_jax.metrics import summarize
from rltldr_jax.settings import Settings
from rltldr_jax.tokenization import ContextBuilder, Tokenizer, context_builder, load_tokenizer


def evaluate(
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: Settings,
    *,
    make_env: Callable[[], Env],
    tag: int = 0,
    tasks: list[Task] | None = None,
    progress: bool = False,
    prefix: str = "eval",
) -> tuple[dict[str, float], PhaseResult]:
    """Runs the evaluation and returns (metrics under `{prefix}/`, the attempts).

    Args:
      engine: the policy's engine (its current weights are evaluated).
      builder: the context builder.
      config: the run's config (`eval.*`, rollout budgets and sampling).
      make_env: builds one environment.
      tag: distinguishes evaluations in the sampling seeds (the trainer passes its phase); seeds never collide
        with training phases (those use tags >= 0, evaluations -1 - tag).
      tasks: the tasks (default: `eval_tasks(config)`).
      progress: a progress bar.
      prefix: the metrics' prefix ("eval" for held-out tasks, "eval_train" for the held-in evaluation).
    """
    tasks = eval_tasks(config) if tasks is None else tasks
    k = config.eval.attempts_per_task
    collector = Collector(
        engine,
        make_env,
        builder,
        EpisodeConfig.of(config),
        InsightSchedule("never"),
        None,
        group_size=k,
        exact_group_size=True,
        progress=progress,
    )
    result = collector.collect(tasks, phase=-1 - tag)
    metrics = {f"{prefix}/{name}": v for name, v in summarize(attempt_records(result), k).items()}
    probes = get_spec(config.env.name).evaluation_probes
    if probes is not None:
        metrics |= {f"{prefix}/probe/{name}": v for name, v in probe_means(result, probes).items()}
    return metrics, result


def probe_means(
    result: PhaseResult, probes: Callable[[Task, str | None, bool], Mapping[str, float]]
) -> dict[str, float]:
    """{name: mean over the attempts that report it} of an environment's `evaluation_probes` (EnvSpec), each attempt
    probed on its last executed code (None when it executed none), in sorted name order."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for a in result.attempts:
        code = a.steps[-1].code if a.steps else None
        for name, value in probes(a.task, code, a.success).items():
            sums[name] = sums.get(name, 0.0) + float(value)
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sorted(sums)}


def evaluate_all(
    engine: GenerationEngine,
    builder: ContextBuilder,
    config: Settings,
    *,
    make_env: Callable[[], Env],
    tag: int = 0,
    sets: dict[str, list[Task]] | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Every evaluation of a run, each with `evaluate`: the held-out tasks (`eval/`), `eval.train_num_tasks` training
    tasks (`eval_train/`, when > 0) and every set of `eval.splits` (`eval_<split>/`; `sets`: those sets already
    loaded, `split_eval_tasks(config)`). A set of the same tasks as the held-out one (env.eval_split listed in
    eval.splits, all its tasks in both) is not evaluated twice: its metrics are the held-out evaluation's."""
    run = functools.partial(evaluate, engine, builder, config, make_env=make_env, tag=tag, progress=progress)
    held_out = eval_tasks(config)
    metrics = run(tasks=held_out)[0]
    if config.eval.train_num_tasks:  # held-in: training tasks, evaluated the same way
        metrics |= run(tasks=eval_tasks(config, on_train_split=True), prefix="eval_train")[0]
    for split, tasks in (split_eval_tasks(config) if sets is None else sets).items():
        if {t.task_id for t in tasks} == {t.task_id for t in held_out}:  # the held-out set itself: not run twice
            metrics |= {
                f"eval_{split}/{k.removeprefix('eval/')}": v for k, v in metrics.items() if k.startswith("eval/")
            }
            continue
        metrics |= run(tasks=tasks, prefix=f"eval_{split}")[0]  # the same fixed sets for every run seed
    return metrics


#: A tokenizer source: a tokenizer.json file (absolute, resolved), or BUILTIN_TOKENIZER for Qwen 3.5's built-in one.
BUILTIN_TOKENIZER = "(built-in)"


@dataclasses.dataclass(frozen=True)
class EvalPolicy:
    """The policy `launch/eval.py` evaluates.

    Attributes:
      model: the Qwen35 model.
      what: a one-line description ("training checkpoint DIR step N", "HF checkpoint DIR", ...).
      step: the training checkpoint's step (None for an HF directory or the random initialisation).
      tokenizer: the tokenizer the policy was trained with (see `eval_policy`).
    """

    model: Any
    what: str
    step: int | None
    tokenizer: Tokenizer


def _tokenizer_source(path: str | None) -> str:
    """The source `load_tokenizer(path)` reads: `path`'s tokenizer.json (resolved), or BUILTIN_TOKENIZER."""
    if not path:
        return BUILTIN_TOKENIZER
    path = os.path.abspath(path)
    return os.path.realpath(os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path)


def _load(source: str) -> Tokenizer:
    return load_tokenizer(None if source == BUILTIN_TOKENIZER else source)


def _show_tokenizer(source: str) -> str:
    what = "the built-in Qwen 3.5 tokenizer" if source == BUILTIN_TOKENIZER else source
    return f"{what} ({_load(source).vocab_size} ids)"


def _same_tokenizer(a: str, b: str) -> bool:
    """Whether two tokenizer sources hold the same tokenizer (the same file, or files of the same content)."""
    if a == b:
        return True
    with tempfile.TemporaryDirectory() as tmp:
        texts = []
        for i, source in enumerate((a, b)):
            _load(source).save(os.path.join(tmp, f"{i}.json"))
            with open(os.path.join(tmp, f"{i}.json"), "rb") as f:
                texts.append(f.read())
    return texts[0] == texts[1]


def _checkpoint_policy(directory: str, step: int | None) -> tuple[Any, str | None, dict[str, Any] | None]:
    """(architecture, tokenizer source, recorded run config) of a checkpoint, read without its weights.

    An HF directory: its config.json and its own tokenizer.json (None if it has none). A training checkpoint: the
    architecture recorded with it (None if none) and its run's tokenizer (the recorded config's `tokenizer`, else
    its `model.checkpoint`'s, else the built-in one; None if it records no config)."""
    from rltldr_jax.checkpoint import Checkpointer
    from rltldr_jax.models import Qwen35Config

    if os.path.isfile(os.path.join(directory, "config.json")):
        own = os.path.join(directory, "tokenizer.json")
        return Qwen35Config.from_pretrained(directory), (_tokenizer_source(own) if os.path.isfile(own) else None), None
    with Checkpointer(directory, keep=None, async_save=False, create=False) as ckpt:
        step, state, meta = ckpt.read_state(step)
    arch = None if state.get("model_config") is None else Qwen35Config.from_hf_dict(state["model_config"])
    recorded = meta.get("config")
    if not isinstance(recorded, dict):
        return arch, None, None
    source = recorded.get("tokenizer") or (recorded.get("model") or {}).get("checkpoint")
    return arch, _tokenizer_source(source), recorded


def _config_policy(config: Settings) -> tuple[Any, str | None, str]:
    """(architecture or None, tokenizer source or None, description) of the policy the config itself names, if it
    names one: `tokenizer`, `model.checkpoint`, or the pretrained base policy of `pretrain.*` (its architecture is
    `model.preset`; its tokenizer is compared when it is already cached or shipped: nothing is pretrained here)."""
    from rltldr_jax.models import Qwen35Config, get_preset
    from rltldr_jax.train.pretrain import pretrained_dir, shipped_dir

    arch, tokenizer, what = None, None, []
    if config.model.checkpoint:
        arch = Qwen35Config.from_pretrained(config.model.checkpoint)
        tokenizer = _tokenizer_source(config.model.checkpoint)
        what.append(f"model.checkpoint={config.model.checkpoint}")
    elif config.pretrain.steps > 0:
        arch = get_preset(config.model.preset)
        base = pretrained_dir(config)
        base = base if os.path.isfile(os.path.join(base, "pretrain.json")) else shipped_dir(config)
        tokenizer = None if base is None else _tokenizer_source(base)
        what.append(f"model.preset={config.model.preset} pretrained by pretrain.*, steps={config.pretrain.steps}")
    if config.tokenizer:
        tokenizer = _tokenizer_source(config.tokenizer)
        what.append(f"tokenizer={config.tokenizer}")
    return arch, tokenizer, " and ".join(what)


def _check_policy(
    config: Settings, checkpoint: str, arch: Any, own: str | None, recorded: dict[str, Any] | None
) -> None:
    """Raises ValueError (one line, naming both) when the checkpoint's architecture `arch` or tokenizer `own`
    differs from the policy the config names (`_config_policy`)."""
    pinned_arch, pinned_tokenizer, what = _config_policy(config)
    problems = []
    if arch is not None and pinned_arch is not None and arch != pinned_arch:
        ours, theirs = arch.to_hf_dict(), pinned_arch.to_hf_dict()
        diff = [
            f"{k} {ours.get(k)!r} vs {theirs.get(k)!r}"
            for k in ours
            if ours.get(k) != theirs.get(k) and not isinstance(ours.get(k), (list, dict))
        ]
        problems.append(", ".join(diff[:5]) + (", …" if len(diff) > 5 else "") if diff else "layer_types differ")
    if own is not None and pinned_tokenizer is not None and not _same_tokenizer(own, pinned_tokenizer):
        problems.append(f"tokenizer {_show_tokenizer(own)} vs {_show_tokenizer(pinned_tokenizer)}")
    if problems:
        trained = ""
        if recorded is not None:
            model_cfg = recorded.get("model") or {}
            trained = (
                f" (its run: env.name={(recorded.get('env') or {}).get('name')}, "
                f"model.preset={model_cfg.get('preset')}, model.checkpoint={model_cfg.get('checkpoint') or '-'}, "
                f"tokenizer={recorded.get('tokenizer') or '-'})"
            )
        raise ValueError(
            f"{checkpoint} does not match the policy the config names ({what}): the checkpoint's vs the config's "
            + "; ".join(problems)
            + f"; evaluate it with a config that matches it{trained}"
        )


def eval_policy(config: Settings, checkpoint: str | None, *, progress: bool = False) -> EvalPolicy:
    """The policy `launch/eval.py` evaluates, with its own tokenizer.

    Which policy: `checkpoint` (an HF directory or a training checkpoint directory `DIR[:STEP]`), else the latest
    checkpoint of the config's workdir, else `model.checkpoint`, else the base policy of `pretrain.*` (pretrained
    now if it is not cached: the only case that pretrains), else the tiny preset's random initialisation.

    Its tokenizer: an HF directory's own tokenizer.json; a training checkpoint's run's tokenizer (recorded in its
    config); else (an HF directory without one, the random initialisation) the config's (`tokenizer`, else
    `model.checkpoint`'s, else the built-in Qwen 3.5 one). When the config itself names a policy (`tokenizer`,
    `model.checkpoint`, or pretraining), a checkpoint whose architecture or tokenizer differs from it is refused
    (ValueError, one line naming both): a config's budgets and tokenizer are meant for its own policy.

    Raises:
      ValueError: the checkpoint does not match the config's policy, its tokenizer has more ids than the model's
        vocabulary, or there is nothing to evaluate; CorruptCheckpointError (a ValueError) for damaged files.
      FileNotFoundError: no such checkpoint (or tokenizer).
    """
    import jax.numpy as jnp

    from rltldr_jax.checkpoint import Checkpointer, load_model, split_step
    from rltldr_jax.models import ModelSpec, get_preset
    from rltldr_jax.train.setup import policy_tokenizer, workdir_of

    dtype = getattr(jnp, config.model.dtype)
    if checkpoint is None:
        run = os.path.join(workdir_of(config), "checkpoints")
        if os.path.isdir(run):
            with Checkpointer(run, keep=None, async_save=False, create=False) as ckpt:
                checkpoint = run if ckpt.latest_step() is not None else None
        if checkpoint is None and config.model.checkpoint:
            checkpoint = config.model.checkpoint
        elif checkpoint is None and config.pretrain.steps > 0:
            from rltldr_jax.train.pretrain import ensure_pretrained

            checkpoint = ensure_pretrained(config, progress=progress).model.checkpoint
    if checkpoint is None:
        if config.model.preset != "tiny":
            raise ValueError(
                f"nothing to evaluate: no checkpoint in {workdir_of(config)}/checkpoints and no model.checkpoint; give "
                "--checkpoint=DIR (an HF directory or a run's checkpoints, DIR:STEP for a given step)"
            )
        spec = ModelSpec(get_preset("tiny"), dtype=dtype, param_dtype=getattr(jnp, config.model.param_dtype))
        what = "the tiny preset's random initialisation"
        return EvalPolicy(spec.build(seed=config.seed), what, None, policy_tokenizer(config))
    directory, step = split_step(checkpoint)
    known = os.path.isfile(os.path.join(directory, "config.json"))  # an HF directory, or a saved training step
    if not known and os.path.isdir(directory):
        with Checkpointer(directory, keep=None, async_save=False, create=False) as ckpt:
            steps = ckpt.all_steps()
        step = steps[-1] if step is None and steps else step
        known = step in steps
    own = None
    if known:  # (otherwise load_model says what is wrong)
        arch, own, recorded = _checkpoint_policy(directory, step)
        _check_policy(config, checkpoint, arch, own, recorded)  # before any weight is read
    model, what = load_model(
        f"{directory}:{step}" if step is not None else directory,
        compute_dtype=dtype,
        param_dtype=getattr(jnp, config.model.param_dtype),
        allow_nonfinite=config.model.allow_nonfinite,
    )
    if own is not None:
        try:
            tokenizer = _load(own)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"the tokenizer {checkpoint} was trained with is gone: {e}") from None
    else:
        tokenizer = policy_tokenizer(config)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"{checkpoint}: its tokenizer has {tokenizer.vocab_size} ids but the model only {model.config.vocab_size} "
            "(vocab_size): they do not belong together; give the tokenizer it was trained with (--config.tokenizer)"
        )
    return EvalPolicy(model, what, step, tokenizer)


def policy_for_eval(config: Settings, checkpoint: str | None) -> tuple[Any, str, int | None]:
    """(model, description, training step or None) of `eval_policy(config, checkpoint)`."""
    policy = eval_policy(config, checkpoint)
    return policy.model, policy.what, policy.step


def evaluate_checkpoint(config: Settings, checkpoint: str | None = None, out: str | None = None) -> dict[str, Any]:
    """What `launch/eval.py` does: evaluates a checkpoint, writes the JSON report, prints the headline numbers.

    The sampling seeds are those of the trainer's own evaluation after phase `step` (the checkpoint's step), so
    evaluating training checkpoint N repeats the in-training evaluation after phase N (exactly, one task at a
    time). With engine.kind=jax_grpc|sglang the weights are pushed to the running servers first.

    Returns:
      The report: policy, env, split, attempts_per_task, seconds, metrics, per_task successes.
    """
    from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine
    from rltldr_jax.train.setup import env_maker, workdir_of

    policy = eval_policy(config, checkpoint, progress=sys.stderr.isatty())
    model, what, step = policy.model, policy.what, policy.step
    builder = context_builder(config, policy.tokenizer)
    check_chat_format(builder)  # our contexts = the checkpoint's chat template
    workdir = workdir_of(config)
    engine = policy_engine(EngineConfig.of(config), model, workdir=workdir)
    t0 = time.time()
    try:
        if config.engine.kind != "jax":
            engine.update_weights(model, engine.weight_version + 1)  # serve exactly the evaluated weights
        metrics, result = evaluate(
            engine, builder, config, tag=step or 0, progress=sys.stderr.isatty(), make_env=env_maker(config)
        )
    finally:
        close_engine(engine)
    per_task = {tid: [a.success for a in group] for tid, group in result.groups().items()}
    report = {
        "policy": what,
        "env": config.env.name,
        "split": config.env.eval_split,
        "attempts_per_task": config.eval.attempts_per_task,
        "seconds": round(time.time() - t0, 1),
        "metrics": metrics,
        "per_task": per_task,
    }
    if out is None:
        tag = os.path.basename(os.path.normpath(checkpoint.replace(":", "_"))) if checkpoint else "latest"
        out = os.path.join(workdir, "eval", f"eval_{tag}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        strict_json.dump(report, f, indent=1, default=float)  # (a NaN metric as null)
    k = config.eval.attempts_per_task
    print(f"{what}: {len(per_task)} tasks × {k} attempts of {config.env.name}/{config.env.eval_split}")
    print(f"  macro Pass@1 = {metrics['eval/pass@1/all']:.4f}   macro Pass@{k} = {metrics[f'eval/pass@{k}/all']:.4f}")
    print(f"  written to {out}")
    return report
