"""The colab/ notebooks: clean nbformat-4 files that are exactly what their jupytext percent-format sources
(colab/NN_name.py) build (stored outputs only as rendered from those sources), and every notebook run top to bottom
in a Jupyter kernel (a fresh one each, in order, sharing one run directory) in test mode, checked on what they
write."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(REPO_ROOT, "colab")
NOTEBOOKS = ("01_replicate_small.ipynb", "02_delta_theta.ipynb", "03_insights.ipynb")
# The compilation cache of tests/conftest.py: the notebooks' tiny shapes compile once per machine.
XLA_CACHE = os.environ.get("RLTLDR_TEST_XLA_CACHE", os.path.join(REPO_ROOT, ".pytest_cache", "xla"))

# Runs one notebook in a Jupyter kernel (nbclient + ipykernel, as Jupyter and Colab run it: the cells inside the
# kernel's running event loop), from the notebook's directory, printing each code cell's text output. A failing cell
# stops the run, naming the cell and printing its source and error.
RUNNER = r"""
import json, os, sys
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
for cell in nb.cells:
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": os.path.dirname(path)}})
try:
    client.execute()
    failed = None
except CellExecutionError as e:
    failed = e
for index, cell in enumerate(nb.cells):
    if cell.cell_type != "code" or not cell.get("outputs"):
        continue
    print(f"=== {os.path.basename(path)} cell {index}", flush=True)
    for out in cell.outputs:
        if out.output_type == "stream":
            print(out.text, end="")
        elif out.output_type == "error":
            print("\n".join(out.traceback))
if failed is not None:
    print(f"\nFAILED: {os.path.basename(path)}:\n{failed}", file=sys.stderr, flush=True)
    sys.exit(1)
print(f"=== {os.path.basename(path)}: all cells ran", flush=True)
"""


def _notebook_env(workdir) -> dict[str, str]:
    """The environment the notebooks run in here: test mode, `workdir` as their run directory, no display, the
    tests' compilation cache, the checkout importable."""
    return {
        **os.environ,
        "RLTLDR_NOTEBOOK_TEST": "1",
        "RLTLDR_NOTEBOOK_WORKDIR": str(workdir),
        "MPLBACKEND": "Agg",
        "JAX_COMPILATION_CACHE_DIR": XLA_CACHE,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
        "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
    }


def _load(name: str) -> dict:
    with open(os.path.join(COLAB, name), encoding="utf-8") as f:
        return json.load(f)


def _csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _builder():
    """colab/build_notebooks.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_notebooks", os.path.join(COLAB, "build_notebooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_outputs(name: str, nb: dict, builder) -> None:
    """A notebook's stored outputs: none, or rendered from its current source (`build_notebooks --execute`): the
    record names the source's sha256, the outputs are text, tables and figures only (no errors, no widgets) within
    the size cap, and the execution counts run 1, 2, ... over the code cells."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    record = nb["metadata"].get(builder.RENDERED)
    if record is None:
        assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), f"{name}: unrecorded outputs"
        return
    source = os.path.join(COLAB, os.path.splitext(name)[0] + ".py")
    assert record["source_sha256"] == builder.source_sha256(source), f"{name}: outputs of an older source"
    assert set(record) == {"source_sha256", "commit", "date", "machine", "seconds"}, record
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), name
    for cell in code:
        for out in cell["outputs"]:
            assert out["output_type"] in ("stream", "display_data", "execute_result"), (name, out["output_type"])
            assert set(out.get("data", {})) <= set(builder.KEPT_DATA), (name, list(out.get("data", {})))
            if out["output_type"] == "stream":
                assert not any("\r" in line for line in out["text"]), f"{name}: progress-bar redraws kept"
    assert len(json.dumps([c["outputs"] for c in code])) <= builder.MAX_OUTPUT_BYTES, name


