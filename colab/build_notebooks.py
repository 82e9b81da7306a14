"""Writes the colab/ notebooks from the cell sources below, so that they are reviewed (and diffed) as code.

    python colab/build_notebooks.py            # (re)write colab/*.ipynb
    python colab/build_notebooks.py --check    # exit 1 if a notebook differs from what this script writes

Every notebook is nbformat 4.5 JSON with empty outputs. Code cells are plain Python (no `!`/`%` magics), so
tests/test_notebooks.py can run them top to bottom in a subprocess. Edit the cells here, rerun this script and
commit both.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------------------
# Shared cells
# ----------------------------------------------------------------------------------------------------

SETUP_MD = """\
## 0. Set-up

Run this cell first. In **Colab** it clones the repository (set `REPO_URL` to your copy of it) and installs it
with `pip` (the CUDA build of JAX on a GPU runtime, `jax[tpu]` on a TPU runtime; about 2 minutes; if `pip`
upgraded a package Colab had already imported, use *Runtime → Restart session* and run the cell again).
**Locally** it finds the checkout this notebook lives in (install it first with `pip install -e .`).

The notebooks work from the repository root. Two environment variables change their behaviour:

- `RLTLDR_NOTEBOOK_WORKDIR`: the run directory that notebook 1 writes and notebooks 2 and 3 read
  (default `runs/colab-tiny`).
- `RLTLDR_NOTEBOOK_TEST=1`: test mode (`tests/test_notebooks.py`): the smallest sizes that still exercise every
  step (1 task per phase, 2 attempts, 2 phases, a few tokens per step), and nothing is downloaded."""

SETUP_CODE = '''\
import logging
import os
import shutil
import subprocess
import sys

IN_COLAB = "google.colab" in sys.modules
TEST_MODE = os.environ.get("RLTLDR_NOTEBOOK_TEST") == "1"  # tiny sizes, no network (tests/test_notebooks.py)
REPO_URL = os.environ.get("RLTLDR_REPO_URL", "https://github.com/REPLACE-ME/rltldr_jax.git")  # your copy of the repo


def find_repo(start):
    """The first directory at or above `start` that holds the rltldr_jax checkout, or None."""
    path = os.path.abspath(start)
    while True:
        if os.path.isdir(os.path.join(path, "rltldr_jax")) and os.path.isdir(os.path.join(path, "configs")):
            return path
        if os.path.dirname(path) == path:
            return None
        path = os.path.dirname(path)


def pip_install(*args):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


REPO_ROOT = find_repo(os.getcwd()) or find_repo(os.path.join(os.getcwd(), "rltldr_jax"))
if REPO_ROOT is None and IN_COLAB:
    subprocess.run(["git", "clone", "--depth=1", REPO_URL, "rltldr_jax"], check=True)
    REPO_ROOT = os.path.abspath("rltldr_jax")
if REPO_ROOT is None:
    raise RuntimeError("run this notebook from a checkout of rltldr_jax (it lives in colab/), or in Colab with REPO_URL set")
INSTALLED_MARKER = "/tmp/rltldr_jax_installed"  # one install per Colab runtime
if IN_COLAB and not os.path.exists(INSTALLED_MARKER):
    if shutil.which("nvidia-smi"):
        pip_install("-e", f"{REPO_ROOT}[gpu]")
    elif os.environ.get("COLAB_TPU_ADDR") or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"):
        pip_install("-e", REPO_ROOT, "jax[tpu]>=0.10.2,<0.11")
    else:
        pip_install("-e", REPO_ROOT)
    open(INSTALLED_MARKER, "w").close()

os.chdir(REPO_ROOT)
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)  # configs/ and launch/ are directories of the repository, not installed packages
logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every checkpoint operation at INFO

WORKDIR = os.path.abspath(os.environ.get("RLTLDR_NOTEBOOK_WORKDIR") or os.path.join("runs", "colab-tiny"))
CKPT_DIR = os.path.join(WORKDIR, "checkpoints")
print(f"repository {REPO_ROOT}\\nrun directory {WORKDIR}\\ntest mode: {TEST_MODE}, Colab: {IN_COLAB}")


def print_table(rows, columns, headers=None):
    """Prints dict rows as a fixed-width table (floats with 4 significant digits)."""
    headers = headers or columns
    cells = [[f"{r.get(c, float('nan')):.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in columns]
             for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
'''

SHOW_PNG_CODE = '''\


def show_png(path, width=7.0):
    """Shows a PNG the analysis wrote (inline in a notebook; a no-op under the Agg backend)."""
    import matplotlib.pyplot as plt

    image = plt.imread(path)
    fig, ax = plt.subplots(figsize=(width, width * image.shape[0] / image.shape[1]))
    ax.imshow(image)
    ax.axis("off")
    plt.show()
    plt.close(fig)
'''

NEEDS_RUN_CODE = '''\
from rltldr_jax.checkpoint import Checkpointer

if not os.path.isdir(CKPT_DIR):
    raise FileNotFoundError(
        f"no checkpoints in {CKPT_DIR}: run 01_replicate_small.ipynb first (with the same RLTLDR_NOTEBOOK_WORKDIR)"
    )
with Checkpointer(CKPT_DIR, keep=None, async_save=False, create=False) as _ckpt:
    STEPS = _ckpt.all_steps()
FIRST, LAST = STEPS[0], STEPS[-1]
print(f"checkpoints of {WORKDIR}: steps {STEPS} (step 0 = the initial policy, step N = after N phases)")
'''

# ----------------------------------------------------------------------------------------------------
# 01: train the tiny preset, metrics, curves, evaluation; Qwen 3.5 0.8B on a GPU/TPU
# ----------------------------------------------------------------------------------------------------

NB1 = [
    ("md", """\
# RLTL;DR, small scale (1/3): the replication, then one run up close

