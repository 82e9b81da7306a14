"""`replication.driver.isolated` (each piece of a grid in its own process) from a script without a `__main__` guard,
as a user's script or `python colab/01_replicate_small.py` calls the grid."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import math
import os

from rltldr_jax.replication.driver import isolated

print("top level", flush=True)
print("worker", isolated(os.getpid) != os.getpid(), isolated(math.factorial, 5), flush=True)
"""


def test_a_script_without_a_main_guard_runs_its_top_level_once(tmp_path):
    """Python's spawn start method re-imports a script's `__main__` in each child; the workers are started without
    it, so the script's top level (here: the calls themselves) runs once, and the calls return."""
    script = tmp_path / "mine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["top level", "worker True 120"]
