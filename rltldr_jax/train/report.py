"""What a person reads during a run: one short line per phase and per evaluation, and `metrics.jsonl`.

    log.info(phase_line(3, 1234, metrics))
    # phase 3: 1,234 env steps (+412) | pass@1 0.125 no insight, 0.250 with | 6 insights | sft nll 4.210 | loss 0.532
    #   | 12.3 s collect, 4.5 s update      (one line)
    log.info(eval_line(3, eval_metrics, attempts_per_task=2, seconds=12.3))
    # eval after phase 3: pass@1 0.125, pass@2 0.250 (4 tasks × 2 attempts, 12.3 s)
    MetricsLog(os.path.join(workdir, "metrics.jsonl"), keep_through_phase=0).write("phase", 3, 1234, metrics)
    print(run_summary(workdir, launch_dir="launch", config_args=["--config=configs/sapi.py:tiny"]))  # the end of a run

Non-finite numbers are shown as `nan` / `inf` / `-inf` in the lines, never dropped. `metrics.jsonl` holds one
JSON object per phase and per evaluation: `kind` ("phase" | "eval"), `phase` (phases completed: the checkpoint
step), `env_steps` (cumulative), then every metric by its TensorBoard tag; a non-finite value is written as
`null` (JSON has no NaN; TensorBoard keeps the exact value).
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence

from rltldr_jax import strict_json
from rltldr_jax.distributed import is_main_process

NAN = float("nan")


def fmt(value: float, spec: str = ".3f") -> str:
    """`value` formatted with `spec`; NaN and ±inf as `nan`, `inf`, `-inf`."""
    value = float(value)
    return f"{value:{spec}}" if math.isfinite(value) else str(value)


def phase_line(phase: int, env_steps: int, metrics: Mapping[str, float]) -> str:
    """The one-line summary of a phase (the keys of `Trainer.run_phase`'s metrics; missing ones show as nan).

    Args:
      phase: phases completed (1 after the first).
      env_steps: environment steps so far.
      metrics: the phase's metrics by TensorBoard tag.
    """

    def m(key: str) -> float:
        return metrics.get(key, NAN)

    parts = [
        f"phase {phase}: {env_steps:,} env steps (+{fmt(m('rollout/counts/env_steps'), ',.0f')})",
        f"pass@1 {fmt(m('rollout/pass@1/no_insight'))} no insight, {fmt(m('rollout/pass@1/insight'))} with",
        f"{fmt(m('insight/written'), '.0f')} insights",
    ]
    if metrics.get("update/optimizer_steps", 1.0) == 0:
        parts.append("no update (no examples)")
    else:
        parts += [f"sft nll {fmt(m('update/sft_nll'))}", f"loss {fmt(m('update/loss'), '.4g')}"]
    skipped = metrics.get("update/skipped_nonfinite", 0.0)
    if skipped:
        parts.append(f"{fmt(skipped, '.0f')} steps SKIPPED (non-finite loss or gradient)")
    parts.append(f"{fmt(m('time/collect_s'), '.1f')} s collect, {fmt(m('time/update_s'), '.1f')} s update")
    return " | ".join(parts)


def eval_line(phase: int, metrics: Mapping[str, float], *, attempts_per_task: int, seconds: float) -> str:
    """The one-line summary of an evaluation (`train/evaluation.evaluate`'s `eval/` metrics)."""
    k = attempts_per_task
    tasks = metrics.get("eval/counts/tasks", NAN)
    held_in = ""
    if "eval_train/pass@1/all" in metrics:  # the held-in evaluation (eval.train_num_tasks)
        held_in = (
            f" | training tasks: pass@1 {fmt(metrics['eval_train/pass@1/all'])}, pass@{k} "
            f"{fmt(metrics.get(f'eval_train/pass@{k}/all', NAN))} "
            f"({fmt(metrics.get('eval_train/counts/tasks', NAN), '.0f')} tasks)"
        )
    splits = "".join(  # eval.splits: pass@1 of each set
        f" | {key.removeprefix('eval_').removesuffix('/pass@1/all')} {fmt(value)}"
        for key, value in metrics.items()
        if key.startswith("eval_") and key.endswith("/pass@1/all") and not key.startswith("eval_train/")
    )
    return (
        f"eval after phase {phase}: pass@1 {fmt(metrics.get('eval/pass@1/all', NAN))}, pass@{k} "
        f"{fmt(metrics.get(f'eval/pass@{k}/all', NAN))} "
        f"({fmt(tasks, '.0f')} tasks × {k} attempts{held_in}{splits}, {seconds:.1f} s)"
    )


class MetricsLog:
    """Appends one JSON object per phase / evaluation to `path` (see the module docstring).

    Args:
      path: the file (`{workdir}/metrics.jsonl`); its directory must exist.
      keep_through_phase: records of later phases are dropped when the log is opened (a resumed run redoes
        them; a fresh run passes 0). Lines cut short by a kill are dropped too.
      enabled: whether this process writes; default: process 0 only (a multi-process job has one log).
    """

    def __init__(self, path: str, *, keep_through_phase: int, enabled: bool | None = None):
        self.path = path
        self.enabled = is_main_process() if enabled is None else enabled
        if self.enabled and os.path.exists(path):
            kept = []
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        if json.loads(line)["phase"] <= keep_through_phase:
                            kept.append(line if line.endswith("\n") else line + "\n")
                    except (ValueError, KeyError, TypeError):
                        continue
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(tmp, path)

    def write(self, kind: str, phase: int, env_steps: int, metrics: Mapping[str, float]) -> None:
        """Appends one record (`kind` "phase" or "eval") and closes the file, so a kill loses nothing written."""
        if not self.enabled:
            return
        record = {"kind": kind, "phase": phase, "env_steps": env_steps, **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(strict_json.dumps(record) + "\n")


def run_summary(workdir: str, *, launch_dir: str | None, config_args: Sequence[str], rollouts: bool = True) -> str:
    """Where a finished run's outputs are and the commands that read them.

    Args:
      workdir: the run's workdir.
      launch_dir: the launchers' directory as the user reaches it (e.g. `launch`, from the repository root); None
        for the console scripts (`rltldr-eval`, ...).
      config_args: the run's `--config...` / `--ablation` arguments, repeated in the evaluation command.
      rollouts: whether the run saved its rollouts (`rollout.save_rollouts`).
    """
    q = shlex.quote
    outputs = [
        ("checkpoints", os.path.join(workdir, "checkpoints")),
        ("TensorBoard", os.path.join(workdir, "tb")),
        ("metrics", os.path.join(workdir, "metrics.jsonl")),
        ("config", os.path.join(workdir, "config.json")),
    ]
    if rollouts:
        outputs.append(("rollouts", os.path.join(workdir, "rollouts")))
    lines = [f"outputs in {workdir}:", *(f"  {what:<13}{path}" for what, path in outputs), "next:"]
    lines.append(f"  tensorboard --logdir {q(os.path.join(workdir, 'tb'))}")

    def launcher(name: str) -> str:
        if launch_dir is None:
            return "rltldr-" + name.replace("_", "-")
        return f"python {q(os.path.join(launch_dir, name + '.py'))}"

    evaluate = [
        launcher("eval"),
        *map(q, config_args),
        q(f"--checkpoint={os.path.join(workdir, 'checkpoints')}"),
    ]
    lines.append("  " + " ".join(evaluate))
    if rollouts:
        lines.append(f"  {launcher('analyze_rollouts')} {q(f'--run={workdir}')}")
    return "\n".join(lines)
