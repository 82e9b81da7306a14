"""The persistent compilation cache every entry point sets up (rltldr_jax/compile_cache.py): a second process compiles
nothing the first compiled, also with another λ (the loss coefficients are traced); the directory is private."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from rltldr_jax.compile_cache import CompileCacheError, default_cache_dir, enable_compile_cache, private_directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cached_step(cache: str, lam: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "scripts", "cached_step.py"), cache, str(lam)],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing_even_with_another_lambda(tmp_path):
    """Two processes, each one train step (as two arms of a grid: λ = 0.1, then 0.5) with a fresh cache: the first
    compiles every program, the second reads every one from the cache and still gets its own λ's loss."""
    cache = str(tmp_path / "xla")
    first = _cached_step(cache, 0.1)
    second = _cached_step(cache, 0.5)
    assert first["requests"] > 0 and first["hits"] == 0
    assert second["requests"] == first["requests"] and second["hits"] == second["requests"]  # nothing compiled
    assert oct(os.stat(cache).st_mode & 0o777) == oct(0o700)
    # The same parameters and batch: the terms agree, and each loss is its own λ's.
    assert second["grpo_loss"] == pytest.approx(first["grpo_loss"], abs=1e-6)
    assert second["sft_nll"] == pytest.approx(first["sft_nll"], abs=1e-6)
    for result, lam in ((first, 0.1), (second, 0.5)):
        assert result["loss"] == pytest.approx(result["grpo_loss"] + lam * result["sft_nll"], rel=1e-5)


@pytest.fixture
def restore_cache():
    """The tests' own cache settings (conftest) back after a test that changes them."""
    before = {
        k: getattr(jax.config, k)
        for k in (
            "jax_compilation_cache_dir",
            "jax_enable_compilation_cache",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    yield
    enable_compile_cache(before["jax_compilation_cache_dir"] or "")
    for k, v in before.items():
        jax.config.update(k, v)


def test_every_program_is_cached_in_a_private_directory(tmp_path, restore_cache):
    path = enable_compile_cache(str(tmp_path / "a" / "xla"))
    assert path == str(tmp_path / "a" / "xla") and jax.config.jax_compilation_cache_dir == path
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1  # no minimum size, and JAX does not set one
    assert enable_compile_cache("") is None and not jax.config.jax_enable_compilation_cache


def test_the_default_is_jaxs_variable_else_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert default_cache_dir() == str(tmp_path / "jax")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "rltldr_jax" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "rltldr_jax", "xla")


def test_a_directory_others_can_write_is_refused_in_one_line(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # as a /tmp path another user could have created and filled
    with pytest.raises(CompileCacheError) as e:
        private_directory(str(shared))
    assert str(e.value) == (
        f"compile.cache_dir={str(shared)!r} can be written by other users (mode 777), who could plant compiled "
        "programs in it: remove it to have it recreated private, or set compile.cache_dir to a directory of your own "
        '(or "" to disable the cache)'
    )
    readable = tmp_path / "readable"
    readable.mkdir()
    readable.chmod(0o755)  # others can read, not write: made private, with a warning
    assert private_directory(str(readable)) == str(readable)
    assert readable.stat().st_mode & 0o777 == 0o700 and "had mode 755; made it 700" in caplog.text
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(CompileCacheError, match="is not a directory: set compile.cache_dir to a directory"):
        private_directory(str(afile))


def test_another_users_directory_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to create a directory owned by another user")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(CompileCacheError, match=r"belongs to another user \(uid 65534\)"):
        private_directory(str(theirs), key="--compile_cache_dir")


def test_a_launcher_with_an_unusable_cache_exits_with_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            "--config=configs/sapi.py:tiny",
            f"--config.compile.cache_dir={shared}",
            f"--config.workdir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: compile.cache_dir='{shared}' can be written by")
    assert "Traceback" not in out.stderr and not os.path.exists(tmp_path / "run")
