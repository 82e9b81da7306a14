"""Probes over training that tell why a curve moves (the second replication round): for every kept checkpoint of a
run, on fixed evaluation tasks,

- **oracle vs public plan**: the no-insight, teacher-forced log-probability of the plan that obeys the hidden rules
  (`oracle`) and of the plan the public rules give (`public`), each summed over the plan's action tokens in the
  context an attempt starts from (task message, no insight, generation prompt). A policy that internalised "ores need
  a pickaxe" for an ore no training task holds moves probability from `public` to `oracle` on tier 3 tasks; one that
  learnt targets does not;
- **parameter drift** ‖θ_t − θ_0‖₂ / ‖θ_0‖₂ from the base policy θ_0 (the paper's Table 7 reports Δθ once, after
  training; here it is a curve beside the success curves).

    rows = probe_run("runs/replicate_v2/runs/rltldr-s0", base_dir, sets, builder, plans=world_plans("forge"))

One row per (checkpoint, set): `step`, `env_steps`, `set`, `tasks`, `oracle_logprob` and `public_logprob` (means over
the set's tasks), `oracle_minus_public` (their mean difference), `oracle_preferred` (share of tasks where the oracle
plan is the more likely), `drift`. Step 0 is the base policy. The runs must have kept their checkpoints
(`train.keep_checkpoints` at least the number saved; the second round keeps all).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from rltldr_jax import strict_json
from rltldr_jax.agent.episode import task_text
from rltldr_jax.analysis.reliance import masked_logprob_sums
from rltldr_jax.envs import Task
from rltldr_jax.tokenization import ContextBuilder, Step

#: A plan maker: task -> the action text of a plan for it (one fenced code block, as the policy writes it).
PlanMaker = Callable[[Task], str]


def world_plans(env: str) -> dict[str, PlanMaker]:
    """The two plans the probe compares for `env`'s tasks, from its EnvSpec's `reference_plans`: {"oracle": obeys
    the hidden rules, "public": what public knowledge gives}."""
    from rltldr_jax.envs import get_spec

    reference = get_spec(env).reference_plans
    if reference is None:
        raise ValueError(
            f"env {env!r} has no reference plans: the plan probe compares an oracle and a public plan, which a world "
            "gives as EnvSpec.reference_plans (the crafting worlds craft and forge do)"
        )
    return {name: (lambda task, name=name: reference(task)[name]) for name in ("oracle", "public")}


def plan_rows(builder: ContextBuilder, tasks: Sequence[Task], plan: PlanMaker) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, action mask) per task: the context of an attempt's first step with no insight, the plan as its action
    (+ `<|im_end|>`), the mask over the action tokens."""
    tok = builder.tokenizer
    rows = []
    for task in tasks:
        action = (*tok.encode(plan(task)), tok.im_end_id)
        ctx = builder.build(task_text(task), [], (), Step(action))
        rows.append((np.asarray(ctx.ids, np.int32), np.asarray(ctx.action_mask, bool)))
    return rows


def plan_scores(
    model: Any, builder: ContextBuilder, tasks: Sequence[Task], plans: Mapping[str, PlanMaker], **kwargs: Any
) -> dict[str, np.ndarray]:
    """{plan name: [len(tasks)] summed teacher-forced log-probabilities of that plan per task}; `kwargs` go to
    `masked_logprob_sums` (batch_size, min_length, chunk)."""
    return {name: masked_logprob_sums(model, plan_rows(builder, tasks, plan), **kwargs) for name, plan in plans.items()}


def drift(params: Any, base: Any) -> float:
    """‖θ − θ_0‖₂ / ‖θ_0‖₂ over every array of two parameter trees of one structure (float64 sums)."""
    diff = base_norm = 0.0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base), strict=True):
        x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff += float(np.sum((x - y) ** 2))
        base_norm += float(np.sum(y**2))
    return math.sqrt(diff / base_norm) if base_norm else math.nan


def _env_steps(workdir: str) -> dict[int, int]:
    """phase -> environment steps after it, from the run's metrics.jsonl (training rows)."""
    out: dict[int, int] = {}
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if row.get("kind", "train") != "eval" and "phase" in row and "env_steps" in row:
                    out[int(row["phase"])] = int(row["env_steps"])
    return out


