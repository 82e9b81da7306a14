# %% [markdown]
# # RLTL;DR, small scale (3/3): the insights
#
# Every training phase saves its attempts as JSON lines (`{WORKDIR}/rollouts/phase_*.jsonl`): the task, the
# insights that were in context, every step's tokens, how the attempt ended, the verifier's verdict, and the insight
# written after it. This notebook
#
# 1. lists the attempts and insights of the run of notebook 1 and shows what the policy saw and what L_SFT trained;
# 2. runs the appendix analyses of `rltldr_jax.analysis.rollouts` and `.reliance` (CLI:
#    `launch/analyze_rollouts.py`), next to the paper's numbers:
#    - **Table 5**, insight categories: wrong capitalization 15.3 %, unrecorded action 11.8 %, extra parameter
#      11.2 %, unsaved setting 5.5 %, over-filtering 2.1 %, argument position 1.2 %, other 52.3 %;
#    - **E.4**, insight evolution: insights of one visit of a task are similar (Jaccard dissimilarity 0.19), those
#      of its first and last visit are not (0.82; n = 92 tasks);
#    - **E.2**, revisited tasks: success without insight 0.138 at the first visit → 0.253 at the last (n = 85,
#      p = 0.001); never-revisited tasks +12.4 pp between the halves of training;
#    - **E.5**, insight reliance: log π(τ | task + insights) − log π(τ | task) per token of successful
#      insight-conditioned attempts, +0.009 in the first half of training, +0.034 in the second;
# 3. measures the **insight exploration curves** (App. E.8, Fig. 11/12: Pass@k of a frozen policy for i.i.d.
#    attempts vs the latest insight vs all insights so far; paper, base 9B at k = 16: ~6 % / ~38 % / ~57 %) with
#    `rltldr_jax.analysis.insight_curves` (CLI: `launch/insight_curves.py`).
#
# The tiny run is far too short and its policy random, so most analyses come out empty or at zero; the point is
# that every step runs and where its output goes. Point `RLTLDR_NOTEBOOK_WORKDIR` at a longer run for real numbers.

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


# %%
from rltldr_jax.train.tiny_run import ensure_tiny_run

STEPS = ensure_tiny_run(WORKDIR, test_mode=TEST_MODE)  # notebook 1's run; made here first if this runtime has none
FIRST, LAST = STEPS[0], STEPS[-1]
print(f"checkpoints of {WORKDIR}: steps {STEPS} (step 0 = the initial policy, step N = after N phases)")

# %% [markdown]
# ## 1. The saved attempts
#
# `load_rollouts(run)` rebuilds every attempt (`RolloutRecord`: phase, attempt, writer_output). The run's config is
# recorded with its checkpoints; it gives the tokenizer and the thinking mode, so contexts can be rebuilt exactly as
# in training.

# %%
import ml_collections

from rltldr_jax.agent.rollout_files import load_rollouts
from rltldr_jax.analysis import rollouts as ro
from rltldr_jax.analysis.reliance import recorded_run_config
from rltldr_jax.config import base
from rltldr_jax.settings import settings_of
from rltldr_jax.tokenization import context_builder, load_tokenizer

config = settings_of(base.validate(ml_collections.ConfigDict(recorded_run_config(CKPT_DIR))))
tokenizer = load_tokenizer(config.tokenizer or config.model.checkpoint or None)
builder = context_builder(config, tokenizer)
records = load_rollouts(WORKDIR)
ANALYSIS = os.path.join(WORKDIR, "analysis")
print(
    f"{len(records)} attempts of {len({r.task_id for r in records})} tasks in {len({r.phase for r in records})} phases"
)


def clip(text, n=90):
    return text if len(text) <= n else text[: n - 1] + "…"


print_table(
    [
        {
            "phase": r.phase,
            "task": r.task_id,
            "attempt": r.attempt.index,
            "in context": len(r.attempt.insights),
            "steps": r.attempt.env_steps,
            "end": r.attempt.end,
            "success": r.success,
            "insight written": clip(r.written_insight or "-"),
        }
        for r in records
    ],
    ["phase", "task", "attempt", "in context", "steps", "end", "success", "insight written"],
)

# %% [markdown]
# ## 2. What the policy saw, and what L_SFT trained
#
# An attempt with insights in context, rebuilt as a training example (`agent.step_examples.attempt_examples`): the task,
# then each insight as a user message, then the policy's think block and action. The **action mask** marks the
# tokens L_GRPO trains (the sampled action, without forced tokens); the **insight mask** marks the tokens L_SFT
# trains: the insight sentences, which sit right after the task, so their NLL is conditioned on the task (and earlier
# insights) only, never on the attempt they came from. Below, `⟦insight⟧…` and `⟦action⟧…` mark the two.

# %%
import numpy as np

from rltldr_jax.agent.step_examples import attempt_examples


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
    print(
        f"task {with_insights[0].task_id}, attempt {with_insights[0].attempt.index}, step 1 "
        f"({int(np.sum(example.insight_mask))} SFT tokens, {int(np.sum(example.action_mask))} GRPO tokens):\n"
    )
    print(marked(example))
else:
    print("no attempt had insights in context (insights are inserted once a task has failed attempts)")

# %% [markdown]
# ## 3. Insight categories (Table 5)
#
# Each written insight goes to the correction category whose keywords it matches most (the paper says only that the
# groups "are identified by lexical overlap"; our keyword lists are in `rollouts.CATEGORIES`). The rule-based
# insights of the tiny preset say which requirement failed, so they fall in few categories.

