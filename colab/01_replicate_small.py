# %% [markdown]
# # RLTL;DR, small scale (1/3): the replication, then one run up close
#
# [RLTL;DR](https://arxiv.org/abs/2609.37633) trains LLM agents with RL on tasks so hard that plain GRPO gets no
# reward signal. A task is attempted K times in a row; after each failed attempt the policy reads the verifier's
# failed tests and writes a one-sentence **TL;DR insight**; later attempts of the same task see the insights as user
# messages. The update is `L_GRPO + λ·L_SFT`, where `L_SFT` trains the insight tokens given only the task (λ = 0.5),
# so the policy internalises what the insights say and no longer needs them at test time.
#
# What the paper reports (Qwen 3.5 9B, SAPI / AppWorld / LeetCode splits where Pass@128 = 0): GRPO stays at 0–1 %
# Pass@1; RLTL;DR reaches 12–13 % Pass@1 *without* insights in context. On the 642-task SAPI split (Table 2): eval
# Pass@1 18.9 % with λ = 0.5, 13.2 % with λ = 0.
#
# This notebook:
#
# 1. runs the **small-scale replication** (`configs/replicate.py:quick`): a 0.25M-parameter Qwen 3.5 pretrained from
#    scratch in a crafting world with hidden rules, then GRPO and RLTL;DR on the hard tasks (Pass@64 = 0 for the
#    base policy), and shows the table and the curves (minutes on a CPU);
# 2. trains the `tiny` preset (a tiny *random* Qwen 3.5 in our SAPI-like world) one phase at a time through the
#    Python API, shows its metrics and TensorBoard curves, and evaluates it with `launch/eval.py`;
# 3. optionally trains a real **Qwen 3.5 0.8B** from the Hugging Face hub on a Colab GPU or TPU.
#
# Notebook 2 measures how far the weights moved (Δθ, Table 7); notebook 3 analyses the saved rollouts and
# insights of part 2's run.

# %% [markdown]
# ## 0. Set-up
#
# Run this cell first. In **Colab** it clones the repository (set `REPO_URL` below to its git URL) and installs it
# with `pip` (the CUDA build of JAX on a GPU runtime, `jax[tpu]` on a TPU runtime; about 2 minutes; if `pip`
# upgraded a package Colab had already imported, use *Runtime → Restart session* and run the cell again).
# **Locally** it finds the checkout this notebook lives in (install it first with `pip install -e .`).
#
# The notebooks work from the repository root. Two environment variables change their behaviour:
#
# - `RLTLDR_NOTEBOOK_WORKDIR`: the run directory that notebook 1 writes and notebooks 2 and 3 read (each trains it
#   first when it is missing, e.g. on a fresh Colab runtime: about 8 minutes on 2 CPU cores)
#   (default `runs/colab-tiny`).
# - `RLTLDR_NOTEBOOK_TEST=1`: test mode (`tests/test_notebooks.py`): the smallest sizes that still exercise every
#   step (1 task per phase, 2 attempts, 2 phases, a few tokens per step), and nothing is downloaded.

# %%
import importlib
import logging
import os
import shutil
import subprocess
import sys

IN_COLAB = "google.colab" in sys.modules
TEST_MODE = os.environ.get("RLTLDR_NOTEBOOK_TEST") == "1"  # tiny sizes, no network (tests/test_notebooks.py)
# The git URL of the rltldr_jax repository to clone in Colab (a fork, a mirror, a private copy with a token): set it
# here or in the environment variable RLTLDR_REPO_URL. The project has no public home yet, so there is no default.
REPO_URL = os.environ.get("RLTLDR_REPO_URL", "")  # @param {type:"string"}


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
    if not REPO_URL:
        raise RuntimeError("set REPO_URL in this cell (or RLTLDR_REPO_URL) to the git URL of rltldr_jax, then rerun it")
    subprocess.run(["git", "clone", "--depth=1", REPO_URL, "rltldr_jax"], check=True)
    REPO_ROOT = os.path.abspath("rltldr_jax")
