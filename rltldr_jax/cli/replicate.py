"""The small-scale replication: every (arm, seed) of a grid as its own training run, then the table and the curves.

    python launch/replicate.py --config=configs/replicate.py:quick              # grpo vs rltldr, 1 seed (minutes)
    python launch/replicate.py --config=configs/replicate.py                    # the full grid, 3 seeds (hours)
    python launch/replicate.py --config=configs/replicate.py --arms=grpo,lambda_0 --seeds=0,1 --out=runs/mine
    python launch/replicate.py --config=configs/replicate.py:quick --config.pretrain.steps=400   # any config key
    python launch/replicate.py --config=configs/replicate_v2.py                 # the second round's grid
    python launch/replicate.py --config=configs/replicate_v2.py:quick           # ...its seed 0, grpo vs rltldr, 2 min
    python launch/replicate.py --config=configs/replicate_v2.py --pack=DIR      # its finished pieces, to carry on
    python launch/replicate.py --config=configs/replicate_v2.py --unpack=DIR    # ...restored on another machine

Per seed: pretrain the policy from scratch (cached in `runs/pretrained` by a hash of its settings, so presets
and grids with the same pretraining settings share it), check the
base policy before RL (paper App. B: i.i.d. Pass@64 on the hard training tasks must be 0; insight-conditioned
success; the Fig. 11 curves), then train every arm (configs/replicate.py `ARMS`) as an ordinary `Trainer` run in
`{out}/runs/{arm}-s{seed}`; a preset's seeds may differ by arm (`GRIDS`: the second round runs 20 seeds of some arms,
3 of others). Runs are resumable: a finished run is skipped, a stopped one continues from its last
checkpoint, so rerunning the command only does what is missing. A finished run trained with other settings (a
changed `--config.KEY`, another base policy) is never reused: the command refuses, naming the runs and the keys
that differ; `--restart` redoes those runs (each old one moved to `{workdir}.old-<time>`). `sftldr` trains offline
on the saved rollouts of the same seed's `rltldr` run (which is added to the grid if missing; as are the other offline
arms, `sft_rollouts`). Every run compiles
into and reads from one compilation cache (`compile.cache_dir`, by default the user's ~/.cache/rltldr_jax/xla, shared
with every launcher), so the arms of a grid and its reruns compile each program once.

On a terminal the command draws a bar of the grid (runs ended) and one line per piece going on (its step as the log
names it, e.g. "grpo seed 0 · phase 4 update 2/8", and a run's environment steps with its ETA), and prints every line
above them, the pieces' own output prefixed by their names; elsewhere (CI, nohup) it prints only the lines.

`--jobs=N` runs N pieces of the grid (a seed's base checks, a run) at once, each in its own process (default: one per
CPU core, at most 4; 1 for the gpu preset); a run's results do not depend on it. Launchers may also share one `--out`
(e.g. disjoint `--arms` side by side, on several machines with a shared disk): a run, base policy or base check another
launcher is making is waited for (one line says so), never made twice, and each launcher writes the report from
every finished run in `--out`, so the last one to finish leaves the complete table.

Writes to `--out` (default `runs/{name}` for the config file configs/{name}.py, `runs/{name}-{preset}` for the other
presets):
results.csv (one row per arm and seed), results.md (mean ± std over seeds next to the paper's and a toy
replication's numbers, and the base checks), curves.png (no-insight Pass@1 against environment steps, held-in and
held-out), split_curves.png (a world with evaluation tiers: the same per tier, 95 % bootstrap bands over seeds),
insight_curves.png (Fig. 11 on the base policy, mean over seeds), base/s{seed}/ (each seed's checks).

A grid longer than a machine's life moves in pieces: `--pack=DIR` copies what has finished (summaries, metrics, probes,
base checks, base policies: a few MB, `replication/archive.py`) to DIR and exits; on the next machine `--unpack=DIR`
puts it back into the same `--out` (the same absolute path: runs record their base policy's path) and exits; the
plain command then runs only what is missing. `--status` says where the grid stands (what is done, running, left,
and the time left; no result) and `--report` writes the report from what has finished; both exit.

A config's `ARM_DIRS` (arm -> a directory beside `--out`) keeps an arm's runs apart from the grid's: the report reads
them from there, and the launcher runs them only with that directory as `--out` (round two's `rltldr_lora`, run from
a later install than the grid's, in runs/replicate_v2_lora).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from rltldr_jax.cli.common import as_main, default_config, define_path, quiet_logging, run_launcher, use_compile_cache
from rltldr_jax.config import base
from rltldr_jax.config.replicate import grid_analysis, grid_configs

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    default_config("replicate.py"),
    "configs/replicate.py[:PRESET] (default, quick, gpu, smoke), or configs/replicate_v2.py[:PRESET] (default, quick, "
    "pilot, smoke).",
    lock_config=True,
)
_ARMS = flags.DEFINE_string(
    "arms", None, "Comma-separated arms (default: the preset's; configs/replicate.py ARMS lists them)."
)
_SEEDS = flags.DEFINE_string(
    "seeds", None, "Comma-separated seeds for every arm (default: the preset's, which may differ by arm)."
)
_OUT = define_path(
    "out", None, "Output directory (default runs/{config file's name}, or runs/{config file's name}-{preset})."
)
_VERBOSE = flags.DEFINE_bool("verbose", False, "Print every run's per-phase and evaluation lines.")
_JOBS = flags.DEFINE_integer(
    "jobs",
    None,
    "Pieces of the grid (a seed's base checks, a run) to run at once, each in its own process (default: the "
    "preset's, configs/replicate.py JOBS; 0 = one per CPU core, at most 4). Results do not depend on it.",
)
_RESTART = flags.DEFINE_bool(
    "restart",
    False,
    "Redo the finished runs (and base checks) made with other settings than asked for, each old run moved to "
    "{workdir}.old-<time>; without it the command refuses them. Runs made with these settings are kept.",
)

_STATUS = flags.DEFINE_bool(
    "status",
    False,
    "Print where the grid in --out stands (per seed: base policy, base checks, runs done / running / started / to do; "
    "what finished pieces took; the time left) and exit. Reads no result, runs nothing.",
)
_REPORT = flags.DEFINE_bool(
    "report",
    False,
    "Write the report (results.csv, results.md, curves) from the finished runs and base checks in --out (and the "
    "config's ARM_DIRS beside it) and exit. Runs nothing.",
)
_PACK = define_path(
    "pack",
    None,
    "Copy the grid's finished pieces (summaries, metrics, probes, base checks, base policies) to this directory and "
    "exit, to resume the grid on another machine with --unpack (replication/archive.py). Runs nothing.",
)
_UNPACK = define_path(
    "unpack",
    None,
    "Restore a directory written by --pack into --out (and the base policies where the runs used them) and exit; "
    "then the plain command resumes the grid. Runs nothing.",
)


def _grid_module(filename: str):
    """The config file as a module; it must define the grid (`ARMS`, `GRIDS`, `arm_config`)."""
    spec = importlib.util.spec_from_file_location("replicate_config", filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not all(hasattr(module, name) for name in ("ARMS", "GRIDS", "arm_config")):
        sys.exit(
            f"error: {filename} defines no replication grid (ARMS, GRIDS, arm_config): "
            "use --config=configs/replicate.py[:PRESET]"
        )
    return module


def _csv(value: str | None, what: str, cast=str) -> list:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    try:
        return [cast(v) for v in items]
    except ValueError:
        sys.exit(f"error: --{what}={value!r}: give a comma-separated list, e.g. --{what}=0,1,2")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are flags, e.g. --arms=grpo,rltldr")
    filename, _, preset = flags.FLAGS["config"].config_filename.partition(":")
    grid = _grid_module(filename)
    preset = preset or "default"
    if preset not in grid.GRIDS:
        sys.exit(f"error: unknown preset {preset!r}; choose one of {', '.join(grid.GRIDS)}")
    default_arms = grid.GRIDS[preset][0]
    arms = _csv(_ARMS.value, "arms") or list(default_arms)
    seeds = _csv(_SEEDS.value, "seeds", int)
    unknown = [a for a in arms if a not in grid.ARMS]
    if unknown:
        sys.exit(f"error: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(grid.ARMS)}")

    stem = os.path.splitext(os.path.basename(filename))[0]  # replicate, replicate_v2: one directory per round
    out = _OUT.value or os.path.abspath(os.path.join("runs", stem if preset == "default" else f"{stem}-{preset}"))
    overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
    # Pretrained policies are cached in runs/pretrained (pretrain.cache_dir), shared by every grid: the quick
    # preset's is the full grid's seed 0.
    try:
        configs = grid_configs(grid, preset, arms, seeds, overrides)
    except base.ConfigError as e:
        sys.exit(f"error: {e}")
    quiet_logging()  # (before --pack too: reading a saved pretraining state through orbax logs at INFO)
    if _PACK.value or _UNPACK.value:
        _archive(configs, out)
        return
    if _STATUS.value:
        from rltldr_jax.replication.status import grid_status, status_lines

        print("\n".join(status_lines(grid_status(configs, out), out)))
        return
    # Arms kept in another grid directory, beside `out` (e.g. one run from a later install than the grid's).
    elsewhere = {arm: os.path.join(os.path.dirname(out), d) for arm, d in getattr(grid, "ARM_DIRS", {}).items()}
    from rltldr_jax.replication.driver import GridError, run_replication, write_report

    title = f"Small-scale replication ({preset})"
    if _REPORT.value:
        sizes = getattr(grid, "CHECKS", {}).get(preset) or {}
        try:
            paths = write_report(
                out,
                order=list(grid.ARMS),
                title=title,
                n_tasks=sizes.get("num_tasks"),
                analysis=grid_analysis(grid, preset),
                elsewhere=elsewhere,
                echo=lambda line: print(line, flush=True),
            )
        except GridError as e:
            sys.exit(f"error: {e}")
        for p in paths:
            print(f"  {p}")
        return
    # The grid's runs compile the same programs (every arm: the loss coefficients are traced): each is compiled once,
    # by the first run that needs it, into the compilation cache (compile.cache_dir) that every run process reads.
    use_compile_cache(_CONFIG.value.compile.cache_dir)
    if not _VERBOSE.value:
        for name in ("rltldr_jax.train.loop", "rltldr_jax.train.sft"):
            logging.getLogger(name).setLevel(logging.WARNING)
    interactive = sys.stderr.isatty()
    jobs = _JOBS.value if _JOBS.value is not None else getattr(grid, "JOBS", {}).get(preset, 1)
    if jobs < 0:
        sys.exit(f"error: --jobs={jobs}: give a number of processes >= 1, or 0 for one per CPU core")
    try:
        paths = run_replication(
            configs,
            out,
            title=title,
            checks=getattr(grid, "CHECKS", {}).get(preset),
            order=list(grid.ARMS),
            analysis=grid_analysis(grid, preset),
            elsewhere=elsewhere,
            restart=_RESTART.value,
            jobs=jobs,
            progress=interactive,
            echo=lambda line: print(line, flush=True),
        )
    except GridError as e:
        sys.exit(f"error: {e}")
    print(f"\nresults in {out}:")
    for p in paths:
        print(f"  {p}")
    print(f"next:\n  tensorboard --logdir {os.path.join(out, 'runs')}\n  cat {os.path.join(out, 'results.md')}")


def _archive(configs: dict, out: str) -> None:
    """--pack / --unpack: moves the grid's finished pieces between `out` and an archive directory (one line each)."""
    from rltldr_jax.replication.archive import ArchiveError, pack, summary_of, unpack, unprobed_runs
    from rltldr_jax.replication.driver import resolve_base_policies
    from rltldr_jax.replication.grid import plan_runs

    if _PACK.value and _UNPACK.value:
        sys.exit("error: --pack and --unpack both given: pack on the machine the grid ran on, unpack on the next")
    try:
        if _PACK.value:
            runs = plan_runs(resolve_base_policies(configs), out)
            unprobed = unprobed_runs(runs)
            if unprobed:
                print(
                    f"note: {len(unprobed)} finished runs have checkpoints but no probes ({', '.join(unprobed[:4])}"
                    f"{' ...' if len(unprobed) > 4 else ''}): their checkpoints are not packed, so run "
                    f"`python launch/probe_plans.py --grid={out}` first to keep their probes"
                )
            written = pack(runs, out, _PACK.value)
            archive = _PACK.value
        else:
            written = unpack(_UNPACK.value, out)
            archive = _UNPACK.value
    except ArchiveError as e:
        sys.exit(f"error: {e}")
    held = ", ".join(f"{n} {what}" for what, n in summary_of(archive).items())
    verb = "packed into" if _PACK.value else f"unpacked into {out} from"
    print(f"{len(written)} files {verb} {archive} (it holds {held})")
    if _UNPACK.value:
        print("next: rerun without --unpack to resume the grid (finished runs are skipped)")


def run() -> None:
    """`rltldr-replicate` (console script) and `python launch/replicate.py`."""
    as_main(__name__)
    run_launcher(main, hint="; rerun the same command to resume the grid")


if __name__ == "__main__":
    run()
