"""rltldr_jax.user_modules: a module a config names (`env.name=package.module:SPEC`, `engine.kind=...`) is found in
the current directory as `python -m` finds it, whichever way the launcher was started, without touching sys.path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rltldr_jax.user_modules import import_user_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_package_in_the_current_directory_is_found_and_the_search_path_left_alone(tmp_path, monkeypatch):
    pkg = tmp_path / "cwd_pkg_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 41 + 1\n")
    (pkg / "broken.py").write_text("import cwd_pkg_missing_dependency_for_test\n")
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    try:
        assert import_user_module("cwd_pkg_for_test.mod").VALUE == 42
        assert sys.path == path
        with pytest.raises(ModuleNotFoundError, match="cwd_pkg_missing_dependency_for_test"):
            import_user_module("cwd_pkg_for_test.broken")  # the module's own missing import, not ours
        with pytest.raises(ModuleNotFoundError, match="no_such_pkg_for_test"):
            import_user_module("no_such_pkg_for_test.mod")
    finally:
        for name in [m for m in sys.modules if m.startswith("cwd_pkg_for_test")]:
            del sys.modules[name]


def test_the_launcher_finds_the_examples_from_the_repository_root_without_pythonpath():
    """`python launch/train.py` starts Python's search path at launch/, not at the current directory; the loss-term
    example runs the launcher itself (`python -m`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    train = [sys.executable, "launch/train.py", "--config=configs/sapi.py:tiny"]
    commands = [
        [*train, "--config.env.name=examples.my_env:SPEC"],
        [*train, "--config.engine.kind=examples.scripted_engine:scripted"],
        [sys.executable, "-m", "examples.entropy_bonus", "--config=configs/sapi.py:tiny"]
        + ["--config.loss.terms=grpo,insight_sft,writer_sft,entropy_bonus", "--config.loss.entropy_coef=0.01"],
    ]
    for command in commands:
        out = subprocess.run(
            [*command, "--dry_run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert out.returncode == 0, out.stderr[-2000:]
    assert "entropy_coef: 0.01" in out.stdout