[RLTL;DR](https://arxiv.org/abs/2609.37633) trains LLM agents with RL on tasks so hard that plain GRPO gets no
reward signal. A task is attempted K times in a row; after each failed attempt the policy reads the verifier's
failed tests and writes a one-sentence **TL;DR insight**; later attempts of the same task see the insights as user
messages. The update is `L_GRPO + λ·L_SFT`, where `L_SFT` trains the insight tokens given only the task (λ = 0.5),
so the policy internalises what the insights say and no longer needs them at test time.

What the paper reports (Qwen 3.5 9B, SAPI / AppWorld / LeetCode splits where Pass@128 = 0): GRPO stays at 0–1 %
Pass@1; RLTL;DR reaches 12–13 % Pass@1 *without* insights in context. On the 642-task SAPI split (Table 2): eval
Pass@1 18.9 % with λ = 0.5, 13.2 % with λ = 0.

This notebook:

1. runs the **small-scale replication** (`configs/replicate.py:quick`): a 0.25M-parameter Qwen 3.5 pretrained from
   scratch in a crafting world with hidden rules, then GRPO and RLTL;DR on the hard tasks (Pass@64 = 0 for the
   base policy), and shows the table and the curves (minutes on a CPU);
2. trains the `tiny` preset (a tiny *random* Qwen 3.5 in our SAPI-like world) one phase at a time through the
   Python API, shows its metrics and TensorBoard curves, and evaluates it with `launch/eval.py`;
3. optionally trains a real **Qwen 3.5 0.8B** from the Hugging Face hub on a Colab GPU or TPU.

Notebook 2 measures how far the weights moved (Δθ, Table 7); notebook 3 analyses the saved rollouts and
insights of part 2's run."""),
    ("md", SETUP_MD),
    ("code", SETUP_CODE + SHOW_PNG_CODE),
    ("md", """\
## 1. The replication: GRPO vs RLTL;DR where GRPO gets no signal

The world (`rltldr_jax/envs/craft.py`): items are gathered (`gather("wood")`) or crafted from ingredients
(`craft("torch")`); an attempt is one Python code block, the plan, one call per line. Three **hidden rules** — iron
needs a torch, diamond a pickaxe, clay a shovel — are in no public text; only the verifier's failed test reveals
them, and the rule-based insight writer turns it into the TL;DR, e.g. `Make sure that you have "torch" before
gather("iron").` The policy (`replicate_xs`, the Qwen 3.5 architecture at width 64) is first pretrained from scratch
on public-rule plans, some obeying made-up requirements written like insights, so it can act on an insight in
context (never on a hidden rule). The hard tasks are those the public plan fails; held-out targets are never
trained on.

`run_replication` does what `python launch/replicate.py --config=configs/replicate.py:quick` does: per seed,
pretraining (cached), the base policy's checks (App. B: i.i.d. Pass@64 on the hard tasks must be 0; the
insight exploration curves of Fig. 11), then every arm as an ordinary `Trainer` run, and the report. The full grid
(every arm of Table 2's λ question, 3 seeds, hours on 2 CPU cores) is `--config=configs/replicate.py`; the `gpu`
preset (a 14M-parameter policy, 10 seeds) is `--config=configs/replicate.py:gpu` on a GPU runtime."""),
    ("code", '''\
from configs import replicate
from rltldr_jax.replication.driver import run_replication

PRESET = "smoke" if TEST_MODE else "quick"  # test mode: seconds, nothing meaningful learned
ARMS = replicate.GRIDS[PRESET][0]
REPLICATE_OUT = os.path.join(os.path.dirname(WORKDIR), f"colab-replicate-{PRESET}")  # next to the run of part 2
# Pretrained policies are cached by their settings (runs/pretrained by default, shared with launch/replicate.py).
CACHE = os.path.join(REPLICATE_OUT, "pretrained") if TEST_MODE else os.path.join(REPO_ROOT, "runs", "pretrained")
grid = {(arm, 0): replicate.arm_config(PRESET, arm, 0, {"pretrain.cache_dir": CACHE}) for arm in ARMS}
for name in ("rltldr_jax.train.loop", "rltldr_jax.train.sft"):
    logging.getLogger(name).setLevel(logging.WARNING)  # one summary line per run instead of one per phase
paths = run_replication(grid, REPLICATE_OUT, title=f"Small-scale replication ({PRESET})",
                        checks=replicate.CHECKS[PRESET], progress=not TEST_MODE)
print(open(os.path.join(REPLICATE_OUT, "results.md")).read())
show_png(os.path.join(REPLICATE_OUT, "curves.png"), width=10)
show_png(os.path.join(REPLICATE_OUT, "insight_curves.png"), width=5)
'''),
    ("md", """\
## 2. One run up close: the `tiny` preset, phase by phase

The rest of this notebook (and notebooks 2 and 3) works on one small run of the paper's SAPI-like setting, to show
the machinery: the configuration, `Trainer.run_phase()`, the logged metrics, TensorBoard, checkpoints and
`launch/eval.py`. Its policy is a tiny *random* Qwen 3.5 with the real 248k-token vocabulary (about 8 minutes on 2
CPU cores): it never solves a task, so what moves is L_SFT lowering the NLL of the inserted insights."""),
    ("md", """\
### 2.1 The configuration

`configs/sapi.py` holds the paper's SAPI setup; its `tiny` preset (`configs/base.py:apply_tiny`) shrinks it to a
tiny random Qwen 3.5 on the embedded JAX engine: 3 phases of 2 tasks × ≥ 4 attempts, at most 3 actions of
16 + 48 tokens per attempt, rule-based insights (`insight.source="verifier"`: the first failed requirement
turned into a sentence, since a random model cannot write one), and `loss.sft_on_filtered=True` (a random policy
never succeeds, so every group has zero advantage and only L_SFT can move it). Every key is documented in
`configs/base.py`; `base.override` sets dotted keys, `base.validate` checks ranges and combinations.

We also keep every checkpoint (`train.keep_checkpoints`), and below we save one before training (step 0): the
"original policy" that notebook 2 compares the trained one with."""),
    ("code", '''\
from configs import base, sapi

config = sapi.get_config("tiny")
base.override(config, {"workdir": WORKDIR})
if TEST_MODE:  # seconds instead of minutes: one task per phase, two attempts, a few tokens per step
    base.override(config, {
        "train.max_phases": 2, "rollout.tasks_per_phase": 1, "rollout.group_size": 2, "rollout.exact_group_size": True,
        "rollout.max_steps": 2, "rollout.max_think_tokens": 4, "rollout.max_action_tokens": 8, "batch.ppo_epochs": 1,
        "batch.micro_batch_size": 2, "batch.pad_to_multiple": 512, "eval.num_tasks": 1, "eval.attempts_per_task": 2,
        # keep the all-failure group so its actions reach the GRPO term (ratio and clip fraction are measured)
        "loss.filter_zero_advantage": False, "loss.positive_ratio": 0.0,
    })  # fmt: skip
base.override(config, {"train.keep_checkpoints": config.train.max_phases + 1})
config = base.validate(config)

for key in ("model.preset", "env.name", "train.max_phases", "rollout.tasks_per_phase", "rollout.group_size",
            "rollout.max_steps", "rollout.max_think_tokens", "rollout.max_action_tokens", "insight.source",
            "insight.schedule", "loss.lam", "optim.learning_rate", "eval.num_tasks", "eval.attempts_per_task"):
    print(f"{key:28} {base.get(config, key)}")
'''),
    ("md", """\
### 2.2 Train

`Trainer(config)` builds everything from the config: the model, the optimizer and its sharding, the engine,
the task source, the insight writer and schedule, the collector, checkpoints and TensorBoard. `run_phase()` runs
one phase:

1. **collect**: `rollout.tasks_per_phase` tasks, each attempted `rollout.group_size` times in a row; after a
   failed attempt an insight is written, and later attempts of the task get the insights in context (when the
   task's running success rate is ≤ 0.5, `insight.schedule="threshold"`);
2. **examples**: one training example per action step, with the group advantage, the action mask (GRPO targets)
   and the flipped insight mask (SFT targets);
3. **update**: `batch.ppo_epochs` passes of the jitted `L_GRPO + λ·L_SFT` step, then the new weights go to the
   engine (weight version = phase);
4. **log and save**: TensorBoard scalars at the environment-step count, a checkpoint, the rollouts as JSON lines.

`evaluate()` runs the held-out tasks (exactly `eval.attempts_per_task` attempts each, no insights) and logs
`eval/*`; `close()` waits for the last checkpoint and stops the engine. (`trainer.run()` does all of this in one
call; `python launch/train.py --config=configs/sapi.py:tiny` is the same from the shell.)

Set `RESUME = True` to continue an interrupted run in `WORKDIR`; otherwise it starts from scratch."""),
    ("code", '''\
import math
import time

from rltldr_jax.train.loop import Trainer

RESUME = False
if not RESUME and os.path.isdir(WORKDIR):
    shutil.rmtree(WORKDIR)  # a fresh run: checkpoints of an earlier run would clash with the new ones

history = []  # the metrics of every phase
trainer = Trainer(config, resume=RESUME)
try:
    if trainer.phase == 0:
        trainer.save()  # checkpoint 0: the initial policy (notebook 2 compares it with the trained one)
    while not trainer.done():
        t0 = time.time()
        metrics = trainer.run_phase()
        history.append({"phase": trainer.phase, **metrics})
        print(f"phase {trainer.phase}: {metrics['rollout/counts/attempts']:.0f} attempts, "
              f"{trainer.env_steps} environment steps so far, Pass@1 {metrics['rollout/pass@1/all']:.3f}, "
              f"SFT NLL {metrics.get('update/sft_nll', math.nan):.3f} ({time.time() - t0:.0f} s)")
        if config.eval.every and trainer.phase % config.eval.every == 0:
            trainer.evaluate()
    final_eval = trainer.evaluate()
    print(f"held-out Pass@1 after {trainer.phase} phases: {final_eval['eval/pass@1/all']:.3f}")
finally:
    trainer.close()
'''),
    ("md", """\
### 2.3 The metrics of each phase

The rollout metrics are the paper's *deconfounded* ones (App. D): `pass@1/all` counts every attempt,
`pass@1/no_insight` only attempts without insights in context (what the policy can do on its own, the number the
paper's claims are about), `insight/advantage` is the success-rate gain of insight-conditioned attempts. The
update metrics: `sft_nll` is the mean NLL of the insight tokens (what L_SFT minimises), `sft_tokens` /
`grpo_tokens` count the tokens each term trained on, `clip_fraction` is PPO's. NaN means "not defined this
phase" (e.g. no attempt without insights)."""),
    ("code", '''\
COLUMNS = {
    "phase": "phase", "rollout/counts/env_steps": "env steps", "rollout/counts/attempts": "attempts",
    "rollout/pass@1/all": "Pass@1", "rollout/pass@1/no_insight": "Pass@1 no-ins.", "insight/written": "insights",
    "update/sft_nll": "SFT NLL", "update/sft_tokens": "SFT tok", "update/grpo_tokens": "GRPO tok",
    "update/clip_fraction": "clip frac", "update/loss": "loss", "time/update_s": "update s",
}  # fmt: skip
print_table(history, list(COLUMNS), list(COLUMNS.values()))
print()
print_table([final_eval], ["eval/counts/attempts", "eval/pass@1/all", f"eval/pass@{config.eval.attempts_per_task}/all"],
            ["eval attempts", "eval Pass@1", f"eval Pass@{config.eval.attempts_per_task}"])
'''),
    ("md", """\
### 2.4 Curves from the TensorBoard event files

The trainer writes its scalars with TensorBoard's own event writer (no TensorFlow) to `{WORKDIR}/tb`, with the
**environment-step count** as the x-axis (the paper's x-axis; the runs `tb/by_tokens` and `tb/by_time` hold the same
scalars, tagged `by_tokens/*` and `by_time/*`, against generated tokens and wall time). `EventAccumulator` reads them back. In Colab you can also browse them
with TensorBoard's notebook extension (`%load_ext tensorboard`, then `%tensorboard --logdir runs/colab-tiny/tb`)."""),
    ("code", '''\
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

events = EventAccumulator(os.path.join(WORKDIR, "tb"))
events.Reload()
TAGS = set(events.Tags()["scalars"])


def series(tag):
    """(environment steps, values) of one scalar; empty when it was not logged."""
    points = events.Scalars(tag) if tag in TAGS else []
    return [p.step for p in points], [p.value for p in points]


fig, (ax_nll, ax_pass) = plt.subplots(1, 2, figsize=(11, 3.8))
ax_nll.plot(*series("update/sft_nll"), marker="o")
ax_nll.set(xlabel="environment steps", ylabel="NLL per insight token", title="L_SFT: NLL of the inserted insights")
for tag, label in (("rollout/pass@1/all", "train, all attempts"), ("rollout/pass@1/no_insight", "train, no insight"),
                   ("eval/pass@1/all", "held-out eval")):
    steps, values = series(tag)
    ax_pass.plot(steps, [100 * v for v in values], marker="o", label=label)
ax_pass.set(xlabel="environment steps", ylabel="Pass@1 (%)", title="Pass@1 (a random tiny model stays at 0)")
ax_pass.legend()
fig.tight_layout()
os.makedirs(os.path.join(WORKDIR, "figures"), exist_ok=True)
fig.savefig(os.path.join(WORKDIR, "figures", "training_curves.png"), dpi=100)
plt.show()
plt.close(fig)
print(f"{len(TAGS)} scalar tags, e.g. {sorted(t for t in TAGS if not t.startswith('by_'))[:6]}")
'''),
    ("md", """\
### 2.5 Held-out evaluation with `launch/eval.py`

`launch/eval.py` evaluates any checkpoint (a run's `checkpoints:N`, or an HF directory) on the held-out split:
exactly `eval.attempts_per_task` attempts per task, no insights; macro Pass@1 and Pass@K (the paper uses 8
attempts, 256 tasks). It writes a JSON with every metric and the per-task successes. On training checkpoint N
it uses the sampling seeds of the trainer's own evaluation after phase N, so it repeats the evaluation above.
From the shell:

    python launch/eval.py --config=configs/sapi.py:tiny --checkpoint=runs/colab-tiny/checkpoints:3

Here we call what it runs, `rltldr_jax.train.evaluation.evaluate_checkpoint(config, checkpoint, out)`."""),
    ("code", '''\
import json

from rltldr_jax.train.evaluation import evaluate_checkpoint

EVAL_JSON = os.path.join(WORKDIR, "eval", "eval_final.json")
report = evaluate_checkpoint(config, f"{CKPT_DIR}:{config.train.max_phases}", EVAL_JSON)
saved = json.load(open(EVAL_JSON))
print(f"{saved['policy']}: {len(saved['per_task'])} tasks × {saved['attempts_per_task']} attempts in {saved['seconds']} s")
print("successes per task:", saved["per_task"])
print(f"Pass@1: launch/eval.py {report['metrics']['eval/pass@1/all']:.3f}, trainer {final_eval['eval/pass@1/all']:.3f}")
'''),
    ("md", """\
## 3. A real model: Qwen 3.5 0.8B on a Colab GPU or TPU

The same loop runs a real checkpoint. `Qwen/Qwen3.5-0.8B` is the smallest Qwen 3.5 (24 layers, hidden size
1024, tied embeddings; `model.preset=qwen3_5_0_8b`); its weights come from the Hugging Face hub
(`huggingface_hub.snapshot_download`, about 2 GB). Its chat template has **thinking off by default** (unlike the
9B the paper trains), so we set `rollout.thinking=False` and let the insight writer answer without thinking too.
The policy writes its own insights (`insight.source="policy"`, the paper's default).

We start from the paper's SAPI config (Table 4: λ = 0.5, lr 3e-6, Dr. GRPO without KL, float32 master weights)
and shrink only the sizes: 4 phases of 4 tasks × 4 attempts, at most 6 actions of 384 tokens per attempt, contexts
up to 4096 tokens, the embedded JAX engine (`engine.kind=jax`; SGLang is not used on Colab).
`loss.sft_on_filtered=True` keeps L_SFT on all-failure groups (a small model fails most SAPI tasks; not in the
paper). Float32 weights with AdamW state and gradients take about 13 GB, so the run needs an accelerator with
about 15 GB available to JAX: an L4 or A100 GPU, or a TPU v5e/v6e. A T4 is too small. These sizes and
memory figures are estimates: this section has not been run on a GPU or TPU yet.

The next cell prints the equivalent `launch/train.py` command. It skips the run and says why in test mode,
without a GPU or TPU, when there is too little memory (set `QWEN_FORCE = True` to try anyway), or offline."""),
    ("code", """\
import socket

import jax

QWEN_HUB_ID = "Qwen/Qwen3.5-0.8B"
QWEN_WORKDIR = os.path.join(REPO_ROOT, "runs", "colab-qwen3_5_0_8b")
QWEN_MIN_MEMORY_GB = 15
QWEN_FORCE = False
QWEN_OVERRIDES = {  # on top of configs/sapi.py (the paper's setup); model.checkpoint is set after the download
    "workdir": QWEN_WORKDIR, "model.preset": "qwen3_5_0_8b", "engine.kind": "jax", "engine.max_batch": 8,
    "rollout.thinking": False, "rollout.tasks_per_phase": 4, "rollout.group_size": 4, "rollout.max_steps": 6,
    "rollout.max_action_tokens": 384, "rollout.max_context_tokens": 4096, "env.max_observation_chars": 2000,
    "insight.thinking": False, "insight.max_action_tokens": 256, "loss.sft_on_filtered": True,
    "batch.micro_batch_size": max(2, jax.device_count()), "batch.grad_accum_steps": 4, "batch.pad_to_multiple": 1024,
    "train.env_step_budget": 0, "train.max_phases": 4, "train.keep_checkpoints": 5,
    "eval.every": 0, "eval.num_tasks": 16, "eval.attempts_per_task": 4,
}  # fmt: skip
print("the same run from the shell:\\n  python launch/train.py --config=configs/sapi.py --config.model.checkpoint=DIR "
      + " ".join(f"--config.{k}={v}" for k, v in QWEN_OVERRIDES.items()))


def hub_reachable(timeout=3.0):
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


skip = []
if TEST_MODE:
    skip.append("test mode (RLTLDR_NOTEBOOK_TEST=1) runs only the tiny preset and downloads nothing")
elif jax.default_backend() not in ("gpu", "tpu"):
    skip.append(f"JAX runs on {jax.default_backend()}: choose a GPU or TPU runtime (Runtime → Change runtime type)")
else:
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    if limit and limit < QWEN_MIN_MEMORY_GB * 1e9 and not QWEN_FORCE:
        skip.append(f"{jax.devices()[0].device_kind} gives JAX {limit / 1e9:.1f} GB; the run needs about "
                    f"{QWEN_MIN_MEMORY_GB} GB (QWEN_FORCE = True tries anyway)")
    if not hub_reachable():
        skip.append("huggingface.co is not reachable: the weights come from the hub")
RUN_QWEN = not skip
print("\\nQwen 3.5 0.8B: " + ("running" if RUN_QWEN else "skipped, because\\n  - " + "\\n  - ".join(skip)))
"""),
    ("code", """\
if RUN_QWEN:
    from huggingface_hub import snapshot_download

    qwen_dir = snapshot_download(QWEN_HUB_ID, allow_patterns=["*.json", "*.safetensors", "*.txt"])
    qwen_config = sapi.get_config("paper")
    base.override(qwen_config, {**QWEN_OVERRIDES, "model.checkpoint": qwen_dir})
    qwen_config = base.validate(qwen_config)
    if os.path.isdir(QWEN_WORKDIR):
        shutil.rmtree(QWEN_WORKDIR)
    qwen_trainer = Trainer(qwen_config, progress=True)
    try:
        qwen_trainer.save()  # step 0: the released weights (for notebook 2's Δθ)
        while not qwen_trainer.done():
            m = qwen_trainer.run_phase()
            print(f"phase {qwen_trainer.phase}: Pass@1 {m['rollout/pass@1/all']:.3f} (no insight "
                  f"{m['rollout/pass@1/no_insight']:.3f}), SFT NLL {m.get('update/sft_nll', math.nan):.3f}")
        qwen_eval = qwen_trainer.evaluate()
        print(f"held-out Pass@1 {qwen_eval['eval/pass@1/all']:.3f}, Pass@4 {qwen_eval['eval/pass@4/all']:.3f}")
    finally:
        qwen_trainer.close()
    print(f"to analyse this run in notebooks 2 and 3, set RLTLDR_NOTEBOOK_WORKDIR={QWEN_WORKDIR}")
"""),
    ("md", """\
## Next

- `02_delta_theta.ipynb`: how far the weights moved (Table 7), per module kind; export to Hugging Face format.
- `03_insights.ipynb`: the saved attempts and insights, the appendix analyses (insight categories, evolution,
  revisited tasks, reliance) and the insight exploration curves.

Both read `WORKDIR`; set `RLTLDR_NOTEBOOK_WORKDIR` to analyse another run (e.g. the 0.8B one)."""),
]

