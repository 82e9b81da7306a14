"""The whole replication in one call (what `launch/replicate.py` and the Colab notebook run).

    configs = {(arm, seed): configs.replicate.arm_config(preset, arm, seed) for ...}
    paths = run_replication(configs, "runs/replicate")     # results.csv, results.md, curves.png, insight_curves.png

Each piece runs in a fresh process (`isolated`): a grid of hours keeps a bounded memory, and a run that fails is
reported at the end while the others go on.

Per seed: the pretrained policy (`train.pretrain`, cached; an arm with other pretraining settings gets its own), the
base checks of the first arm's policy (`replication.checks`, cached in `{out}/base/s{seed}/checks.json`), then
every run of the grid (`replication.grid`, resumable), then the report
(`replication.report`).
"""

from __future__ import annotations

import concurrent.futures
import copy
import inspect
import json
import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np

from rltldr_jax.agent.collector import PhaseResult
from rltldr_jax.analysis.insight_curves import MODES, CurveResult, plot_curves, write_curves
from rltldr_jax.replication.checks import base_checks
from rltldr_jax.replication.grid import plan_runs, run_one
from rltldr_jax.replication.report import write_results
from rltldr_jax.train.pretrain import find_pretrained, pretrain, pretrained_dir


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}"


def _at_k(checks: Mapping[str, float], prefix: str) -> tuple[int, float]:
    """(k, value) of the largest k among `checks[f"{prefix}@k"]`."""
    k = max(
        int(key.rsplit("@", 1)[1]) for key in checks if key.startswith(prefix + "@") and key.rsplit("@", 1)[1].isdigit()
    )
    return k, checks[f"{prefix}@{k}"]


def checks_line(checks: Mapping[str, float]) -> str:
    """The base checks in one line (Pass@k in %)."""
    k_iid, iid = _at_k(checks, "iid_pass")
    k_seq, seq = _at_k(checks, "sequential_pass")
    return (
        f"i.i.d. Pass@{k_iid} {_pct(iid)} % on hard training tasks | with insights in context: Pass@1 "
        f"{_pct(checks['sequential_pass@1_insight'])} %, sequential Pass@{k_seq} {_pct(seq)} % | no-insight Pass@1: "
        f"held-in {_pct(checks['heldin_pass@1'])} %, held-out {_pct(checks['heldout_pass@1'])} %, public-rule tasks "
        f"{_pct(checks.get('easy_pass@1', math.nan))} %"
    )


#: Loggers whose levels (and, for the package, whose stderr handler) a child process takes over from its parent.
_LOGGERS = ("rltldr_jax", "rltldr_jax.train.loop", "rltldr_jax.train.sft", "absl", "orbax", "jax._src.xla_bridge")


def _exit_with_parent(parent: int) -> None:
    """Ends this (child) process once its parent is gone: a grid stopped with `kill` leaves no run going on alone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _in_child(
    fn: Callable[..., Any], args: tuple, kwargs: dict, xla_cache: str | None, levels: dict[str, int], handler: bool
) -> Any:
    import jax

    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    if xla_cache:
        jax.config.update("jax_compilation_cache_dir", xla_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    if handler:
        out = logging.StreamHandler()
        out.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        logging.getLogger("rltldr_jax").addHandler(out)
        logging.getLogger("rltldr_jax").propagate = False
    return fn(*args, **kwargs)


def isolated(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a fresh process, with this process's logging levels and compilation cache; returns
    its result or raises its exception. Every run of a grid gets its own memory (compiled programs and engines are
    freed when it ends), and a crash ends only that call."""
    import jax

    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    handler = bool(logging.getLogger("rltldr_jax").handlers)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_in_child, fn, args, kwargs, jax.config.jax_compilation_cache_dir, levels, handler).result()


def base_policy(config: ml_collections.ConfigDict, *, progress: bool = False) -> str:
    """The pretrained checkpoint of `config`: cached, shipped with the package (`pretrain.shipped`), or pretrained
    now in a fresh process."""
    return find_pretrained(config) or isolated(pretrain, config, progress=progress)