def test_kept_outputs_are_what_a_terminal_shows_without_widgets():
    """What `--execute` keeps of a cell's outputs (hand-made): a progress bar's redraws collapse to its last state,
    a bar that cleared itself or moves the cursor leaves nothing, colours go, stream chunks merge, widgets and other
    data go, an error fails."""
    builder = _builder()
    outputs = [
        {"output_type": "stream", "name": "stderr", "text": "grid: 0%\rgrid: 50%\rgrid: 100%\nline one\n"},
        {"output_type": "stream", "name": "stderr", "text": "bar 10%\r          \r"},
        {"output_type": "stream", "name": "stderr", "text": ["line two\n", "bar\x1b[A\n", "\x1b[31mred\x1b[0m\n"]},
        {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {}, "text/plain": "HBox"}},
        {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Figure>", "image/svg+xml": "x"}},
    ]
    assert builder.kept_outputs(outputs) == [
        {"name": "stderr", "output_type": "stream", "text": ["grid: 100%\n", "line one\n", "line two\n", "red\n"]},
        {"data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "metadata": {}, "output_type": "display_data"},
    ]
    with pytest.raises(ValueError, match="'error'"):
        builder.kept_outputs([{"output_type": "error", "ename": "E", "evalue": "", "traceback": []}])


def test_notebooks_are_clean_and_generated():
    """Valid nbformat 4 JSON, no `!`/`%` lines, outputs only as rendered from the current source (`_check_outputs`),
    and the files are exactly what colab/build_notebooks.py builds from their paired percent-format sources (so the
    .py files are the reviewed source), which are plain Python as a whole."""
    builder = _builder()
    sources = sorted(name for name in os.listdir(COLAB) if name.endswith(".py") and name[:2].isdigit())
    assert sources == [os.path.splitext(name)[0] + ".py" for name in NOTEBOOKS]
    for name in sources:
        with open(os.path.join(COLAB, name), encoding="utf-8") as f:
            text = f.read()
        assert text.startswith("# %%"), f"{name}: not a jupytext percent-format source"
        compile(text, name, "exec")
    for name in NOTEBOOKS:
        nb = _load(name)
        assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int) and isinstance(nb["metadata"], dict), name
        assert nb["metadata"]["kernelspec"]["language"] == "python"
        ids = [c.get("id") for c in nb["cells"]]
        assert len(set(ids)) == len(ids), f"{name}: duplicate cell ids"
        for i, cell in enumerate(nb["cells"]):
            assert cell["cell_type"] in ("markdown", "code"), (name, i)
            assert isinstance(cell["metadata"], dict) and isinstance(cell["source"], list), (name, i)
            assert all(isinstance(line, str) for line in cell["source"]), (name, i)
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            compile(source, f"{name} cell {i}", "exec")  # plain Python
            magics = [line for line in source.splitlines() if line.lstrip().startswith(("!", "%"))]
            assert not magics, f"{name} cell {i}: shell/magic lines {magics}"
        _check_outputs(name, nb, builder)
        try:
            import nbformat
        except ImportError:
            pass
        else:
            nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))
    generator = subprocess.run(
        [sys.executable, os.path.join(COLAB, "build_notebooks.py"), "--check"], capture_output=True, text=True
    )
    assert generator.returncode == 0, generator.stderr