if REPO_ROOT is None:
    raise RuntimeError(
        "run this notebook from a checkout of rltldr_jax (it lives in colab/), or in Colab with REPO_URL set"
    )
INSTALLED_MARKER = "/tmp/rltldr_jax_installed"  # one install per Colab runtime
if IN_COLAB and not os.path.exists(INSTALLED_MARKER):
    # A regular install (into site-packages, already on this kernel's path; an editable one would need a restart).
    if shutil.which("nvidia-smi"):
        pip_install(f"{REPO_ROOT}[gpu]")
    elif os.environ.get("COLAB_TPU_ADDR") or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"):
        pip_install(REPO_ROOT, "jax[tpu]>=0.10.2,<0.11")
    else:
        pip_install(REPO_ROOT)
    importlib.invalidate_caches()
    open(INSTALLED_MARKER, "w").close()

os.chdir(REPO_ROOT)  # configs/*.py are read by path (`rltldr_jax.config.load`) from here
logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every checkpoint operation at INFO

WORKDIR = os.path.abspath(os.environ.get("RLTLDR_NOTEBOOK_WORKDIR") or os.path.join("runs", "colab-tiny"))
CKPT_DIR = os.path.join(WORKDIR, "checkpoints")
print(f"repository {REPO_ROOT}\nrun directory {WORKDIR}\ntest mode: {TEST_MODE}, Colab: {IN_COLAB}")