# ----------------------------------------------------------------------------------------------------
# 02: Δθ (Table 7), export to HF
# ----------------------------------------------------------------------------------------------------

NB2 = [
    ("md", """\
# RLTL;DR, small scale (2/3): how far did the weights move? (Δθ, Table 7)

The paper compares the parameter-space distance travelled by RL (RLTL;DR and its ablations) with that of SFT on
rollouts or insights (Table 7, App. E.1). With Δθ = θ_trained − θ_original over every entry of every text-model
tensor: ‖Δθ‖₁, ‖Δθ‖₂, the share of entries changed by more than bf16 precision (|Δ| > 2⁻⁸·|θ_original|), the
Gini index of |Δθ| and the share of Σ Δθ² held by the top 1 % of entries. Paper, Qwen 3.5 9B:

| method | ‖Δθ‖₁ | ‖Δθ‖₂ | >bf16 | Gini | top-1 % share |
|---|---|---|---|---|---|
| RLTL;DR | 7.4·10³ | 0.79 | 2.11 % | 0.99 | 96.88 % |
| RLTL;DR, λ = 0 | 2.4·10³ | 0.34 | 1.58 % | 0.99 | 99.67 % |
| SFT on 3.5k rollouts | 1.3·10⁶ | 36.12 | 30.42 % | 0.87 | 35.47 % |
| SFTL;DR on insights | 0.038·10⁶ | 1.83 | 8.88 % | 0.95 | 58.25 % |

RL moves few parameters, by little; SFT on full rollouts moves many. `rltldr_jax.analysis.delta_theta` computes
these statistics one tensor pair at a time (so two 9B checkpoints never sit in memory together), globally and per
module kind (attention, Gated DeltaNet, MLP, embeddings, norms), with exact bounds on Gini and the top share. Its
CLI is `launch/delta_theta.py`.

This notebook reads the run of notebook 1 (`WORKDIR`); any two checkpoints work: a run's
`checkpoints:STEP`, or an HF safetensors directory (e.g. the released Qwen 3.5 weights against an exported trained
policy)."""),
    ("md", SETUP_MD),
    ("code", SETUP_CODE + SHOW_PNG_CODE),
    ("code", NEEDS_RUN_CODE),
    ("md", """\
## 1. Δθ between the initial and the final policy

`compare(a, b)` takes two checkpoint specs (`DIR[:STEP]` or an HF directory) and returns a `DeltaReport`;
`rows()` gives the table (the global row first, then one per module kind), `format_table` prints it and
`write_rows` saves it as CSV or JSON. "±" is the exact bound of the streamed Gini / top-share estimate."""),
    ("code", '''\
from rltldr_jax.analysis import delta_theta as dt

OUT = os.path.join(WORKDIR, "delta_theta")
os.makedirs(OUT, exist_ok=True)
A, B = f"{CKPT_DIR}:{FIRST}", f"{CKPT_DIR}:{LAST}"  # or any two checkpoints / HF directories
report = dt.compare(A, B)
rows = report.rows()
print(f"Δθ = θ_b − θ_a\\n  a = {report.a}\\n  b = {report.b}\\n")
print(dt.format_table(rows))
dt.write_rows(os.path.join(OUT, f"delta_theta_{FIRST}_{LAST}.csv"), rows)
'''),
    ("md", """\
**Reading the tiny run.** After a handful of optimizer steps on a tiny random model the picture is the opposite
of Table 7: nearly every entry changed, well beyond bf16 precision, and evenly (low Gini, top-1 % share near
1 %). Adam's first updates move every entry that has a nonzero gradient by about the learning rate (its update
m/√v starts near ±1), the learning rate is 1e-4 (the paper: 3e-6) and the random weights are small. The tied
embedding matrix (248,320 × 64) holds most entries and, through the output softmax, every row gets a gradient.
The paper's numbers are for a trained 9B model after a full run at lr 3e-6; for a closer comparison point this
notebook at a longer run (e.g. the 0.8B run of notebook 1)."""),
    ("md", """\
## 2. Per module kind

The same statistics per module kind, as bars (the global row is the first of the table)."""),
    ("code", '''\
import matplotlib.pyplot as plt

kinds = [r for r in rows if r["kind"] != dt.ALL]
names = [r["kind"] for r in kinds]
panels = (("l2", "‖Δθ‖₂", 1), ("exceed_bf16", ">bf16 (%)", 100), ("gini", "Gini of |Δθ|", 1),
          ("top_share", "top-1% share of Δθ² (%)", 100))
fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
for ax, (key, label, scale) in zip(axes, panels):
    ax.bar(names, [scale * r[key] for r in kinds], color="tab:blue")
    ax.axhline(scale * rows[0][key], color="tab:red", lw=1, ls="--", label="all")
    ax.set_title(label)
    ax.tick_params(axis="x", labelrotation=45)
axes[0].legend()
fig.suptitle(f"Δθ per module kind, step {FIRST} → step {LAST}")
fig.tight_layout()
fig.savefig(os.path.join(OUT, "delta_theta_kinds.png"), dpi=100)
plt.show()
plt.close(fig)
'''),
    ("md", """\
## 3. Sanity checks: identical checkpoints, and each phase

A checkpoint compared with itself gives Δθ = 0 everywhere; consecutive checkpoints give the distance each
phase's update travelled."""),
    ("code", '''\
same = dt.compare(B, B).rows()
assert all(r["l1"] == 0 and r["changed"] == 0 for r in same), same
dt.write_rows(os.path.join(OUT, "delta_theta_same.csv"), same)
print(f"step {LAST} vs itself: ‖Δθ‖₁ = {same[0]['l1']}, changed entries {same[0]['changed']:.0%}")

per_phase = []
for a, b in zip(STEPS, STEPS[1:]):
    phase_rows = dt.compare(f"{CKPT_DIR}:{a}", f"{CKPT_DIR}:{b}").rows()
    dt.write_rows(os.path.join(OUT, f"delta_theta_{a}_{b}.csv"), phase_rows)
    per_phase.append({"from": a, "to": b, **phase_rows[0]})
PERCENT = ("changed", "exceed_bf16", "top_share")
print_table([{**r, **{k: 100 * r[k] for k in PERCENT}} for r in per_phase],
            ["from", "to", "l1", "l2", "changed", "exceed_bf16", "gini", "top_share"],
            ["from", "to", "‖Δθ‖₁", "‖Δθ‖₂", "changed %", ">bf16 %", "Gini", "top-1% share %"])
'''),
    ("md", """\
## 4. Export to Hugging Face format and compare orbax with HF

Training checkpoints are orbax directories (parameters, optimizer state, RNG, task cursor, config).
`checkpoint.export_hf` writes a checkpoint's parameters as an HF safetensors directory that transformers and
SGLang load (CLI: `python launch/export_hf.py --checkpoint_dir=... --step=N --out=DIR --dtype=float32`); the
architecture comes from the model config recorded with the checkpoint.

Δθ reads both kinds, so it checks the export: in float32 the export is exact (Δθ = 0). In bfloat16 (the default
export dtype) every entry is rounded to the nearest bf16 value, a change of at most half a bf16 step, which is
never more than 2⁻⁸·|θ|: many entries change, but the ">bf16" share is exactly 0; this is the precision that
column measures. Finally the exported model's log-probabilities match the orbax model's."""),
    ("code", '''\
import jax.numpy as jnp

from rltldr_jax.checkpoint import export_hf

exports = {}
for dtype in ("float32", "bfloat16"):
    exports[dtype] = os.path.join(WORKDIR, "hf", f"step{LAST}_{dtype}")
    export_hf(CKPT_DIR, LAST, exports[dtype], dtype=getattr(jnp, dtype))
    files = {f: os.path.getsize(os.path.join(exports[dtype], f)) for f in sorted(os.listdir(exports[dtype]))}
    print(f"{dtype}: {exports[dtype]}: " + ", ".join(f"{f} ({n / 1e6:.1f} MB)" for f, n in files.items()))

hf_rows = []
for dtype, directory in exports.items():
    rows_hf = dt.compare(B, directory).rows()
    dt.write_rows(os.path.join(OUT, f"orbax_vs_hf_{dtype}.csv"), rows_hf)
    hf_rows.append({"export": dtype, **rows_hf[0]})
print_table([{**r, **{k: 100 * r[k] for k in PERCENT}} for r in hf_rows], ["export", "l1", "l2", "changed", "exceed_bf16"],
            ["export", "‖Δθ‖₁", "‖Δθ‖₂", "changed %", ">bf16 %"])
assert hf_rows[0]["l1"] == 0.0 and hf_rows[1]["exceed_bf16"] == 0.0
'''),
    ("code", '''\
import jax
import numpy as np
from flax import nnx

from rltldr_jax.checkpoint import load_model
from rltldr_jax.models import sequence_logprobs

ids = jnp.asarray(np.random.default_rng(0).integers(0, 248_000, (1, 16)))  # any token ids
orbax_model, what = load_model(B)
graphdef, _ = nnx.split(orbax_model)
logprobs = jax.jit(lambda params, ids: sequence_logprobs(nnx.merge(graphdef, params), ids)[0])


def logprobs_of(model):
    return np.asarray(logprobs(jax.device_put(nnx.split(model)[1], jax.devices()[0]), ids))


reference = logprobs_of(orbax_model)
for dtype, directory in exports.items():
    gap = float(np.abs(logprobs_of(load_model(directory, param_dtype=jnp.float32)[0]) - reference).max())
    print(f"max |Δ log π| over {ids.shape[1]} tokens, {what} vs its {dtype} HF export: {gap:.2e}")
    if dtype == "float32":
        assert gap == 0.0
'''),
    ("md", """\
## From the shell

    python launch/delta_theta.py --a=runs/colab-tiny/checkpoints:0 --b=runs/colab-tiny/checkpoints --out=table7.csv
    python launch/export_hf.py --checkpoint_dir=runs/colab-tiny/checkpoints --out=/tmp/tiny_hf --dtype=float32
    python launch/delta_theta.py --a=/ckpt/qwen3_5_9b --b=/tmp/qwen_rltldr       # the paper's comparison"""),
]

