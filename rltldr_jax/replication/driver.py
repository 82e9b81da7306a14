"""The whole replication in one call (what `launch/replicate.py` and the Colab notebook run).

    configs = {(arm, seed): configs.replicate.arm_config(preset, arm, seed) for ...}
    paths = run_replication(configs, "runs/replicate")     # results.csv, results.md, curves.png, insight_curves.png

Each piece runs in a fresh process (`isolated`): a grid of hours keeps a bounded memory, and a run that fails is
reported at the end while the others go on.

Per seed: the pretrained policy (`train.pretrain`, cached; an arm with other pretraining settings gets its own), the
base checks of the first arm's policy (`replication.checks`, cached in `{out}/base/s{seed}/checks.json`), then
every run of the grid (`replication.grid`, resumable), then the report (`replication.report`) of every finished run
in `out`, whichever launcher ran it. `jobs=N` runs N of these pieces at once (`run_tasks`: a run waits only for
its seed's base policy, and for the run it shares or whose rollouts it trains on).

Several launchers may share one `out` (e.g. disjoint arms side by side): each piece is done once, under a lock
(`train.resume.lock_workdir` of a run's workdir, or of a directory in `{out}/locks/`): a launcher that finds a
seed's base policy or a run being made by another process says so in one line and waits for it, then reads its
result. The last launcher to finish writes the complete report (each report file is replaced whole, never seen
half-written). Nothing finished is reused when it was made with other settings than asked for: the grid is refused
before anything runs, naming the runs and what differs, or with `restart=True` (`--restart`) those runs are moved
aside and redone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import math
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

import numpy as np

from rltldr_jax import strict_json
from rltldr_jax.agent.collector import PhaseResult
from rltldr_jax.analysis.insight_curves import MODES, CurveResult, plot_curves, write_curves
from rltldr_jax.compile_cache import enable_compile_cache
from rltldr_jax.progress import Board, attach, child_line
from rltldr_jax.replication.checks import base_checks
from rltldr_jax.replication.grid import (
    ArmElsewhereError,
    Run,
    finished_runs,
    plan_runs,
    read_summary,
    record_shared,
    run_one,
    stale_message,
    stale_reason,
)
from rltldr_jax.replication.report import Analysis, best_train_pass1, replaced, write_results
from rltldr_jax.settings import Settings, replace
from rltldr_jax.train.pretrain import find_pretrained, pretrain, pretrained_dir
from rltldr_jax.train.resume import LOCK, WorkdirInUseError, lock_workdir
from rltldr_jax.train.stopping import Interrupted

#: Seconds between two looks at a lock another process holds.
WAIT_POLL_S = 2.0
#: `{out}/locks/`: the directories whose locks (`lock_workdir`) launchers sharing a grid take for its shared pieces,
#: `s{seed}` (a seed's base policies and checks) and `report`; a run's lock is its workdir's.
LOCKS = "locks"


class GridError(RuntimeError):
    """The grid was refused (runs made with other settings) or some of its runs failed: one line says which."""


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
    splits = "".join(  # eval.splits: a world's tiers
        f", {k.removesuffix('_pass@1')} {_pct(v)} %"
        for k, v in checks.items()
        if k.endswith("_pass@1") and k not in ("iid_pass@1", "heldin_pass@1", "heldout_pass@1", "easy_pass@1")
    )
    return (
        f"i.i.d. Pass@{k_iid} {_pct(iid)} % on hard training tasks | with insights in context: Pass@1 "
        f"{_pct(checks['sequential_pass@1_insight'])} %, sequential Pass@{k_seq} {_pct(seq)} % | no-insight Pass@1: "
        f"held-in {_pct(checks['heldin_pass@1'])} %, held-out {_pct(checks['heldout_pass@1'])} %{splits}, public-rule "
        f"tasks {_pct(checks.get('easy_pass@1', math.nan))} %"
    )


#: Loggers whose levels (and, for the package, whose stderr handler) a child process takes over from its parent.
_LOGGERS = ("rltldr_jax", "rltldr_jax.train.loop", "rltldr_jax.train.sft", "absl", "orbax", "jax._src.xla_bridge")


def _exit_with_parent(parent: int) -> None:
    """Ends this (child) process once its parent is gone: a grid stopped with `kill` leaves no run going on alone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _start_worker(channels: tuple[Any, Any] | None) -> None:
    """A worker process's start: a process group of its own (see `isolated`); with `channels` (a `ChildLine`'s), its
    bars and its output go to its parent's line (`progress.attach`)."""
    os.setpgrp()
    if channels is not None:
        attach(*channels)