@pytest.mark.slow  # ~5 minutes on 2 cores; each notebook's pieces are tested on their own elsewhere; CI runs it
def test_notebooks_run_top_to_bottom(tmp_path):
    """Notebook 1 runs the smoke replication grid, then trains the tiny run and evaluates it, notebook 2 measures Δθ
    and exports to HF, notebook 3 analyses the rollouts and measures the insight curves; all in test mode, on one
    run directory."""
    workdir = tmp_path / "run"
    env = _notebook_env(workdir)
    seconds = {}
    for name in NOTEBOOKS:
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, os.path.join(COLAB, name)],
            cwd=COLAB,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        seconds[name] = round(time.time() - t0)
        if proc.returncode != 0:
            pytest.fail(
                f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}\n--- stdout ---\n{proc.stdout[-3000:]}"
            )
    print(f"notebook seconds: {seconds}")

    # Notebook 1, part 1: the smoke replication grid (grpo and rltldr, one seed) with its report.
    replication = tmp_path / "colab-replicate-smoke"
    assert [(r["arm"], r["seed"]) for r in _csv(replication / "results.csv")] == [("grpo", "0"), ("rltldr", "0")]
    assert (replication / "curves.png").stat().st_size > 0 and (replication / "insight_curves.png").stat().st_size > 0

    # Notebook 1, part 2: checkpoints 0 (before training), 1, 2; TensorBoard; rollouts; the curves; the eval JSON.
    assert sorted(os.listdir(workdir / "checkpoints"), key=int) == ["0", "1", "2"]
    assert os.listdir(workdir / "tb")
    assert sorted(os.listdir(workdir / "rollouts")) == ["phase_00000.jsonl", "phase_00001.jsonl"]
    assert (workdir / "figures" / "training_curves.png").stat().st_size > 0
    report = json.loads((workdir / "eval" / "eval_final.json").read_text())
    assert report["policy"].endswith("step 2") and report["attempts_per_task"] == 2
    assert [len(v) for v in report["per_task"].values()] == [2]
    assert report["metrics"]["eval/counts/attempts"] == 2 and report["metrics"]["eval/counts/tokens"] > 0

    # Notebook 2: Δθ is zero for a checkpoint against itself and for the float32 HF export, nonzero between
    # phases; the bf16 export changes entries but never beyond bf16 precision.
    out = workdir / "delta_theta"
    kinds = {"all", "attention", "deltanet", "mlp", "embeddings", "norms"}
    same = _csv(out / "delta_theta_same.csv")
    assert {r["kind"] for r in same} == kinds and all(float(r["l1"]) == 0 and float(r["changed"]) == 0 for r in same)
    for a, b in ((0, 2), (0, 1), (1, 2)):
        rows = {r["kind"]: r for r in _csv(out / f"delta_theta_{a}_{b}.csv")}
        assert set(rows) == kinds and float(rows["all"]["l1"]) > 0 and float(rows["all"]["l2"]) > 0, (a, b)
        assert int(rows["all"]["entries"]) == sum(int(rows[k]["entries"]) for k in kinds - {"all"})
    fp32 = _csv(out / "orbax_vs_hf_float32.csv")
    assert all(float(r["l1"]) == 0 for r in fp32)
    bf16 = {r["kind"]: r for r in _csv(out / "orbax_vs_hf_bfloat16.csv")}
    assert float(bf16["all"]["changed"]) > 0 and float(bf16["all"]["exceed_bf16"]) == 0
    assert (out / "delta_theta_kinds.png").stat().st_size > 0
    assert sorted(os.listdir(workdir / "hf" / "step2_float32")) == [  # a complete HF model directory
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    # Notebook 3: the analyses' CSVs (the rule-based insights were classified) and the insight curves.
    analysis = workdir / "analysis"
    saved = [json.loads(line) for p in sorted((workdir / "rollouts").iterdir()) for line in p.read_text().splitlines()]
    written = [r["writer_output"]["insight"] for r in saved if (r.get("writer_output") or {}).get("insight")]
    assert len(saved) == 4 and len(written) == 4  # a random policy fails every attempt; each gets an insight
    assert sum(int(r["count"]) for r in _csv(analysis / "categories.csv")) == len(written)
    assert sorted(r["insight"] for r in _csv(analysis / "categories_insights.csv")) == sorted(written)
    for name in ("evolution.csv", "revisits.csv", "reliance.csv", "revisits.png", "evolution.png", "reliance.png"):
        assert (analysis / name).stat().st_size > 0, name
    curves = _csv(workdir / "insight_curves" / "insight_curves.csv")
    assert [(r["mode"], r["k"]) for r in curves] == [
        (m, k) for m in ("iid", "latest", "sequential") for k in ("1", "2")
    ]
    insights_at_2 = {r["mode"]: float(r["mean_insights"]) for r in curves if r["k"] == "2"}
    assert insights_at_2 == {"iid": 0.0, "latest": 1.0, "sequential": 1.0}  # a random policy fails attempt 1
    attempts = _csv(workdir / "insight_curves" / "insight_curves_attempts.csv")
    assert len(attempts) == 6


@pytest.mark.slow  # ~1-2 minutes on 2 cores; CI runs it
def test_each_analysis_notebook_runs_on_its_own(tmp_path):
    """Each Colab notebook gets its own runtime: notebook 3, run alone on an empty run directory (test mode), trains
    the tiny run itself first (`rltldr_jax.train.tiny_run.ensure_tiny_run`) and goes through; it then uses that run
    as it is (rerun: nothing trained again)."""
    workdir = tmp_path / "alone"
    env = _notebook_env(workdir)
    command = [sys.executable, "-c", RUNNER, os.path.join(COLAB, "03_insights.ipynb")]
    proc = subprocess.run(command, cwd=COLAB, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stderr[-6000:]}\n--- stdout ---\n{proc.stdout[-3000:]}"
    assert f"no run in {workdir}: training the tiny run here first" in proc.stdout
    assert sorted(os.listdir(workdir / "checkpoints"), key=int) == ["0", "1", "2"]
    assert (workdir / "insight_curves" / "insight_curves.csv").stat().st_size > 0
    again = subprocess.run(command, cwd=COLAB, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "training the tiny run here first" not in again.stdout, again.stderr[-3000:]