def seed_checks(
    config: ml_collections.ConfigDict, out: str, *, progress: bool = False, **sizes: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The base checks of one seed's pretrained policy (computed once, then read from `{out}/checks.json`);
    returns (checks, Pass@k curve per mode). `sizes` go to `base_checks` (iid_samples, num_tasks)."""
    path = os.path.join(out, "checks.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        return saved["checks"], saved["curves"]
    c = copy.deepcopy(config)
    c.workdir = out
    checks, curves = base_checks(c, progress=progress, max_k=config.rollout.group_size, **sizes)
    write_curves(curves, out)
    saved = {
        "checks": checks,
        "curves": {m: [float(x) for x in r.pass_at_k] for m, r in curves.items()},
        "n_tasks": {m: r.n_tasks for m, r in curves.items()},
        "checkpoint": config.model.checkpoint,
    }
    os.makedirs(out, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=1)
    os.replace(path + ".tmp", path)
    return checks, saved["curves"]


def mean_curves(curves: Mapping[int, Mapping[str, list[float]]], n_tasks: int) -> dict[str, CurveResult]:
    """Fig. 11 averaged over seeds (each seed's curve is over its own base policy and the same tasks)."""
    out = {}
    for mode in MODES:
        per_seed = [np.asarray(c[mode]) for c in curves.values() if mode in c]
        if per_seed:
            k = min(len(p) for p in per_seed)
            mean = np.mean([p[:k] for p in per_seed], axis=0)
            out[mode] = CurveResult(mode, mean, n_tasks, np.full(k, np.nan), PhaseResult((), ()))
    return out


def run_replication(
    configs: Mapping[tuple[str, int], ml_collections.ConfigDict],
    out: str,
    *,
    title: str = "",
    checks: Mapping[str, int] | None = None,
    progress: bool = False,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """Runs the grid `configs` ((arm, seed) -> resolved config) under `out` and writes the report; returns the
    paths written. `checks` sizes the base checks (`base_checks`' iid_samples, num_tasks). Every step is cached or
    resumable, so a second call only does what is missing."""
    configs = dict(configs)
    seeds = sorted({s for _, s in configs})
    base: dict[int, dict[str, float]] = {}
    curves: dict[int, dict[str, list[float]]] = {}
    t0 = time.time()
    for seed in seeds:
        keys = [k for k in configs if k[1] == seed]
        t = time.time()
        found: dict[str, str] = {}  # pretraining directory -> checkpoint: arms that pretrain alike share one lookup
        for k in keys:
            c = configs[k]
            if c.pretrain.steps > 0 and not c.model.checkpoint:
                key = pretrained_dir(c)
                if key not in found:
                    found[key] = base_policy(c, progress=progress)
                configs[k] = copy.deepcopy(c)
                configs[k].model.checkpoint = found[key]
        pretrained = configs[keys[0]]
        others = sorted({configs[k].model.checkpoint for k in keys} - {pretrained.model.checkpoint})
        echo(
            f"seed {seed}: base policy {pretrained.model.checkpoint} ({time.time() - t:.0f} s)"
            + (f"; arms with other pretraining settings: {', '.join(others)}" if others else "")
        )
        t = time.time()
        found, seed_curves = isolated(
            seed_checks, pretrained, os.path.join(out, "base", f"s{seed}"), progress=progress, **dict(checks or {})
        )
        base[seed], curves[seed] = found, seed_curves
        echo(f"seed {seed}: base checks ({time.time() - t:.0f} s): {checks_line(found)}")
    runs = plan_runs(configs, out)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(runs), desc="grid", unit="run")
    summaries = []
    failed: dict[str, str] = {}  # workdir -> why
    try:
        for run in runs:
            t = time.time()
            if run.depends_on in failed:
                failed[run.workdir] = f"{run.arm}-s{run.seed} needs {run.depends_on}, which failed"
                echo(f"{run.arm} seed {run.seed}: SKIPPED ({failed[run.workdir]})")
                continue
            try:
                summary = isolated(run_one, run)
            except Exception as e:  # (a crashed process too) the other runs go on; the grid reports it at the end
                failed[run.workdir] = f"{run.arm}-s{run.seed}: {type(e).__name__}: {e}"
                echo(f"{run.arm} seed {run.seed}: FAILED ({type(e).__name__}: {e}); rerun the grid to resume it")
                continue
            summaries.append(summary)
            note = f" (= {run.shared_with})" if run.shared_with else ""
            echo(
                f"{run.arm}{note} seed {run.seed}: "
                f"no-insight Pass@1 train {_pct(summary['train_pass1_no_insight'])} %, "
                f"held-out {_pct(summary['heldout_pass1_no_insight'])} % | "
                f"with insights {_pct(summary['train_pass1_insight'])} % | "
                f"{summary['env_steps']:,} env steps | {(time.time() - t) / 60:.1f} min"
            )
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    paths = write_results(summaries, base, out, title=title)
    n_tasks = dict(checks or {}).get("num_tasks", inspect.signature(base_checks).parameters["num_tasks"].default)
    paths.append(plot_curves(mean_curves(curves, n_tasks), os.path.join(out, "insight_curves.png")))
    echo(f"grid done in {(time.time() - t0) / 60:.1f} min")
    if failed:
        raise RuntimeError(
            f"{len(failed)} run(s) failed (the report holds the others; rerun to resume them): "
            + "; ".join(failed.values())
        )
    return paths