def probe_run(
    workdir: str,
    base_checkpoint: str,
    sets: Mapping[str, Sequence[Task]],
    builder: ContextBuilder,
    *,
    plans: Mapping[str, PlanMaker],
    steps: Sequence[int] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """The probe rows of one run (module docstring): the base policy (step 0, `base_checkpoint`: an HF directory)
    and each kept checkpoint of `{workdir}/checkpoints` (or `steps` of them), on every set of `sets`."""
    from rltldr_jax.checkpoint import Checkpointer, load_model
    from rltldr_jax.models.lora import merged

    if set(plans) != {"oracle", "public"}:
        raise ValueError(f"plans must be oracle and public, got {sorted(plans)}")
    base_model, _ = load_model(base_checkpoint)
    base_params = nnx.state(base_model, nnx.Param)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    ckpt = Checkpointer(ckpt_dir, keep=None, async_save=False, create=False)
    try:
        kept = ckpt.all_steps()
    finally:
        ckpt.close()
    if steps is not None:
        missing = sorted(set(steps) - set(kept))
        if missing:
            raise ValueError(f"{ckpt_dir} has no checkpoint of step(s) {missing} (kept: {kept})")
        kept = sorted(steps)
    env_steps = _env_steps(workdir)
    rows: list[dict[str, Any]] = []
    for step in [0, *kept]:
        model = base_model if step == 0 else load_model(f"{ckpt_dir}:{step}")[0]
        # (a LoRA run's checkpoint holds adapters: its drift is the merged policy's, W + (α/r)·A·B, from the base)
        moved = 0.0 if step == 0 else drift(nnx.state(merged(model), nnx.Param), base_params)
        for name, tasks in sets.items():
            scores = plan_scores(model, builder, tasks, plans, **kwargs)
            gap = scores["oracle"] - scores["public"]
            rows.append(
                {
                    "step": step,
                    "env_steps": env_steps.get(step, 0),
                    "set": name,
                    "tasks": len(tasks),
                    "oracle_logprob": float(scores["oracle"].mean()),
                    "public_logprob": float(scores["public"].mean()),
                    "oracle_minus_public": float(gap.mean()),
                    "oracle_preferred": float((gap > 0).mean()),
                    "drift": moved,
                }
            )
    return rows


#: The evaluation sets probed by default: the held-out tiers (targets, items of trained kinds, the held-out kind).
PROBE_SETS = ("tier2", "tier3", "tier4")


#: Each probed run's rows, kept in its workdir: read again instead of recomputed (e.g. a grid restored from an
#: archive, `replication/archive.py`, whose runs keep no checkpoints).
PROBES_FILE = "probes.json"


def _cached_rows(workdir: str, sets: Sequence[str], num_tasks: int) -> list[dict[str, Any]] | None:
    """The rows saved in `{workdir}/probes.json` when they were probed on `sets` with `num_tasks` and cover every
    checkpoint the run keeps now (None otherwise)."""
    path = os.path.join(workdir, PROBES_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if saved.get("sets") != list(sets) or saved.get("num_tasks") != num_tasks:
        return None
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if os.path.isdir(ckpt_dir):
        from rltldr_jax.checkpoint import Checkpointer

        ckpt = Checkpointer(ckpt_dir, keep=None, async_save=False, create=False)
        try:
            kept = set(ckpt.all_steps())
        finally:
            ckpt.close()
        if not kept <= {r["step"] for r in saved["rows"]}:
            return None
    return strict_json.nan_for_null(saved["rows"])  # (every value is a number but "set")


def probe_grid(
    out: str,
    *,
    arms: Sequence[str] = (),
    sets: Sequence[str] = PROBE_SETS,
    num_tasks: int = 48,
    echo: Callable[[str], None] = print,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """The probe rows (`probe_run`) of every finished run of the grid in `out` (or of `arms`), each with `arm` and
    `seed`: on the first `num_tasks` tasks of each of `sets` (the grid's fixed evaluation order: every run probes
    the same tasks), from each run's own base policy (`model.checkpoint` of its config) and tokenizer. Offline runs
    (SFT baselines) and runs with neither kept checkpoints nor saved rows are skipped. Each run's rows are saved in
    its workdir (`PROBES_FILE`) and read from there next time while they cover its kept checkpoints."""
    from rltldr_jax.agent.eval_set import split_eval_tasks
    from rltldr_jax.replication.grid import finished_runs
    from rltldr_jax.settings import recorded_settings, replace
    from rltldr_jax.tokenization import context_builder
    from rltldr_jax.train.setup import policy_tokenizer

    rows: list[dict[str, Any]] = []
    for summary in finished_runs(out):
        if arms and summary["arm"] not in arms or "config" not in summary:
            continue
        config = recorded_settings(summary["config"])  # (runs of an earlier version: keys added since at defaults)
        if config.mode == "sft":  # (offline: its checkpoints are epochs, not points of a curve over env steps)
            continue
        workdir = summary["workdir"]
        run_rows = _cached_rows(workdir, sets, num_tasks)
        if run_rows is None:
            if not os.path.isdir(os.path.join(workdir, "checkpoints")):
                continue
            chosen = replace(config, {"eval.splits": ",".join(sets), "eval.split_tasks": num_tasks})
            builder = context_builder(config, policy_tokenizer(config))
            tasks = split_eval_tasks(chosen)
            plans = world_plans(config.env.name)
            run_rows = probe_run(workdir, config.model.checkpoint, tasks, builder, plans=plans, **kwargs)
            saved = {"sets": list(sets), "num_tasks": num_tasks, "rows": run_rows}
            tmp = os.path.join(workdir, f"{PROBES_FILE}.tmp-{os.getpid()}")
            with open(tmp, "w", encoding="utf-8") as f:
                strict_json.dump(saved, f, indent=0)  # (a NaN as null: read back as NaN)
            os.replace(tmp, os.path.join(workdir, PROBES_FILE))
            echo(f"probed {summary['arm']} seed {summary['seed']}")
        rows += [{"arm": summary["arm"], "seed": summary["seed"], **row} for row in run_rows]
    return rows


def plot_probes(rows: Sequence[Mapping[str, Any]], path: str) -> str:
    """One panel per probed set (oracle minus public log-probability, mean over seeds per arm, against environment
    steps) and one of parameter drift; returns `path`."""
    from rltldr_jax.analysis.rollouts import new_figure, save_figure

    sets = list(dict.fromkeys(r["set"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig = new_figure(width=4.2 * (len(sets) + 1), height=3.4)
    axes = fig.subplots(1, len(sets) + 1, squeeze=False)[0]
    for ax, (name, key) in zip(
        axes, [*((s, "oracle_minus_public") for s in sets), ("parameter drift", "drift")], strict=True
    ):
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm and (key == "drift" or r["set"] == name)]
            steps = sorted({r["env_steps"] for r in mine})
            means = [np.mean([r[key] for r in mine if r["env_steps"] == s]) for s in steps]
            ax.plot(steps, means, marker="o", ms=3, label=arm)
        ax.set_title(name if key == "drift" else f"{name}: log π(oracle) − log π(public)")
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)
