# %% [markdown]
# # RLTL;DR, small scale (2/3): how far did the weights move? (Δθ, Table 7)
#
# The paper compares the parameter-space distance travelled by RL (RLTL;DR and its ablations) with that of SFT on
# rollouts or insights (Table 7, App. E.1). With Δθ = θ_trained − θ_original over every entry of every text-model
# tensor: ‖Δθ‖₁, ‖Δθ‖₂, the share of entries changed by more than bf16 precision (|Δ| > 2⁻⁸·|θ_original|), the
# Gini index of |Δθ| and the share of Σ Δθ² held by the top 1 % of entries. Paper, Qwen 3.5 9B:
#
# | method | ‖Δθ‖₁ | ‖Δθ‖₂ | >bf16 | Gini | top-1 % share |
# |---|---|---|---|---|---|
# | RLTL;DR | 7.4·10³ | 0.79 | 2.11 % | 0.99 | 96.88 % |
# | RLTL;DR, λ = 0 | 2.4·10³ | 0.34 | 1.58 % | 0.99 | 99.67 % |
# | SFT on 3.5k rollouts | 1.3·10⁶ | 36.12 | 30.42 % | 0.87 | 35.47 % |
# | SFTL;DR on insights | 0.038·10⁶ | 1.83 | 8.88 % | 0.95 | 58.25 % |
#
# RL moves few parameters, by little; SFT on full rollouts moves many. `rltldr_jax.analysis.delta_theta` computes
# these statistics one tensor pair at a time (so two 9B checkpoints never sit in memory together), globally and per
# module kind (attention, Gated DeltaNet, MLP, embeddings, norms), with exact bounds on Gini and the top share. Its
# CLI is `launch/delta_theta.py`.
#
# This notebook reads the run of notebook 1 (`WORKDIR`); any two checkpoints work: a run's
# `checkpoints:STEP`, or an HF safetensors directory (e.g. the released Qwen 3.5 weights against an exported trained
# policy).

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
# ## 1. Δθ between the initial and the final policy
#
# `compare(a, b)` takes two checkpoint specs (`DIR[:STEP]` or an HF directory) and returns a `DeltaReport`;
# `rows()` gives the table (the global row first, then one per module kind), `format_table` prints it and
# `write_rows` saves it as CSV or JSON. "±" is the exact bound of the streamed Gini / top-share estimate.

# %%
from rltldr_jax.analysis import delta_theta as dt

OUT = os.path.join(WORKDIR, "delta_theta")
os.makedirs(OUT, exist_ok=True)
A, B = f"{CKPT_DIR}:{FIRST}", f"{CKPT_DIR}:{LAST}"  # or any two checkpoints / HF directories
report = dt.compare(A, B)
rows = report.rows()
print(f"Δθ = θ_b − θ_a\n  a = {report.a}\n  b = {report.b}\n")
print(dt.format_table(rows))
dt.write_rows(os.path.join(OUT, f"delta_theta_{FIRST}_{LAST}.csv"), rows)

# %% [markdown]
# **Reading the tiny run.** After a handful of optimizer steps on a tiny random model the picture is the opposite
# of Table 7: nearly every entry changed, well beyond bf16 precision, and evenly (low Gini, top-1 % share near
# 1 %). Adam's first updates move every entry that has a nonzero gradient by about the learning rate (its update
# m/√v starts near ±1), the learning rate is 1e-4 (the paper: 3e-6) and the random weights are small. The tied
# embedding matrix (248,320 × 64) holds most entries and, through the output softmax, every row gets a gradient.
# The paper's numbers are for a trained 9B model after a full run at lr 3e-6; for a closer comparison point this
# notebook at a longer run (e.g. the 0.8B run of notebook 1).

# %% [markdown]
# ## 2. Per module kind
#
# The same statistics per module kind, as bars (the global row is the first of the table).

# %%
import matplotlib.pyplot as plt

kinds = [r for r in rows if r["kind"] != dt.ALL]
names = [r["kind"] for r in kinds]
panels = (
    ("l2", "‖Δθ‖₂", 1),
    ("exceed_bf16", ">bf16 (%)", 100),
    ("gini", "Gini of |Δθ|", 1),
    ("top_share", "top-1% share of Δθ² (%)", 100),
)
fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
for ax, (key, label, scale) in zip(axes, panels, strict=True):
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

# %% [markdown]
# ## 3. Sanity checks: identical checkpoints, and each phase
#
# A checkpoint compared with itself gives Δθ = 0 everywhere; consecutive checkpoints give the distance each
# phase's update travelled.

# %%
same = dt.compare(B, B).rows()
assert all(r["l1"] == 0 and r["changed"] == 0 for r in same), same
dt.write_rows(os.path.join(OUT, "delta_theta_same.csv"), same)
print(f"step {LAST} vs itself: ‖Δθ‖₁ = {same[0]['l1']}, changed entries {same[0]['changed']:.0%}")

per_phase = []
for a, b in zip(STEPS, STEPS[1:], strict=False):
    phase_rows = dt.compare(f"{CKPT_DIR}:{a}", f"{CKPT_DIR}:{b}").rows()
    dt.write_rows(os.path.join(OUT, f"delta_theta_{a}_{b}.csv"), phase_rows)
    per_phase.append({"from": a, "to": b, **phase_rows[0]})
PERCENT = ("changed", "exceed_bf16", "top_share")
print_table(
    [{**r, **{k: 100 * r[k] for k in PERCENT}} for r in per_phase],
    ["from", "to", "l1", "l2", "changed", "exceed_bf16", "gini", "top_share"],
    ["from", "to", "‖Δθ‖₁", "‖Δθ‖₂", "changed %", ">bf16 %", "Gini", "top-1% share %"],
)

# %% [markdown]
# ## 4. Export to Hugging Face format and compare orbax with HF
#
# Training checkpoints are orbax directories (parameters, optimizer state, RNG, task cursor, config).
# `checkpoint.export_hf` writes a checkpoint's parameters as an HF safetensors directory that transformers and
# SGLang load (CLI: `python launch/export_hf.py --checkpoint=... --step=N --out=DIR --dtype=float32`); the
# architecture comes from the model config recorded with the checkpoint.
#
# Δθ reads both kinds, so it checks the export: in float32 the export is exact (Δθ = 0). In bfloat16 (the default
# export dtype) every entry is rounded to the nearest bf16 value, a change of at most half a bf16 step, which is
# never more than 2⁻⁸·|θ|: many entries change, but the ">bf16" share is exactly 0; this is the precision that
# column measures. Finally the exported model's log-probabilities match the orbax model's.

# %%
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
print_table(
    [{**r, **{k: 100 * r[k] for k in PERCENT}} for r in hf_rows],
    ["export", "l1", "l2", "changed", "exceed_bf16"],
    ["export", "‖Δθ‖₁", "‖Δθ‖₂", "changed %", ">bf16 %"],
)
assert hf_rows[0]["l1"] == 0.0 and hf_rows[1]["exceed_bf16"] == 0.0

# %%
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

# %% [markdown]
# ## From the shell
#
#     python launch/delta_theta.py --base_checkpoint=runs/colab-tiny/checkpoints:0 \
#         --checkpoint=runs/colab-tiny/checkpoints --out=table7.csv
#     python launch/export_hf.py --checkpoint=runs/colab-tiny/checkpoints --out=/tmp/tiny_hf --dtype=float32
#     python launch/delta_theta.py --base_checkpoint=/ckpt/qwen3_5_9b --checkpoint=/tmp/qwen_rltldr  # the paper's