def _in_child(
    fn: Callable[..., Any], args: tuple, kwargs: dict, xla_cache: str | None, levels: dict[str, int], handler: bool
) -> Any:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    enable_compile_cache(xla_cache or "")  # the parent's cache (checked there), with the same settings
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    if handler:
        out = logging.StreamHandler()
        out.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        logging.getLogger("rltldr_jax").addHandler(out)
        logging.getLogger("rltldr_jax").propagate = False
    return fn(*args, **kwargs)


#: The process pools of the `isolated` calls in progress (any thread): a signal to this process is passed on to
#: their workers (`signal_workers`).
_LIVE: set[concurrent.futures.ProcessPoolExecutor] = set()
_LIVE_LOCK = threading.Lock()


def signal_workers(signum: int) -> None:
    """Sends `signum` to the worker process of every `isolated` call in progress."""
    with _LIVE_LOCK:
        pools = list(_LIVE)
    for pool in pools:
        for process in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_not_rerun(fn: Callable[..., Any]) -> Iterator[None]:
    """While a worker process starts to run `fn`: `__main__` without its file path, so that the spawned worker does
    not run the calling script again. Python's spawn start method re-imports a script's `__main__` in every child
    (the `if __name__ == "__main__":` guard multiprocessing asks scripts for); a script or notebook calling
    `run_replication` at its top level would otherwise start the grid again in each worker (or fail in
    `multiprocessing.spawn`). Only when `fn` comes from a module imported by name (the grid's pieces, all in this
    package): a function defined in the script itself needs the script in the worker (and so its guard)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    main = sys.modules.get("__main__") if getattr(fn, "__module__", "__main__") != "__main__" else None
    with _MAIN_LOCK:
        saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
        for key in saved:
            if key == "__file__":
                del main.__dict__[key]
            else:
                main.__dict__[key] = None
        try:
            yield
        finally:
            if main is not None:
                main.__dict__.update(saved)


def isolated(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a fresh process, with this process's logging levels and compilation cache (the
    directory this process uses, `compile_cache.enable_compile_cache`; none if it uses none); returns its result or
    raises its exception. Every run of a grid gets its own memory (compiled programs and engines are
    freed when it ends), and a crash ends only that call. Called in a `progress.Board.task`, the worker's bars and
    output are drawn by this process on the board's line for it (`progress.ChildLine`); else the worker writes to
    this process's stdout and stderr.

    Called from the main thread, a signal to this process (`Interrupted`) is passed on to the worker once per signal
    and the call waits for it: a `Trainer` in the worker stops at its next safe point with a checkpoint (a second
    signal: at once), and its `RunStopped` is raised here. Called from another thread (`run_tasks`), the main thread
    gets the signals and passes them on (`signal_workers`)."""
    import jax

    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    handler = bool(logging.getLogger("rltldr_jax").handlers)
    # The worker leads a process group of its own: Ctrl-C in a terminal (the foreground group's signal) reaches this
    # launcher alone, which passes it on once (below), so one signal is one request in the worker too.
    context = multiprocessing.get_context("spawn")
    line = child_line()
    channels = line.open(context) if line is not None else None
    try:
        pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=context, initializer=_start_worker, initargs=(channels,)
        )
        with pool:
            with _LIVE_LOCK:
                _LIVE.add(pool)
            try:
                cache = jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
                with _main_not_rerun(fn):  # (submit starts the worker)
                    future = pool.submit(_in_child, fn, args, kwargs, cache, levels, handler)
                if line is not None:
                    line.started()  # (submit started the worker: it holds its ends of the line's pipes now)
                if threading.current_thread() is not threading.main_thread():
                    return future.result()
                stop: Interrupted | None = None
                while True:
                    try:
                        result = future.result()
                        break
                    except Interrupted as e:
                        # The child's own stop (RunStopped: it says where it stopped and what it saved).
                        if future.done():
                            raise
                        # A signal to this launcher (Ctrl-C, Kubernetes' PID 1, `kill <pid>`): pass it on and wait. (A
                        # scheduler that signals every process of a job, e.g. SLURM's scancel, reaches the worker
                        # twice: it stops at once and resumes from its last checkpoint.)
                        stop = e
                        signal_workers(e.signum)
                if stop is not None:  # the child finished anyway: stop the grid here
                    raise stop
                return result
            finally:
                with _LIVE_LOCK:
                    _LIVE.discard(pool)
    finally:
        if line is not None:  # (the pool has ended: so has the worker, and its output is all in the pipe)
            line.finish()