def print_table(rows, columns, headers=None):
    """Prints dict rows as a fixed-width table (floats with 4 significant digits)."""
    headers = headers or columns
    cells = [
        [f"{r.get(c, float('nan')):.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in columns]
        for r in rows
    ]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def show_png(path, width=7.0):
    """Shows a PNG the analysis wrote (inline in a notebook; a no-op under the Agg backend)."""
    import matplotlib.pyplot as plt

    image = plt.imread(path)
    fig, ax = plt.subplots(figsize=(width, width * image.shape[0] / image.shape[1]))
    ax.imshow(image)
    ax.axis("off")
    plt.show()
    plt.close(fig)


# %% [markdown]
# ## 1. The replication: GRPO vs RLTL;DR where GRPO gets no signal
#
# The world (`rltldr_jax/envs/craft.py`): items are gathered (`gather("wood")`) or crafted from ingredients
# (`craft("torch")`); an attempt is one Python code block, the plan, one call per line. Three **hidden rules** — iron
# needs a torch, diamond a pickaxe, clay a shovel — are in no public text; only the verifier's failed test reveals
# them, and the rule-based insight writer turns it into the TL;DR, e.g. `Make sure that you have "torch" before
# gather("iron").` The policy (`replicate_xs`, the Qwen 3.5 architecture at width 64) is first pretrained from scratch
# on public-rule plans, some obeying made-up requirements written like insights, so it can act on an insight in
# context (never on a hidden rule). The hard tasks are those the public plan fails; held-out targets are never
# trained on.
#
# `run_replication` does what `python launch/replicate.py --config=configs/replicate.py:quick` does: per seed,
# pretraining (cached), the base policy's checks (App. B: i.i.d. Pass@64 on the hard tasks must be 0; the
# insight exploration curves of Fig. 11), then every arm as an ordinary `Trainer` run, and the report. The full grid
# (every arm of Table 2's λ question, 3 seeds, hours on 2 CPU cores) is `--config=configs/replicate.py`; the `gpu`
# preset (a 14M-parameter policy, 10 seeds) is `--config=configs/replicate.py:gpu` on a GPU runtime.

# %%
from rltldr_jax.config import replicate
from rltldr_jax.replication.driver import run_replication

PRESET = "smoke" if TEST_MODE else "quick"  # test mode: seconds, nothing meaningful learned
ARMS = replicate.GRIDS[PRESET][0]
REPLICATE_OUT = os.path.join(os.path.dirname(WORKDIR), f"colab-replicate-{PRESET}")  # next to the run of part 2
# Pretrained policies are cached by their settings (runs/pretrained by default, shared with launch/replicate.py).
CACHE = os.path.join(REPLICATE_OUT, "pretrained") if TEST_MODE else os.path.join(REPO_ROOT, "runs", "pretrained")
grid = {(arm, 0): replicate.arm_config(PRESET, arm, 0, {"pretrain.cache_dir": CACHE}) for arm in ARMS}
for name in ("rltldr_jax.train.loop", "rltldr_jax.train.sft"):
    logging.getLogger(name).setLevel(logging.WARNING)  # one summary line per run instead of one per phase
paths = run_replication(
    grid,
    REPLICATE_OUT,
    title=f"Small-scale replication ({PRESET})",
    checks=replicate.CHECKS[PRESET],
    jobs=0,  # pieces (base checks, runs) at once, each in its own process: one per CPU core (2 on Colab's CPU)
    progress=not TEST_MODE,
)
print(open(os.path.join(REPLICATE_OUT, "results.md")).read())
show_png(os.path.join(REPLICATE_OUT, "curves.png"), width=10)
show_png(os.path.join(REPLICATE_OUT, "insight_curves.png"), width=5)

# %% [markdown]
# ## 2. One run up close: the `tiny` preset, phase by phase
#
# The rest of this notebook (and notebooks 2 and 3, which train it themselves when they run alone) works on one small
# run of the paper's SAPI-like setting (`rltldr_jax/train/tiny_run.py`), to show
# the machinery: the configuration, `Trainer.run_phase()`, the logged metrics, TensorBoard, checkpoints and
# `launch/eval.py`. Its policy is a tiny *random* Qwen 3.5 with the real 248k-token vocabulary (about 8 minutes on 2
# CPU cores): it never solves a task, so what moves is L_SFT lowering the NLL of the inserted insights.

# %% [markdown]
# ### 2.1 The configuration
#
# `configs/sapi.py` holds the paper's SAPI setup; its `tiny` preset (`configs/base.py:apply_tiny`) shrinks it to a
# tiny random Qwen 3.5 on the embedded JAX engine: 3 phases of 2 tasks × ≥ 4 attempts, at most 3 actions of
# 16 + 48 tokens per attempt, rule-based insights (`insight.source="rule"`: the first failed requirement
# turned into a sentence, since a random model cannot write one), and `loss.sft_on_filtered=True` (a random policy
# never succeeds, so every group has zero advantage and only L_SFT can move it). Every key is documented in
# `rltldr_jax/settings.py`; `base.override` sets dotted keys, `base.validate` checks ranges and combinations.
#
# We also keep every checkpoint (`train.keep_checkpoints`), and below we save one before training (step 0): the
# "original policy" that notebook 2 compares the trained one with.

# %%
from rltldr_jax.settings import value_at
from rltldr_jax.train.tiny_run import tiny_run_config

config = tiny_run_config(WORKDIR, test_mode=TEST_MODE)  # configs/sapi.py:tiny, every checkpoint kept, validated

for key in (
    "model.preset",
    "env.name",
    "train.max_phases",
    "rollout.tasks_per_phase",
    "rollout.group_size",
    "rollout.max_steps",
    "rollout.max_think_tokens",
    "rollout.max_action_tokens",
    "insight.source",
    "insight.schedule",
    "loss.lam",
    "optim.learning_rate",
    "eval.num_tasks",
    "eval.attempts_per_task",
):
    print(f"{key:28} {value_at(config, key)}")

# %% [markdown]
# ### 2.2 Train
#
# `Trainer(config)` builds everything from the config: the model, the optimizer and its sharding, the engine,
# the task source, the insight writer and schedule, the collector, checkpoints and TensorBoard. `run_phase()` runs
# one phase:
#
# 1. **collect**: `rollout.tasks_per_phase` tasks, each attempted `rollout.group_size` times in a row; after a
#    failed attempt an insight is written, and later attempts of the task get the insights in context (when the
#    task's running success rate is ≤ 0.5, `insight.schedule="threshold"`);
# 2. **examples**: one training example per action step, with the group advantage, the action mask (GRPO targets)
#    and the flipped insight mask (SFT targets);
# 3. **update**: `batch.ppo_epochs` passes of the jitted `L_GRPO + λ·L_SFT` step, then the new weights go to the
#    engine (weight version = phase);
# 4. **log and save**: TensorBoard scalars at the environment-step count, a checkpoint, the rollouts as JSON lines.
#
# `evaluate()` runs the held-out tasks (exactly `eval.attempts_per_task` attempts each, no insights) and logs
# `eval/*`; `close()` waits for the last checkpoint and stops the engine. (`trainer.run()` does all of this in one
# call; `python launch/train.py --config=configs/sapi.py:tiny` is the same from the shell.)
#
# Set `RESUME = True` to continue an interrupted run in `WORKDIR`; otherwise it starts from scratch.

# %%
import inspect

from rltldr_jax.train.tiny_run import train_tiny_run

RESUME = False
print(inspect.getsource(train_tiny_run).split('"""')[-1].strip(), "\n")  # the loop below, as it runs
history, final_eval = train_tiny_run(config, resume=RESUME)  # (a fresh run first removes an earlier one in WORKDIR)

# %% [markdown]
# ### 2.3 The metrics of each phase
#
# The rollout metrics are the paper's *deconfounded* ones (App. D): `pass@1/all` counts every attempt,
# `pass@1/no_insight` only attempts without insights in context (what the policy can do on its own, the number the
# paper's claims are about), `insight/advantage` is the success-rate gain of insight-conditioned attempts. The
# update metrics: `sft_nll` is the mean NLL of the insight tokens (what L_SFT minimises), `sft_tokens` /
# `grpo_tokens` count the tokens each term trained on, `clip_fraction` is PPO's. NaN means "not defined this
# phase" (e.g. no attempt without insights).

# %%
COLUMNS = {
    "phase": "phase",
    "rollout/counts/env_steps": "env steps",
    "rollout/counts/attempts": "attempts",
    "rollout/pass@1/all": "Pass@1",
    "rollout/pass@1/no_insight": "Pass@1 no-ins.",
    "insight/written": "insights",
    "update/sft_nll": "SFT NLL",
    "update/sft_tokens": "SFT tok",
    "update/grpo_tokens": "GRPO tok",
    "update/clip_fraction": "clip frac",
    "update/loss": "loss",
    "time/update_s": "update s",
}
print_table(history, list(COLUMNS), list(COLUMNS.values()))
print()
print_table(
    [final_eval],
    ["eval/counts/attempts", "eval/pass@1/all", f"eval/pass@{config.eval.attempts_per_task}/all"],
    ["eval attempts", "eval Pass@1", f"eval Pass@{config.eval.attempts_per_task}"],
)

# %% [markdown]
# ### 2.4 Curves from the TensorBoard event files
#
# The trainer writes its scalars with TensorBoard's own event writer (no TensorFlow) to `{WORKDIR}/tb`, with the
# **environment-step count** as the x-axis (the paper's x-axis; the runs `tb/by_tokens` and `tb/by_time` hold the same
# scalars, tagged `by_tokens/*` and `by_time/*`, against generated tokens and wall time). `EventAccumulator` reads them
# back. In Colab you can also browse them with TensorBoard's notebook extension (`%load_ext tensorboard`, then
# `%tensorboard --logdir runs/colab-tiny/tb`).

# %%
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
for tag, label in (
    ("rollout/pass@1/all", "train, all attempts"),
    ("rollout/pass@1/no_insight", "train, no insight"),
    ("eval/pass@1/all", "held-out eval"),
):
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

# %% [markdown]
# ### 2.5 Held-out evaluation with `launch/eval.py`
#
# `launch/eval.py` evaluates any checkpoint (a run's `checkpoints:N`, or an HF directory) on the held-out split:
# exactly `eval.attempts_per_task` attempts per task, no insights; macro Pass@1 and Pass@K (the paper uses 8
# attempts, 256 tasks). It writes a JSON with every metric and the per-task successes. On training checkpoint N
# it uses the sampling seeds of the trainer's own evaluation after phase N, so it repeats the evaluation above.
# From the shell:
#
#     python launch/eval.py --config=configs/sapi.py:tiny --checkpoint=runs/colab-tiny/checkpoints:3
#
# Here we call what it runs, `rltldr_jax.train.evaluation.evaluate_checkpoint(config, checkpoint, out)`.

# %%
import json

from rltldr_jax.train.evaluation import evaluate_checkpoint

EVAL_JSON = os.path.join(WORKDIR, "eval", "eval_final.json")
report = evaluate_checkpoint(config, f"{CKPT_DIR}:{config.train.max_phases}", EVAL_JSON)
saved = json.load(open(EVAL_JSON))
print(
    f"{saved['policy']}: {len(saved['per_task'])} tasks × {saved['attempts_per_task']} attempts in {saved['seconds']} s"
)
print("successes per task:", saved["per_task"])
print(f"Pass@1: launch/eval.py {report['metrics']['eval/pass@1/all']:.3f}, trainer {final_eval['eval/pass@1/all']:.3f}")

# %% [markdown]
# ## 3. A real model: Qwen 3.5 0.8B on a Colab GPU or TPU
#
# The same loop runs a real checkpoint. `Qwen/Qwen3.5-0.8B` is the smallest Qwen 3.5 (24 layers, hidden size
# 1024, tied embeddings; `model.preset=qwen3_5_0_8b`); its weights come from the Hugging Face hub
# (`huggingface_hub.snapshot_download`, about 2 GB). Its chat template has **thinking off by default** (unlike the
# 9B the paper trains), so we set `rollout.thinking=False` and let the insight writer answer without thinking too.
# The policy writes its own insights (`insight.source="policy"`, the paper's default).
#
# We start from the paper's SAPI config (Table 4: λ = 0.5, lr 3e-6, Dr. GRPO without KL, float32 master weights)
# and shrink only the sizes: 4 phases of 4 tasks × 4 attempts, at most 6 actions of 384 tokens per attempt, contexts
# up to 4096 tokens, the embedded JAX engine (`engine.kind=jax`; SGLang is not used on Colab).
# `loss.sft_on_filtered=True` keeps L_SFT on all-failure groups (a small model fails most SAPI tasks; not in the
# paper). The paper fine-tunes every weight; here the policy trains **LoRA adapters** (rank 16 on every attention,
# DeltaNet and MLP projection, `model.lora.rank=16`) over a bfloat16 base, at 10× the paper's learning rate (LoRA's
# usual practice; not in the paper, not tuned here). The memory plan (`benchmarks/plan_memory.py --lora_table`, CPU
# proxy, ±10–20 %) puts this step at 6.6 GiB on one device at 4 × 4,096 tokens, against 20.4 GiB for full fine-tuning
# in float32: a T4 (16 GB) has room, though its bfloat16 is emulated (slow); an L4, A100 or a TPU is faster. The
# weights come straight from the hub id (`model.checkpoint=Qwen/Qwen3.5-0.8B`, fetched into the HF cache). This
# section has not been run on a GPU or TPU yet.
#
# The next cell prints the equivalent `launch/train.py` command. It skips the run and says why in test mode,
# without a GPU or TPU, when there is too little memory (set `QWEN_FORCE = True` to try anyway), or offline.

# %%
import socket

import jax

QWEN_HUB_ID = "Qwen/Qwen3.5-0.8B"
QWEN_WORKDIR = os.path.join(REPO_ROOT, "runs", "colab-qwen3_5_0_8b")
QWEN_MIN_MEMORY_GB = 8  # the plan's 6.6 GiB peak and some headroom
QWEN_FORCE = False
QWEN_OVERRIDES = {  # on top of configs/sapi.py (the paper's setup)
    "workdir": QWEN_WORKDIR,
    "model.preset": "qwen3_5_0_8b",
    "model.checkpoint": QWEN_HUB_ID,
    "model.lora.rank": 16,
    "model.param_dtype": "bfloat16",
    "optim.learning_rate": 3e-5,
    "engine.kind": "jax",
    "engine.max_batch": 8,
    "rollout.thinking": False,
    "rollout.tasks_per_phase": 4,
    "rollout.group_size": 4,
    "rollout.max_steps": 6,
    "rollout.max_action_tokens": 384,
    "rollout.max_context_tokens": 4096,
    "env.max_observation_chars": 2000,
    "insight.thinking": False,
    "insight.max_action_tokens": 256,
    "loss.sft_on_filtered": True,
    "batch.micro_batch_size": max(2, jax.device_count()),
    "batch.grad_accum_steps": 4,
    "batch.pad_to_multiple": 1024,
    "train.env_step_budget": 0,
    "train.max_phases": 4,
    "train.keep_checkpoints": 5,
    "eval.every": 0,
    "eval.num_tasks": 16,
    "eval.attempts_per_task": 4,
}
print(
    "the same run from the shell:\n  python launch/train.py --config=configs/sapi.py "
    + " ".join(f"--config.{k}={v}" for k, v in QWEN_OVERRIDES.items())
)


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
        skip.append(
            f"{jax.devices()[0].device_kind} gives JAX {limit / 1e9:.1f} GB; the run needs about "
            f"{QWEN_MIN_MEMORY_GB} GB (QWEN_FORCE = True tries anyway)"
        )
    if not hub_reachable():
        skip.append("huggingface.co is not reachable: the weights come from the hub")
RUN_QWEN = not skip
print("\nQwen 3.5 0.8B: " + ("running" if RUN_QWEN else "skipped, because\n  - " + "\n  - ".join(skip)))

# %%
if RUN_QWEN:
    import math

    from rltldr_jax.config import base, load
    from rltldr_jax.config.ablations import resolve
    from rltldr_jax.train.loop import Trainer

    qwen_config = load("configs/sapi.py:paper")
    base.override(qwen_config, QWEN_OVERRIDES)
    qwen_config = resolve(qwen_config)  # (validated; the hub id resolved to its snapshot in the HF cache)
    if os.path.isdir(QWEN_WORKDIR):
        shutil.rmtree(QWEN_WORKDIR)
    qwen_trainer = Trainer(qwen_config, progress=True)
    try:
        qwen_trainer.save()  # step 0: the released weights (for notebook 2's Δθ)
        while not qwen_trainer.done():
            m = qwen_trainer.run_phase()
            print(
                f"phase {qwen_trainer.phase}: Pass@1 {m['rollout/pass@1/all']:.3f} (no insight "
                f"{m['rollout/pass@1/no_insight']:.3f}), SFT NLL {m.get('update/sft_nll', math.nan):.3f}"
            )
        qwen_eval = qwen_trainer.evaluate()
        print(f"held-out Pass@1 {qwen_eval['eval/pass@1/all']:.3f}, Pass@4 {qwen_eval['eval/pass@4/all']:.3f}")
    finally:
        qwen_trainer.close()
    print(f"to analyse this run in notebooks 2 and 3, set RLTLDR_NOTEBOOK_WORKDIR={QWEN_WORKDIR}")

# %% [markdown]
# ## Next
#
# - `02_delta_theta.ipynb`: how far the weights moved (Table 7), per module kind; export to Hugging Face format.
# - `03_insights.ipynb`: the saved attempts and insights, the appendix analyses (insight categories, evolution,
#   revisited tasks, reliance) and the insight exploration curves.
#
# Both read `WORKDIR`; set `RLTLDR_NOTEBOOK_WORKDIR` to analyse another run (e.g. the 0.8B one).
