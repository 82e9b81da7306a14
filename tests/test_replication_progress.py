"""The replication's progress output (rltldr_jax/progress.py): labels as the log names phases, one line per worker
process drawn by the launcher from the worker's messages, the worker's output and the launcher's lines written above
the bars (never inside one), and a smoke grid drawn that way, computing what it computes without bars."""

import io
import json
import logging
import os
import re
import sys

import pytest

from rltldr_jax.config import replicate

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _segments(text: str) -> list[str]:
    """What a terminal would show line by line at some moment: the stream cut at every carriage return and newline,
    without cursor moves and trailing blanks (tqdm clears a line with spaces)."""
    return [s.rstrip() for s in re.split(r"[\r\n]", _ANSI.sub("", text)) if s.strip()]


def test_phase_labels_are_the_logs():
    from rltldr_jax.analysis.insight_curves import CURVE_PHASE
    from rltldr_jax.progress import phase_label
    from rltldr_jax.train.report import eval_line, phase_line

    assert [phase_label(tag) for tag in (0, 1, 29)] == ["phase 1", "phase 2", "phase 30"]
    assert phase_label(CURVE_PHASE) == "base checks"
    assert phase_label(-1) == "evaluation"  # tag 0: before any training (the base checks, an untrained policy)
    assert phase_label(-1 - 5) == "eval after phase 5"
    # The trainer collects phase tag p and logs that phase as phase_line(p + 1, ...); it evaluates after phase n with
    # tag n (collected as phase -1 - n, train/evaluation.py) and logs eval_line(n, ...).
    for tag in (0, 4):
        assert phase_line(tag + 1, 64, {}).startswith(phase_label(tag) + ":")
    assert eval_line(5, {}, attempts_per_task=2, seconds=1.0).startswith(phase_label(-1 - 5) + ":")


def _worker(phases: int) -> int:
    """A worker process's work (run by `isolated`): a run's bar with a bar per phase inside, and output of every
    kind: print, a log warning, a raw write to file descriptor 2, a last line without newline."""
    from rltldr_jax import progress

    print("to stdout")
    run = progress.bar(phases, "starting", unit="env step")
    for tag in range(phases):
        inner = progress.bar(2, progress.phase_label(tag), unit="attempt")
        inner.update(1)
        inner.update(1)
        inner.close()
        run.update(1)
        run.set_description(f"phase {tag + 1} done")
    logging.getLogger("rltldr_jax.progress_test").warning("a warning")
    os.write(2, b"raw\n")
    sys.stderr.write("no newline")
    sys.stderr.flush()
    run.close()
    return 10 * phases


def _dying_worker() -> None:
    print("last words", flush=True)
    os._exit(3)


@pytest.mark.parametrize("launcher_logging", [False, True], ids=["plain", "launcher"])
def test_a_worker_is_one_line_drawn_by_its_parent(launcher_logging, monkeypatch):
    """The worker's bars are one line of the board, named by the task (the outer bar's count, the inner bar's label);
    its output, whatever wrote it, is printed whole above the bars, prefixed by the task's name. Under a launcher
    (`quiet_logging`: the package's log lines timestamped) the worker's log lines are timestamped too."""
    from rltldr_jax.cli.common import quiet_logging
    from rltldr_jax.progress import Board
    from rltldr_jax.replication.driver import _LOGGERS, isolated

    # The logging set-up `isolated` passes on to its worker, as a process starts with it (whatever an earlier test
    # in this process left: conftest restores it after each test, not after a module's fixtures).
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "level", logging.NOTSET)
        monkeypatch.setattr(logger, "handlers", [])
        monkeypatch.setattr(logger, "propagate", True)
    monkeypatch.setattr(logging.root.manager, "disable", logging.NOTSET)
    if launcher_logging:
        quiet_logging()
    stream = io.StringIO()
    with Board(stream, total=1) as board:
        with board.task("job"):
            assert isolated(_worker, 3) == 30
        board.advance()
    shown = _segments(stream.getvalue())
    for line in ("to stdout", "raw", "no newline"):
        assert shown.count(f"job · {line}") == 1, (line, shown)
    # The log line whole, once, whatever format the worker's logging gives it (a library may have configured its
    # root logger: "WARNING:rltldr_jax.progress_test:a warning"); under a launcher, timestamped as the launcher's.
    warned = [s for s in shown if s.startswith("job · ") and s.endswith("a warning")]
    assert len(warned) == 1, shown
    if launcher_logging:
        assert re.fullmatch(r"job · \d\d:\d\d:\d\d a warning", warned[0]), warned
    assert all(s.startswith(("job ", "grid")) for s in shown), shown  # no bar of its own for an inner bar
    assert any(s.startswith("job · phase 3 done:") and "3/3 [" in s for s in shown), shown  # the run's bar at its end
    for tag in range(3):  # each phase's bar labels the run's bar
        assert any(s.startswith(f"job · phase {tag + 1} 2/2:") and "/3 [" in s for s in shown), (tag, shown)
    assert any(s.startswith("grid") and "1/1" in s for s in shown), shown
    assert not any("phase 0" in s for s in shown)