@dataclasses.dataclass(frozen=True)
class Task:
    """One piece of a grid for `run_tasks`: `do()` once every task named in `after` has ended (done or failed)."""

    key: str
    do: Callable[[], None]
    after: tuple[str, ...] = ()


def run_tasks(tasks: Sequence[Task], jobs: int = 1) -> None:
    """Runs `tasks` on `jobs` threads (each piece of work in its own process, `isolated`): a task starts once the tasks
    it comes `after` have ended, and otherwise in the order given. A task's exception stops new tasks from starting
    and is raised once the running ones have ended (tasks that must not stop the others catch their own errors).

    Must be called from the main thread: a signal to this process (`Interrupted`) starts no new task and is passed on to
    every worker process (`signal_workers`), once per signal; then the worker's own stop (`RunStopped`, which says what
    it saved) is raised, or the signal's `Interrupted` when every worker finished anyway.

    Raises:
      ValueError: a task comes after a key that no earlier task has.
    """
    seen: set[str] = set()
    for task in tasks:
        missing = [a for a in task.after if a not in seen]
        if missing:
            raise ValueError(f"task {task.key!r} comes after {missing}, which no earlier task is")
        seen.add(task.key)
    pending = list(tasks)
    ended: set[str] = set()
    errors: list[BaseException] = []
    cond = threading.Condition()

    def take() -> Task | None:
        with cond:
            while pending and not errors:
                task = next((t for t in pending if all(a in ended for a in t.after)), None)
                if task is not None:
                    pending.remove(task)
                    return task
                cond.wait()
            return None

    def work() -> None:
        while (task := take()) is not None:
            try:
                task.do()
            except BaseException as e:  # (Interrupted too: the grid stops; the first error is raised below)
                with cond:
                    errors.append(e)
            finally:
                with cond:
                    ended.add(task.key)
                    cond.notify_all()

    threads = [threading.Thread(target=work, name=f"grid-{i}", daemon=True) for i in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    stop: Interrupted | None = None
    while any(thread.is_alive() for thread in threads):
        try:
            for thread in threads:
                thread.join(timeout=0.2)
        except Interrupted as e:
            stop = stop or e
            with cond:
                pending.clear()
                cond.notify_all()
            signal_workers(e.signum)
    stopped = [e for e in errors if isinstance(e, Interrupted)]
    if stopped:
        raise stopped[0]
    if stop is not None:
        raise stop
    if errors:
        raise errors[0]


def _holder(directory: str) -> str:
    """The pid of the process holding `directory`'s lock as its lock file says, as `" (pid N)"` ("" if none)."""
    try:
        with open(os.path.join(directory, LOCK), encoding="utf-8") as f:
            pid = f.read().strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid else ""


def wait_for_lock(directory: str, what: str, echo: Callable[[str], None]) -> IO[str]:
    """`lock_workdir(directory)`; while another process holds the lock (another launcher on the same grid), says so
    in one line naming `what` and waits for it. Returns the held lock (close it to release)."""
    said = False
    while True:
        try:
            return lock_workdir(directory)
        except WorkdirInUseError:
            if not said:
                echo(f"{what}: in use by another process{_holder(directory)}: waiting for it to end")
                said = True
            time.sleep(WAIT_POLL_S)


@contextlib.contextmanager
def held(directory: str, what: str, echo: Callable[[str], None]) -> Iterator[None]:
    """Holds `directory`'s lock for the block (`wait_for_lock`)."""
    lock = wait_for_lock(directory, what, echo)
    try:
        yield
    finally:
        lock.close()


def base_policy(config: Settings, *, progress: bool = False) -> str:
    """The pretrained checkpoint of `config`: cached, shipped with the package (`pretrain.shipped`), or pretrained
    now in a fresh process."""
    return find_pretrained(config) or isolated(pretrain, config, progress=progress)


#: What `seed_checks` writes in its directory (moved aside together when the checks are redone).
CHECKS_FILES = ("checks.json", "insight_curves.csv", "insight_curves_attempts.csv", "insight_curves.png")


def checks_stale(out: str, config: Settings, sizes: Mapping[str, int]) -> str | None:
    """Why the base checks saved in `out` are not those of `config`'s base policy at these `sizes` (None if they
    are, or if there are none)."""
    path = os.path.join(out, "checks.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if saved.get("checkpoint") != config.model.checkpoint:
        return f"base policy {saved.get('checkpoint')!r} -> {config.model.checkpoint!r}"
    if "sizes" in saved and saved["sizes"] != dict(sizes):
        return f"check sizes {saved['sizes']} -> {dict(sizes)}"
    return None


def seed_checks(
    config: Settings, out: str, *, progress: bool = False, restart: bool = False, **sizes: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The base checks of one seed's pretrained policy (computed once, then read from `{out}/checks.json`);
    returns (checks, Pass@k curve per mode). `sizes` go to `base_checks` (iid_samples, num_tasks). Checks saved
    for another base policy (`checks_stale`) are refused (GridError), or with `restart` moved aside and redone."""
    path = os.path.join(out, "checks.json")
    why = checks_stale(out, config, sizes)
    if why is not None:
        if not restart:
            raise GridError(
                f"{path} holds the checks of another base policy ({why}): rerun with --restart to redo them (the "
                "old ones move to a discarded-<time> directory), or give another --out"
            )
        from rltldr_jax.train.resume import move_aside

        move_aside(out, [os.path.join(out, name) for name in CHECKS_FILES], f"base checks ({why})")
    elif os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        return strict_json.nan_for_null(saved["checks"]), strict_json.nan_for_null(saved["curves"])
    c = replace(config, {"workdir": out})
    checks, curves = base_checks(c, progress=progress, max_k=config.rollout.group_size, **sizes)
    write_curves(curves, out)
    saved = {
        "checks": checks,
        "curves": {m: [float(x) for x in r.pass_at_k] for m, r in curves.items()},
        "n_tasks": {m: r.n_tasks for m, r in curves.items()},
        "checkpoint": config.model.checkpoint,
        "sizes": dict(sizes),
    }
    os.makedirs(out, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        strict_json.dump(saved, f, indent=1)  # (a NaN as null: read back as NaN)
    os.replace(tmp, path)
    return checks, saved["curves"]


def saved_checks(out: str) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, list[float]]], int | None]:
    """Every seed's base checks saved under `{out}/base/s{seed}` (whichever launcher made them): (checks per seed,
    Pass@k curves per seed, the fewest tasks a curve was measured on, or None when no file says)."""
    checks: dict[int, dict[str, float]] = {}
    curves: dict[int, dict[str, list[float]]] = {}
    n_tasks: list[int] = []
    directory = os.path.join(out, "base")
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        path = os.path.join(directory, name, "checks.json")
        if name[:1] == "s" and name[1:].isdigit() and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            checks[int(name[1:])] = strict_json.nan_for_null(saved["checks"])
            curves[int(name[1:])] = strict_json.nan_for_null(saved["curves"])
            n_tasks += list(saved.get("n_tasks", {}).values())
    return dict(sorted(checks.items())), dict(sorted(curves.items())), min(n_tasks) if n_tasks else None


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


def resolve_base_policies(
    configs: dict[tuple[str, int], Settings],
) -> dict[tuple[str, int], Settings]:
    """`configs` with `model.checkpoint` set where the arm pretrains: the cached or shipped policy, else where
    pretraining will put it (`pretrained_dir`). Arms that pretrain alike share one lookup."""
    found: dict[str, str] = {}  # pretraining directory -> checkpoint
    out = {}
    for k, c in configs.items():
        if c.pretrain.steps > 0 and not c.model.checkpoint:
            key = pretrained_dir(c)
            if key not in found:
                found[key] = find_pretrained(c) or key
            c = replace(c, {"model.checkpoint": found[key]})
        out[k] = c
    return out


def refuse_stale(runs: Sequence[Run], checks_of: Mapping[int, Settings], out: str, sizes: Mapping[str, int]) -> None:
    """Raises GridError (one line) when `out` holds finished runs, or base checks, made with other settings than the
    grid asks for: naming each, what differs, and the fix."""
    stale: list[tuple[Run | None, str, str]] = []  # (run, what, why)
    for run in runs:
        done = None if run.shared_with else read_summary(run.workdir)
        why = stale_reason(run, done) if done is not None else None
        if why is not None:
            stale.append((run, run.name, why))
    for seed, config in checks_of.items():
        why = checks_stale(os.path.join(out, "base", f"s{seed}"), config, sizes)
        if why is not None:
            stale.append((None, f"the base checks of seed {seed}", why))
    if len(stale) == 1 and stale[0][0] is not None:
        raise GridError(stale_message(stale[0][0], stale[0][2]))
    if stale:
        raise GridError(
            f"{out} holds results made with other settings than asked for: "
            + "; ".join(f"{what} ({why})" for _, what, why in stale)
            + ": rerun with --restart to redo them (each old run moves to <its directory>.old-<time>), restore those "
            "settings, or give another --out"
        )


def _run(run: Run, *, restart: bool, progress: bool, echo: Callable[[str], None]) -> dict[str, Any]:
    """`run_one(run)`, in a fresh process when it trains; while another process runs it (another launcher on the
    same grid), says so in one line, waits for it, then goes on (reading its result, or resuming it if it
    stopped)."""
    waited = False
    while True:
        done = read_summary(run.workdir)
        if run.shared_with or (done is not None and stale_reason(run, done) is None):
            return run_one(run)  # reads a finished run: nothing to isolate
        if not waited:  # (the run's own lock: its Trainer takes it, so it is only waited for here)
            wait_for_lock(run.workdir, f"{run.arm} seed {run.seed}", echo).close()
            waited = True
            continue  # what did the other process leave?
        try:
            return isolated(run_one, run, restart=restart, progress=progress)
        except WorkdirInUseError:  # taken between the wait and the run's start
            waited = False


def write_report(
    out: str,
    *,
    order: Sequence[str] = (),
    title: str = "",
    n_tasks: int | None = None,
    analysis: Analysis | None = None,
    elsewhere: Mapping[str, str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """results.csv, results.md, curves.png and insight_curves.png from every finished run and base check in `out`
    (`grid.finished_runs`, `saved_checks`), whichever launcher made them; returns the paths written (none when no
    run has finished: an existing report is kept). Launchers sharing `out` write one at a time, each file replaced
    whole. `elsewhere` (arm -> another grid directory) reads those arms' runs from there (`arms_elsewhere`).

    Raises:
      GridError: `out` also holds a run of an arm kept elsewhere."""
    elsewhere = arms_elsewhere(out, elsewhere)
    with held(os.path.join(out, LOCKS, "report"), "the report", echo):
        try:
            summaries = finished_runs(out, order, elsewhere)
        except ArmElsewhereError as e:
            raise GridError(str(e)) from None
        if not summaries:
            echo(f"no finished run in {out} yet: no report written")
            return []
        base, curves, saved_n = saved_checks(out)
        paths = write_results(summaries, base, out, title=title, analysis=analysis)
        n = saved_n or n_tasks or inspect.signature(base_checks).parameters["num_tasks"].default
        paths.append(
            replaced(os.path.join(out, "insight_curves.png"), lambda p: plot_curves(mean_curves(curves, n), p))
        )
    return paths


def arms_elsewhere(out: str, elsewhere: Mapping[str, str] | None) -> dict[str, str]:
    """`elsewhere` (arm -> the grid directory its runs are kept in) less the arms kept in `out` itself (a launcher
    running such an arm in its own directory reads it from there as from any grid)."""
    here = os.path.realpath(out)
    return {arm: d for arm, d in (elsewhere or {}).items() if os.path.realpath(d) != here}


def run_replication(
    configs: Mapping[tuple[str, int], Settings],
    out: str,
    *,
    title: str = "",
    checks: Mapping[str, int] | None = None,
    order: Sequence[str] = (),
    restart: bool = False,
    jobs: int = 1,
    progress: bool | IO[str] = False,
    analysis: Analysis | None = None,
    elsewhere: Mapping[str, str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """Runs the grid `configs` ((arm, seed) -> resolved config) under `out` and writes the report of every finished run
    there; returns the paths written. `checks` sizes the base checks (`base_checks`' iid_samples, num_tasks); `order` is
    the arms' order in the report (default: `configs`' order); `analysis` a pre-registered analysis section of
    results.md (`report.write_results`); `elsewhere` (arm -> another grid directory) names arms whose runs are kept in
    another directory: the report reads them from there, and `configs` may not run them in `out`. Every step is cached
    or resumable, so a second call only does what is missing; other launchers may share `out` (module docstring). `jobs`
    pieces (a seed's base checks, a run; 0: one per CPU core, at most 4) go on at once, each in its own process: a run's
    results do not depend on `jobs` (every process computes alone). Measured on a 2-core VM: the quick grid 1.2x faster
    with `jobs=2` (one process already keeps 1.1 cores busy, and two slow each other down); more cores gain more.
    `progress` (True: on stderr, or a text stream) draws the grid's bar (runs ended) and a line per piece going on, with
    its step and its count and ETA (a run's: environment steps against its budget), and writes `echo`'s lines and the
    pieces' output (prefixed by their names) above them (`progress.Board`); it changes nothing they compute. Without it
    (e.g. when stderr is not a terminal) there are only the lines.

    Raises:
      GridError: `out` holds runs or base checks made with other settings (before anything runs; `restart=True`
        redoes them instead), or some runs failed (after the others ran and the report was written).
    """
    if jobs < 0:
        raise ValueError(f"jobs={jobs}: give a number of processes >= 1, or 0 for one per CPU core (at most 4)")
    elsewhere = arms_elsewhere(out, elsewhere)
    misplaced = sorted({arm for arm, _ in configs if arm in elsewhere})
    if misplaced:
        raise GridError(
            "; ".join(
                f"{arm}'s runs are kept in {elsewhere[arm]}, not in {out}: --out={elsewhere[arm]}" for arm in misplaced
            )
        )
    jobs = jobs or min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 4)
    sizes = dict(checks or {})
    configs = resolve_base_policies(dict(configs))
    seeds = sorted({s for _, s in configs})
    keys = {seed: [k for k in configs if k[1] == seed] for seed in seeds}
    runs = plan_runs(configs, out)
    if not restart:
        refuse_stale(runs, {seed: configs[keys[seed][0]] for seed in seeds}, out, sizes)
    base: dict[int, dict[str, float]] = {}
    t0 = time.time()
    board: Board | None = None  # (made below, once the pieces are planned)

    def shown(name: str) -> contextlib.AbstractContextManager[None]:
        """A worker started in the block gets a line `name` on the board."""
        return board.task(name) if board is not None else contextlib.nullcontext()

    def base_policies(seed: int) -> None:
        t = time.time()
        pretrained = configs[keys[seed][0]]
        # One launcher at a time pretrains a seed's policies and checks them; another waits, then reads them.
        with held(os.path.join(out, LOCKS, f"s{seed}"), f"seed {seed}: the base policy and its checks", echo):
            missing = {}
            for k in keys[seed]:
                c = configs[k]
                if c.pretrain.steps > 0 and not os.path.isfile(os.path.join(c.model.checkpoint, "pretrain.json")):
                    missing.setdefault(c.model.checkpoint, c)
            for path, c in missing.items():
                with shown(f"seed {seed}"):
                    made = isolated(pretrain, c, progress=board is not None)
                if made != path:
                    raise RuntimeError(f"pretraining wrote {made}, not {path}")
        others = sorted({configs[k].model.checkpoint for k in keys[seed]} - {pretrained.model.checkpoint})
        echo(
            f"seed {seed}: base policy {pretrained.model.checkpoint} ({time.time() - t:.0f} s)"
            + (f"; arms with other pretraining settings: {', '.join(others)}" if others else "")
        )

    def base_checks_of(seed: int) -> None:
        t = time.time()
        with (
            held(os.path.join(out, LOCKS, f"s{seed}"), f"seed {seed}: the base policy and its checks", echo),
            shown(f"seed {seed}"),
        ):
            base[seed], _ = isolated(
                seed_checks,
                configs[keys[seed][0]],
                os.path.join(out, "base", f"s{seed}"),
                progress=board is not None,
                restart=restart,
                **sizes,
            )
        echo(f"seed {seed}: base checks ({time.time() - t:.0f} s): {checks_line(base[seed])}")

    failed: dict[str, str] = {}  # workdir -> why

    def ended() -> None:
        if board is not None:
            board.advance(1, f"{len(failed)} failed" if failed else None)

    def train(run: Run) -> None:
        t = time.time()
        if run.depends_on in failed:
            failed[run.workdir] = f"{run.name} needs {run.depends_on}, which failed"
            echo(f"{run.arm} seed {run.seed}: SKIPPED ({failed[run.workdir]})")
            ended()
            return
        try:
            with shown(f"{run.arm} seed {run.seed}"):
                summary = _run(run, restart=restart, progress=board is not None, echo=echo)
        except Exception as e:  # (a crashed process too) the other runs go on; the grid reports it at the end
            failed[run.workdir] = f"{run.name}: {type(e).__name__}: {e}"
            echo(f"{run.arm} seed {run.seed}: FAILED ({type(e).__name__}: {e}); rerun the grid to resume it")
            ended()
            return
        if run.shared_with:
            record_shared(run, out)
        note = f" (= {run.shared_with})" if run.shared_with else ""
        echo(
            f"{run.arm}{note} seed {run.seed}: "
            f"no-insight Pass@1 train {_pct(summary['train_pass1_no_insight'])} % "
            f"(best evaluation {_pct(best_train_pass1(summary))} %), "
            f"held-out {_pct(summary['heldout_pass1_no_insight'])} % | "
            f"with insights {_pct(summary['train_pass1_insight'])} % | "
            f"{summary['env_steps']:,} env steps | {(time.time() - t) / 60:.1f} min"
        )
        ended()

    # Seed by seed: its base policy, then its checks and its runs (a run needs its seed's base policy; an arm that
    # shares another's run, or trains on its rollouts, comes after it), `jobs` at a time, so that a long grid finishes
    # whole seeds as it goes (the next seed's base policy is made while a seed's runs go on). Several at a time, a
    # seed's runs whose attempts see insights go first (sequential attempts with longer contexts: the longest), so
    # that the short ones fill the end instead of one long run going on alone.
    if jobs > 1:  # (a stable sort: an owner stays before the runs that share it, online runs before offline ones)
        runs = sorted(runs, key=lambda run: (run.offline, run.config.insight.schedule == "never"))
    tasks = []
    for seed in seeds:
        tasks.append(Task(f"base s{seed}", functools.partial(base_policies, seed)))
        tasks.append(Task(f"checks s{seed}", functools.partial(base_checks_of, seed), (f"base s{seed}",)))
        for run in (r for r in runs if r.seed == seed):
            after = [f"base s{run.seed}"]
            if run.shared_with:  # (its workdir is the run it shares: plan_runs)
                after.append(run.workdir)
            if run.depends_on:
                after.append(run.depends_on)
            key = run.workdir if not run.shared_with else f"{run.workdir} as {run.arm}"
            tasks.append(Task(key, functools.partial(train, run), tuple(after)))
    if progress:
        board = Board(None if isinstance(progress, bool) else progress, total=len(runs))
        echo = board.through(echo)  # (the pieces above read `echo` when they run)
    with board if board is not None else contextlib.nullcontext():
        run_tasks(tasks, jobs)
    order = list(order) or list(dict.fromkeys(arm for arm, _ in configs))
    paths = write_report(
        out,
        order=order,
        title=title,
        n_tasks=sizes.get("num_tasks"),
        analysis=analysis,
        elsewhere=elsewhere,
        echo=echo,
    )
    echo(f"grid done in {(time.time() - t0) / 60:.1f} min")
    if failed:
        raise GridError(
            f"{len(failed)} run(s) failed (the report holds the others; rerun to resume them): "
            + "; ".join(failed.values())
        )
    return paths