# ----------------------------------------------------------------------------------------------------
# 03: rollouts, insights, analyses, insight curves
# ----------------------------------------------------------------------------------------------------

NB3 = [
    ("md", """\
# RLTL;DR, small scale (3/3): the insights

Every training phase saves its attempts as JSON lines (`{WORKDIR}/rollouts/phase_*.jsonl`): the task, the
insights that were in context, every step's tokens, how the attempt ended, the verifier's verdict, and the insight
written after it. This notebook

1. lists the attempts and insights of the run of notebook 1 and shows what the policy saw and what L_SFT trained;
2. runs the appendix analyses of `rltldr_jax.analysis.rollouts` and `.reliance` (CLI:
   `launch/analyze_rollouts.py`), next to the paper's numbers:
   - **Table 5**, insight categories: wrong capitalization 15.3 %, unrecorded action 11.8 %, extra parameter
     11.2 %, unsaved setting 5.5 %, over-filtering 2.1 %, argument position 1.2 %, other 52.3 %;
   - **E.4**, insight evolution: insights of one visit of a task are similar (Jaccard dissimilarity 0.19), those
     of its first and last visit are not (0.82; n = 92 tasks);
   - **E.2**, revisited tasks: success without insight 0.138 at the first visit → 0.253 at the last (n = 85,
     p = 0.001); never-revisited tasks +12.4 pp between the halves of training;
   - **E.5**, insight reliance: log π(τ | task + insights) − log π(τ | task) per token of successful
     insight-conditioned attempts, +0.009 in the first half of training, +0.034 in the second;
3. measures the **insight exploration curves** (App. E.8, Fig. 11/12: Pass@k of a frozen policy for i.i.d.
   attempts vs the latest insight vs all insights so far; paper, base 9B at k = 16: ~6 % / ~38 % / ~57 %) with
   `rltldr_jax.analysis.insight_curves` (CLI: `launch/insight_curves.py`).

The tiny run is far too short and its policy random, so most analyses come out empty or at zero; the point is
that every step runs and where its output goes. Point `RLTLDR_NOTEBOOK_WORKDIR` at a longer run for real numbers."""),
    ("md", SETUP_MD),
    ("code", SETUP_CODE + SHOW_PNG_CODE),
    ("code", NEEDS_RUN_CODE),
    ("md", """\
## 1. The saved attempts

`load_rollouts(run)` rebuilds every attempt (`RolloutRecord`: phase, attempt, judgement). The run's config is
recorded with its checkpoints; it gives the tokenizer and the thinking mode, so contexts can be rebuilt exactly as
in training."""),
    ("code", '''\
import ml_collections

from configs import base
from rltldr_jax.analysis import rollouts as ro
from rltldr_jax.analysis.reliance import recorded_run_config
from rltldr_jax.tokenization import ContextBuilder, load_tokenizer

config = base.validate(ml_collections.ConfigDict(recorded_run_config(CKPT_DIR)))
tokenizer = load_tokenizer(config.tokenizer or config.model.checkpoint or None)
builder = ContextBuilder(tokenizer, thinking=config.rollout.thinking)
records = ro.load_rollouts(WORKDIR)
ANALYSIS = os.path.join(WORKDIR, "analysis")
print(f"{len(records)} attempts of {len({r.task_id for r in records})} tasks in {len({r.phase for r in records})} phases")


def clip(text, n=90):
    return text if len(text) <= n else text[: n - 1] + "…"


print_table(
    [{"phase": r.phase, "task": r.task_id, "attempt": r.attempt.index, "in context": len(r.attempt.insights),
      "steps": r.attempt.env_steps, "end": r.attempt.end, "success": r.success,
      "insight written": clip(r.written_insight or "-")} for r in records],
    ["phase", "task", "attempt", "in context", "steps", "end", "success", "insight written"],
)  # fmt: skip
'''),
    ("md", """\
## 2. What the policy saw, and what L_SFT trained

An attempt with insights in context, rebuilt as a training example (`train.batching.attempt_examples`): the task,
then each insight as a user message, then the policy's think block and action. The **action mask** marks the
tokens L_GRPO trains (the sampled action, without forced tokens); the **insight mask** marks the tokens L_SFT
trains: the insight sentences, which sit right after the task, so their NLL is conditioned on the task (and earlier
insights) only, never on the attempt they came from. Below, `⟦insight⟧…` and `⟦action⟧…` mark the two."""),
    ("code", '''\
import numpy as np

from rltldr_jax.train.batching import attempt_examples


def marked(example):
    """The decoded context with the SFT (insight) and GRPO (action) targets marked."""
    ids = np.asarray(example.ids)
    kind = np.where(np.asarray(example.insight_mask, bool), 1, np.where(np.asarray(example.action_mask, bool), 2, 0))
    parts, start = [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or kind[t] != kind[start]:
            text = tokenizer.decode(ids[start:t])
            parts.append({0: text, 1: f"⟦insight⟧{text}⟦/insight⟧", 2: f"⟦action⟧{text}⟦/action⟧"}[int(kind[start])])
            start = t
    return "".join(parts)


with_insights = [r for r in records if r.attempt.insights]
if with_insights:
    example = attempt_examples(with_insights[0].attempt, 0.0, builder)[0]
    print(f"task {with_insights[0].task_id}, attempt {with_insights[0].attempt.index}, step 1 "
          f"({int(np.sum(example.insight_mask))} SFT tokens, {int(np.sum(example.action_mask))} GRPO tokens):\\n")
    print(marked(example))
else:
    print("no attempt had insights in context (insights are inserted once a task has failed attempts)")
'''),
    ("md", """\
## 3. Insight categories (Table 5)

Each written insight goes to the correction category whose keywords it matches most (the paper says only that the
groups "are identified by lexical overlap"; our keyword lists are in `rollouts.CATEGORIES`). The rule-based
insights of the tiny preset say which requirement failed, so they fall in few categories."""),
    ("code", '''\
try:
    categories = ro.insight_categories(records)
    ro.write_categories(categories, ANALYSIS)
    print_table([{"category": k, "count": categories.counts[k], "share": categories.shares[k]} for k in ro.CATEGORY_NAMES],
                ["category", "count", "share"])
    show_png(os.path.join(ANALYSIS, "categories.png"))
except ValueError as e:  # a run without an insight writer (GRPO) has no insights
    print(f"categories: {e}")
'''),
    ("md", """\
## 4. Insight evolution (E.4) and revisited tasks (E.2)

Both need tasks that come back in a later phase (a *revisit*). The paper's training splits are small (e.g. 386
tasks), so tasks recur; the tiny run draws a few tasks from 16,000, so it has none and these come out empty
(n = 0, NaN)."""),
    ("code", '''\
evolution = ro.insight_evolution(records)
ro.write_evolution(evolution, ANALYSIS)
print(f"evolution: {evolution.n_tasks} tasks with insights in ≥ 2 visits; dissimilarity within a visit "
      f"{evolution.mean_within:.2f} vs across visits {evolution.mean_across:.2f} (paper 0.19 vs 0.82, n = 92)")

revisits = ro.revisited_tasks(records)
ro.write_revisits(revisits, ANALYSIS)
print(f"revisits: {revisits.n} paired tasks, success without insight {revisits.mean_first:.3f} → {revisits.mean_last:.3f} "
      f"(p = {revisits.p_value:.3g}; paper 0.138 → 0.253, n = 85, p = 0.001)")
print(f"never revisited: {revisits.never_n_first} tasks in the first half, {revisits.never_n_second} in the second, "
      f"change {100 * revisits.never_change:+.1f} pp (paper +12.4 pp)")
show_png(os.path.join(ANALYSIS, "revisits.png"), width=8)
'''),
    ("md", """\
## 5. Insight reliance (E.5)

For every successful attempt that had insights in context: the per-token difference of the attempt's log-probs
with and without the insights, under a policy (here the final checkpoint; `per_phase_policy` scores each phase
with the checkpoint that sampled it). A random policy practically never succeeds, so the tiny run has no attempt
to score."""),
    ("code", '''\
from rltldr_jax.analysis.reliance import insight_reliance, load_policy, write_reliance

policy, what = load_policy(f"{CKPT_DIR}:{LAST}")
reliance = insight_reliance(records, policy, builder, max_per_phase=2 if TEST_MODE else 16)
write_reliance(reliance, ANALYSIS)
print(f"reliance under {what}: {len(reliance.attempts)} attempts scored; first half {reliance.first_half:+.3f}, "
      f"second half {reliance.second_half:+.3f} (paper +0.009 → +0.034)")
print("written:", sorted(f for f in os.listdir(ANALYSIS) if f.endswith(".csv")))
'''),
    ("md", """\
## 6. Insight exploration curves (Fig. 11/12)

A *frozen* policy attempts each task k times in three ways: i.i.d. without insights (as GRPO samples a group),
with only the latest insight, and with all insights so far. Pass@k against k shows how much the insights help
exploration; the paper measures the base policy (here: checkpoint 0) on tasks it never solves. All modes use
the same sampling seeds for attempt i of a task. `insight_curves(...)` returns one `CurveResult` per mode
(`pass_at_k[k-1]`), `write_curves` writes the CSVs and the plot. Raise `MAX_K` and `NUM_TASKS` for a real curve."""),
    ("code", '''\
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.analysis import insight_curves as ic
from rltldr_jax.engines.factory import policy_engine, teacher_engine
from rltldr_jax.envs import make_env

MAX_K, NUM_TASKS = (2, 1) if TEST_MODE else (4, 4)
CURVES = os.path.join(WORKDIR, "insight_curves")
base_policy, what = load_policy(f"{CKPT_DIR}:{FIRST}")
tasks = ic.curve_tasks(config, num_tasks=NUM_TASKS)  # from the training split, as in the paper
engine = policy_engine(config, base_policy, workdir=CURVES)
teacher, teacher_tokenizer = teacher_engine(config)
try:
    writer = InsightWriter.from_config(config, tokenizer, engine, teacher, teacher_tokenizer)
    curves = ic.insight_curves(
        engine, builder, config, tasks=tasks, writer=writer, max_k=MAX_K,
        make_env=lambda: make_env(config.env.name, step_timeout_s=config.env.step_timeout_s,
                                  memory_limit_mb=config.env.memory_limit_mb),
    )  # fmt: skip
finally:
    for e in (engine, teacher):
        if e is not None:
            e.close()
ic.write_curves(curves, CURVES)
print(f"{what}, {len(tasks)} tasks, k ≤ {MAX_K}")
print_table([{"mode": ic.MODE_LABELS[m], **{f"Pass@{k}": float(r.pass_at_k[k - 1]) for k in range(1, MAX_K + 1)},
              "insights at k": str(r.mean_insights.tolist())} for m, r in curves.items()],
            ["mode", *[f"Pass@{k}" for k in range(1, MAX_K + 1)], "insights at k"])
show_png(os.path.join(CURVES, "insight_curves.png"), width=5.5)
'''),
    ("md", """\
## From the shell

    python launch/analyze_rollouts.py --run=runs/colab-tiny                          # categories, evolution, revisits
    python launch/analyze_rollouts.py --run=runs/colab-tiny --analysis=reliance --checkpoint=runs/colab-tiny/checkpoints
    python launch/insight_curves.py --config=configs/sapi.py:tiny --checkpoint=runs/colab-tiny/checkpoints:0 --max_k=4 --num_tasks=4"""),
]

NOTEBOOKS = {
    "01_replicate_small.ipynb": NB1,
    "02_delta_theta.ipynb": NB2,
    "03_insights.ipynb": NB3,
}

# ----------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """nbformat's multi-line string: a list of lines, each but the last ending in a newline."""
    text = textwrap.dedent(text).strip("\n")
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def notebook(name: str, cells: list[tuple[str, str]]) -> dict:
    """The nbformat 4.5 document of one notebook (empty outputs, stable cell ids)."""
    stem = name.split("_")[0]
    out = []
    for i, (kind, text) in enumerate(cells):
        cell = {"cell_type": {"md": "markdown", "code": "code"}[kind], "id": f"nb{stem}-{i:02d}", "metadata": {},
                "source": _lines(text)}  # fmt: skip
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    return {
        "cells": out,
        "metadata": {
            "colab": {"name": name, "provenance": []},
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(name: str) -> str:
    """The exact file text of one notebook."""
    return json.dumps(notebook(name, NOTEBOOKS[name]), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv[1:]
    stale = []
    for name in NOTEBOOKS:
        path = os.path.join(HERE, name)
        text = render(name)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current == text:
            continue
        if check:
            stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run python colab/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