def test_a_worker_that_dies_has_its_output_printed():
    from concurrent.futures.process import BrokenProcessPool

    from rltldr_jax.progress import Board
    from rltldr_jax.replication.driver import isolated

    stream = io.StringIO()
    with Board(stream) as board, board.task("job"), pytest.raises(BrokenProcessPool):
        isolated(_dying_worker)
    assert "job · last words" in _segments(stream.getvalue())


def _grid_configs(out: str) -> dict:
    """The smoke grid's grpo run on the shipped base policy of seed 0 (the default preset's pretraining settings):
    nothing to pretrain."""
    from rltldr_jax.train.pretrain import shipped_dir

    pretraining = replicate.arm_config("default", "grpo", 0).pretrain
    overrides = {
        "pretrain.steps": pretraining.steps,
        "pretrain.batch_size": pretraining.batch_size,
        "pretrain.cache_dir": os.path.join(out, "pretrained"),
    }
    configs = {("grpo", 0): replicate.arm_config("smoke", "grpo", 0, overrides)}
    assert shipped_dir(configs["grpo", 0]) is not None
    return configs


@pytest.fixture(scope="module")
def drawn_grid(tmp_path_factory):
    """The grid run with its bars drawn on a stream, the launcher's lines written to the same stream."""
    from rltldr_jax.replication.driver import run_replication

    out = str(tmp_path_factory.mktemp("progress"))
    stream = io.StringIO()
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        stream.write(line + "\n")

    run_replication(_grid_configs(out), out, checks=replicate.CHECKS["smoke"], progress=stream, echo=echo)
    return out, stream.getvalue(), lines


def test_a_grid_draws_a_line_per_run_and_writes_lines_above(drawn_grid):
    _, text, lines = drawn_grid
    shown = _segments(text)
    assert len(lines) == 4 and lines[0].startswith("seed 0: base policy") and lines[1].startswith("seed 0: base checks")
    assert lines[2].startswith("grpo seed 0: no-insight Pass@1") and lines[3].startswith("grid done in")
    for line in lines:  # every line whole, on its own
        assert line in shown, line
    # Everything else is a bar or a worker's output line, each starting with its name: nothing torn.
    names = ("grid", "seed 0 ", "grpo seed 0 ")
    assert all(s in lines or s.startswith(names) for s in shown), [s for s in shown if s not in lines][:20]
    run = [s for s in shown if s.startswith("grpo seed 0 · ")]
    budget = replicate.arm_config("smoke", "grpo", 0).train.env_step_budget
    assert any(f"{budget}/{budget}" in s and s.startswith("grpo seed 0 · phase 1 done") for s in run), run
    assert any(s.startswith("grpo seed 0 · phase 1 ") for s in run)  # phase tag 0, as the log names it
    assert any(s.startswith("grpo seed 0 · eval after phase 1 ") for s in run)  # the run's final evaluation
    checks = [s for s in shown if s.startswith("seed 0 · ")]
    assert any(s.startswith("seed 0 · base checks") for s in checks) and any(
        s.startswith("seed 0 · evaluation") for s in checks
    )
    assert any(s.startswith("grid") and "1/1" in s for s in shown)
    assert not [s for s in shown if re.search(r"phase -|phase 0\b", s)]


@pytest.mark.slow
def test_bars_change_nothing_a_run_computes(drawn_grid, tmp_path):
    """The same grid without bars: the same phases and evaluations, final parameters and base checks."""
    from rltldr_jax.replication.driver import run_replication

    drawn, _, _ = drawn_grid
    plain = str(tmp_path / "plain")
    run_replication(_grid_configs(plain), plain, checks=replicate.CHECKS["smoke"], echo=print)

    def results(grid):
        directory = os.path.join(grid, "runs", "grpo-s0")
        with open(os.path.join(directory, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        with open(os.path.join(directory, "summary.json")) as f:
            final = json.load(f)["final"]
        (step,) = os.listdir(os.path.join(directory, "checkpoints"))
        with open(os.path.join(directory, "checkpoints", step, "state", "metadata")) as f:
            params = json.load(f)["checksums"]["params"]
        with open(os.path.join(grid, "base", "s0", "checks.json")) as f:
            checks = json.load(f)["checks"]
        timeless = [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")} for r in records]
        assert records and final and len(params) > 10
        return timeless, final, params, checks

    assert results(drawn) == results(plain)