# %%
try:
    categories = ro.insight_categories(records)
    ro.write_categories(categories, ANALYSIS)
    print_table(
        [{"category": k, "count": categories.counts[k], "share": categories.shares[k]} for k in ro.CATEGORY_NAMES],
        ["category", "count", "share"],
    )
    show_png(os.path.join(ANALYSIS, "categories.png"))
except ValueError as e:  # a run without an insight writer (GRPO) has no insights
    print(f"categories: {e}")

# %% [markdown]
# ## 4. Insight evolution (E.4) and revisited tasks (E.2)
#
# Both need tasks that come back in a later phase (a *revisit*). The paper's training splits are small (e.g. 386
# tasks), so tasks recur; the tiny run draws a few tasks from 16,000, so it has none and these come out empty
# (n = 0, NaN).

# %%
evolution = ro.insight_evolution(records)
ro.write_evolution(evolution, ANALYSIS)
print(
    f"evolution: {evolution.n_tasks} tasks with insights in ≥ 2 visits; dissimilarity within a visit "
    f"{evolution.mean_within:.2f} vs across visits {evolution.mean_across:.2f} (paper 0.19 vs 0.82, n = 92)"
)

revisits = ro.revisited_tasks(records)
ro.write_revisits(revisits, ANALYSIS)
print(
    f"revisits: {revisits.n} paired tasks, "
    f"success without insight {revisits.mean_first:.3f} → {revisits.mean_last:.3f} "
    f"(p = {revisits.p_value:.3g}; paper 0.138 → 0.253, n = 85, p = 0.001)"
)
print(
    f"never revisited: {revisits.never_n_first} tasks in the first half, {revisits.never_n_second} in the second, "
    f"change {100 * revisits.never_change:+.1f} pp (paper +12.4 pp)"
)
show_png(os.path.join(ANALYSIS, "revisits.png"), width=8)

# %% [markdown]
# ## 5. Insight reliance (E.5)
#
# For every successful attempt that had insights in context: the per-token difference of the attempt's log-probs
# with and without the insights, under a policy (here the final checkpoint; `per_phase_policy` scores each phase
# with the checkpoint that sampled it). A random policy practically never succeeds, so the tiny run has no attempt
# to score.

# %%
from rltldr_jax.analysis.reliance import insight_reliance, load_policy, write_reliance

policy, what = load_policy(f"{CKPT_DIR}:{LAST}")
reliance = insight_reliance(records, policy, builder, max_per_phase=2 if TEST_MODE else 16)
write_reliance(reliance, ANALYSIS)
print(
    f"reliance under {what}: {len(reliance.attempts)} attempts scored; first half {reliance.first_half:+.3f}, "
    f"second half {reliance.second_half:+.3f} (paper +0.009 → +0.034)"
)
print("written:", sorted(f for f in os.listdir(ANALYSIS) if f.endswith(".csv")))

# %% [markdown]
# ## 6. Insight exploration curves (Fig. 11/12)
#
# A *frozen* policy attempts each task k times in three ways: i.i.d. without insights (as GRPO samples a group),
# with only the latest insight, and with all insights so far. Pass@k against k shows how much the insights help
# exploration; the paper measures the base policy (here: checkpoint 0) on tasks it never solves. All modes use
# the same sampling seeds for attempt i of a task. `insight_curves(...)` returns one `CurveResult` per mode
# (`pass_at_k[k-1]`), `write_curves` writes the CSVs and the plot. Raise `MAX_K` and `NUM_TASKS` for a real curve.

# %%
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.analysis import insight_curves as ic
from rltldr_jax.engines.factory import EngineConfig, close_engine, policy_engine, teacher_engine
from rltldr_jax.train.setup import env_maker

MAX_K, NUM_TASKS = (2, 1) if TEST_MODE else (4, 4)
CURVES = os.path.join(WORKDIR, "insight_curves")
base_policy, what = load_policy(f"{CKPT_DIR}:{FIRST}")
tasks = ic.curve_tasks(config, num_tasks=NUM_TASKS)  # from the training split, as in the paper
engine_config = EngineConfig.of(config)
engine = policy_engine(engine_config, base_policy, workdir=CURVES)
teacher, teacher_tokenizer = teacher_engine(engine_config)
try:
    writer = InsightWriter.of(config, tokenizer, engine, teacher, teacher_tokenizer)
    curves = ic.insight_curves(
        engine,
        builder,
        config,
        tasks=tasks,
        writer=writer,
        max_k=MAX_K,
        make_env=env_maker(config),
    )
finally:
    close_engine(engine)
    close_engine(teacher)
ic.write_curves(curves, CURVES)
print(f"{what}, {len(tasks)} tasks, k ≤ {MAX_K}")
print_table(
    [
        {
            "mode": ic.MODE_LABELS[m],
            **{f"Pass@{k}": float(r.pass_at_k[k - 1]) for k in range(1, MAX_K + 1)},
            "insights at k": str(r.mean_insights.tolist()),
        }
        for m, r in curves.items()
    ],
    ["mode", *[f"Pass@{k}" for k in range(1, MAX_K + 1)], "insights at k"],
)
show_png(os.path.join(CURVES, "insight_curves.png"), width=5.5)

# %% [markdown]
# ## From the shell
#
#     python launch/analyze_rollouts.py --run=runs/colab-tiny                          # categories, evolution, revisits
#     python launch/analyze_rollouts.py --run=runs/colab-tiny --analysis=reliance \\
#         --checkpoint=runs/colab-tiny/checkpoints
#     python launch/insight_curves.py --config=configs/sapi.py:tiny --checkpoint=runs/colab-tiny/checkpoints:0 \\
#         --max_k=4 --num_tasks=4
