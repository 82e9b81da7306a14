"""The installable layout: every launcher is `rltldr_jax/cli/NAME.py` (`main`, `run`), installed as the console
script `rltldr-NAME` and run from a checkout as `python launch/NAME.py`; what the config files share is
`rltldr_jax.config` (`configs/base.py`, `configs/ablations.py` and `configs/replicate.py` re-export it); nothing
edits `sys.path`."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHERS = sorted(
    f[:-3] for f in os.listdir(os.path.join(ROOT, "rltldr_jax", "cli")) if f.endswith(".py") and not f.startswith("_")
)
LAUNCHERS = [n for n in LAUNCHERS if n not in ("common", "multihost")]


def _console_scripts() -> dict[str, str]:
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CONSOLE_SCRIPTS":
            entries = ast.literal_eval(node.value)
            return dict(e.replace(" ", "").split("=", 1) for e in entries)
    raise AssertionError("setup.py defines no CONSOLE_SCRIPTS")


def test_every_launcher_is_a_console_script_and_a_launch_file():
    scripts = _console_scripts()
    assert scripts == {f"rltldr-{n.replace('_', '-')}": f"rltldr_jax.cli.{n}:run" for n in LAUNCHERS}
    assert {"rltldr-train", "rltldr-replicate", "rltldr-eval", "rltldr-sft", "rltldr-pretrain"} <= set(scripts)
    assert sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "launch")) if f.endswith(".py")) == LAUNCHERS
    for name in LAUNCHERS:
        text = open(os.path.join(ROOT, "launch", f"{name}.py"), encoding="utf-8").read()
        assert f"from rltldr_jax.cli.{name} import main, run" in text, name
        assert len(text.splitlines()) < 15, name  # a wrapper: the logic is in the package


def test_no_sys_path_manipulation():
    """Only the sandbox's child process narrows its own sys.path (isolation: envs/_sandbox_child.py)."""
    offenders = []
    for folder in ("launch", "benchmarks", "colab", "rltldr_jax", "configs"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith((".py", ".ipynb")) or path.endswith(os.path.join("envs", "_sandbox_child.py")):
                    continue
                if re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+?=|\[)", open(path).read()):
                    offenders.append(os.path.relpath(path, ROOT))
    assert not offenders


def test_config_files_import_from_the_package():
    from configs import ablations, base, replicate, sapi
    from rltldr_jax import config

    assert base.get_config is config.base.get_config and base.ConfigError is config.base.ConfigError
    assert ablations.resolve is config.ablations.resolve and ablations.ABLATIONS is config.ablations.ABLATIONS
    assert replicate.arm_config is config.replicate.arm_config and replicate.GRIDS is config.replicate.GRIDS
    for name in os.listdir(os.path.join(ROOT, "configs")):
        if name.endswith(".py") and name != "__init__.py":
            tree = ast.parse(open(os.path.join(ROOT, "configs", name), encoding="utf-8").read())
            imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            assert all(m.split(".")[0] in ("rltldr_jax", "__future__") for m in imported), (name, imported)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert config.load("configs/sapi.py:tiny") == sapi.get_config("tiny")
        assert config.load("configs/replicate.py") == replicate.get_config()
        with pytest.raises(FileNotFoundError, match="no config file 'configs/nope.py'"):
            config.load("configs/nope.py")
    finally:
        os.chdir(cwd)


def test_package_exports_main_names_lazily():
    code = (
        "import sys\n"
        "import rltldr_jax.train, rltldr_jax.agent, rltldr_jax.analysis, rltldr_jax.envs, rltldr_jax.config\n"
        "assert 'rltldr_jax.train.loop' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)\n"
        "from rltldr_jax.train import Trainer, phase_examples\n"
        "from rltldr_jax.agent import Collector, InsightWriter, InsightSchedule\n"
        "from rltldr_jax.analysis import insight_evolution, insight_reliance\n"
        "from rltldr_jax.replication import run_replication\n"
        "from rltldr_jax.train.loop import Trainer as T\n"
        "assert Trainer is T\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def _console(tmp_path, name: str, *args: str) -> subprocess.CompletedProcess:
    """`rltldr-NAME ARGS` as the installed console script runs it (sys.argv[0] without .py), from `tmp_path`."""
    code = f"import sys; sys.argv[0] = 'rltldr-{name}'; from rltldr_jax.cli.{name} import run; run()"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_console_script_from_another_directory(tmp_path):
    """Config files are named relative to the current directory; a missing one is one line naming it."""
    with open(os.path.join(ROOT, "configs", "sapi.py")) as src, open(tmp_path / "mine.py", "w") as dst:
        dst.write(src.read())
    out = _console(tmp_path, "train", "--config=mine.py:tiny", "--config.seed=3", "--dry_run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "seed: 3" in out.stdout
    out = _console(tmp_path, "train", "--config=configs/sapi.py:tiny", "--dry_run")
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error: no config file 'configs/sapi.py'; use one of ")
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    out = _console(tmp_path, "eval", "--help")
    assert "--checkpoint" in out.stdout and "--config" in out.stdout  # (absl exits 1 after --help)


def test_default_config_without_a_checkout(tmp_path, monkeypatch):
    """Without --config a launcher takes configs/NAME of the checkout it runs from, else of the current directory,
    else none (then `parse_flags` asks for --config)."""
    from rltldr_jax.cli import common

    assert common.default_config("sapi.py") == os.path.join(ROOT, "configs", "sapi.py")
    monkeypatch.setattr(common, "REPO_ROOT", str(tmp_path / "site-packages"))
    monkeypatch.chdir(tmp_path)
    assert common.default_config("sapi.py") is None and common.configs_dir() is None
    os.makedirs(tmp_path / "configs")
    open(tmp_path / "configs" / "sapi.py", "w").close()
    assert common.default_config("sapi.py") == str(tmp_path / "configs" / "sapi.py")
    assert common.default_config("replicate.py") is None


def test_no_config_and_no_default_is_one_line(tmp_path):
    """An installed package (no checkout around it) run without --config outside a checkout: one line."""
    code = (
        "import sys; sys.argv[0] = 'rltldr-train'\n"
        "from rltldr_jax.cli import common; common.REPO_ROOT = '/nonexistent'\n"
        "from rltldr_jax.cli.train import run; run()\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code, "--dry_run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: no --config given and no default here: use --config=FILE[:PRESET] with an experiment file such as "
        "configs/sapi.py of the rltldr_jax repository"
    )


#: Flags each launcher's `--help` must list (its own, then the shared config / multi-host ones it takes).
HELP_FLAGS = {
    "analyze_rollouts": ["--analysis", "--run"],
    "delta_theta": ["--base_checkpoint", "--checkpoint", "--out"],
    "eval": ["--checkpoint", "--out", "--config", "--ablation"],
    "export_hf": ["--out", "--dtype"],
    "insight_curves": ["--modes", "--max_k", "--config"],
    "pretrain": ["--checks", "--config"],
    "probe_plans": ["--grid", "--arms"],
    "replicate": ["--config", "--jobs", "--arms", "--pack"],
    "serve": ["--port", "--max_batch"],
    "serve_sglang": ["--num_servers", "--tp"],
    "sft": ["--dry_run", "--config"],
    "train": ["--dry_run", "--resume", "--config", "--ablation", "--coordinator_address"],
}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_help_lists_the_launchers_own_flags_and_exits_0(name):
    """`python launch/NAME.py --help`: the usage examples of its docstring (no `%` mangled by absl), then every flag it
    takes with its one-line help, on stdout, exit status 0."""
    out = subprocess.run(
        [sys.executable, f"launch/{name}.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"launch/{name}.py" in out.stdout.split("\n\n")[1] or f"launch/{name}.py" in out.stdout[:2000], name
    listed = {m.group(1) for m in re.finditer(r"^\s+(--[a-z_]+)(?:\[|:|,| )", out.stdout.replace("--[no]", "--"), re.M)}
    assert set(HELP_FLAGS[name]) <= listed, (name, sorted(listed))
    assert "launch/delta_theta.pyhare" not in out.stdout  # (absl's usage text substituted `%s` in "1% share")


def _launchers_imported_in_process() -> set[str]:
    """The launcher modules some test module imports into the test process (not in a subprocess's code string)."""
    names = set()
    for f in os.listdir(os.path.join(ROOT, "tests")):
        if not f.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, "tests", f), encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module == "rltldr_jax.cli":
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rltldr_jax.cli."):
                names.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("rltldr_jax.cli.")}
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("rltldr_jax.cli."):
                    names.add(arg.value.split(".")[2])
    return names - {"common", "multihost"}


def test_the_launchers_tests_import_in_process_coexist_in_one_process():
    """pytest-xdist puts any test modules on one worker, so every launcher a test imports in-process must import
    beside the others: a launcher that defines its flags on absl's global FLAGS at import (`--out`, `--checkpoint`)
    clashes with another that does (DuplicateFlagError, which once failed CI); such tests run it in a subprocess."""
    imported = sorted(_launchers_imported_in_process())
    assert {"delta_theta", "export_hf", "serve"} <= set(imported)  # (the scan finds them)
    code = "import importlib\n" + "".join(f"importlib.import_module('rltldr_jax.cli.{n}')\n" for n in imported)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
