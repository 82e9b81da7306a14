"""benchmarks/collection.py --smoke: every row of both tables is printed with a finite positive time, the attempt
counts are those each row's collector promises, and the ratios are the printed times' ratios (no timing is
asserted: the times only have to exist)."""

from __future__ import annotations

import importlib.util
import math
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "collection_benchmark", os.path.join(ROOT, "benchmarks", "collection.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(lines: list[str], name: str, columns: int) -> list[float]:
    """The numbers printed after `name` on its row (exactly `columns` of them)."""
    [line] = [x for x in lines if re.match(rf"{re.escape(name)}\s+[-\d.na]", x)]
    numbers = [float(v) for v in line[len(name) :].split()]
    assert len(numbers) == columns, line
    return numbers


@pytest.mark.slow  # ~60 s on 2 cores (the whole benchmark at tiny shapes); `pytest -m slow` runs it
def test_smoke_prints_every_row(tmp_path):
    bench = _benchmark()
    lines: list[str] = []
    rows = bench.main(["--smoke", f"--xla_cache={tmp_path / 'unused'}"], out=lines.append)  # (the tests' cache is set)
    text = "\n".join(lines)
    assert "K = 2, 2 tasks per phase" in text, text
    for name in bench.COLLECTION_ROWS:
        seconds, attempts, ms_per_attempt, ratio = _row(lines, name, 4)
        assert math.isfinite(seconds) and seconds > 0 and ms_per_attempt > 0, (name, text)
        assert abs(ratio - rows[name]["seconds"] / rows["grpo parallel"]["seconds"]) <= 0.005, (name, text)
        assert attempts == rows[name]["attempts"]
    # Exactly K = 2 attempts per task where the collector promises it; at least K with concurrent chains.
    assert [_row(lines, n, 4)[1] for n in ("rltldr", "rltldr max_batch=T", "grpo parallel", "grpo sequential")] == [
        4,
        4,
        4,
        4,
    ]
    assert all(_row(lines, n, 4)[1] >= 4 for n in ("rltldr w=2", "rltldr w=4", "grpo parallel ≥K"))
    for name in bench.PHASE_ROWS:
        seconds, examples, steps, ratio = _row(lines, name, 4)
        assert math.isfinite(seconds) and seconds > 0 and examples >= 0 and steps >= 0, (name, text)
        assert abs(ratio - rows[name]["seconds"] / rows[bench.PHASE_BASELINE]["seconds"]) <= 0.005, (name, text)
    # Without the zero-advantage filter GRPO updates on every attempt (one step each here: 4 examples).
    assert _row(lines, "grpo parallel, all", 4)[1] == 4 and _row(lines, "grpo parallel, all", 4)[2] >= 1
