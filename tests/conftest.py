"""Shared set-up: XLA compiling without LLVM's optimisations and the on-disk compilation cache (for subprocesses
too), the SAPI task lists generated once per session, the Qwen 3.5 tokenizer (~3 s to build), a tiny policy engine
(compiling is the cost), and opt-in reports of where JAX's seconds go (RLTLDR_TEST_COMPILE_REPORT=1) and of the tests
that use the most CPU (--cpu-durations=N). Config builders: tests/helpers.py."""

import dataclasses
import functools
import os
import resource
import signal

# XLA compiles the tests' programs without LLVM's optimisation passes (`--xla_backend_optimization_level=0`, set
# before JAX starts its backend, and inherited by every process the tests start). At the tests' tiny shapes compiling
# is most of a test's time and running the code is little: measured 2026-12-07 on three default modules that build
# Trainers (test_kl_term, test_loss_terms, test_extending_loss; cold cache, one process), XLA compilation 352 -> 203 s
# and CPU 284 -> 221 s, the same tests passing. Every comparison a test makes is between programs compiled with the
# same flags (the flags are part of the compilation cache's key). RLTLDR_TEST_XLA_OPT=1 compiles as users' runs do.
if os.environ.get("RLTLDR_TEST_XLA_OPT") != "1" and "xla_backend_optimization_level" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import jax  # noqa: E402 (after XLA_FLAGS)
import pytest  # noqa: E402

from rltldr_jax.compile_cache import enable_compile_cache  # noqa: E402

# Compiled XLA programs are cached on disk (every one, however small: rltldr_jax/compile_cache.py), so the many
# Trainers/engines the tests build with the same shapes compile once per session (and once per machine across
# sessions); tracing still runs every time. The environment variables give the same cache to every subprocess the
# tests start: launchers take $JAX_COMPILATION_CACHE_DIR as their compile.cache_dir default, servers, notebooks and
# other scripts read it (and the two thresholds) as JAX does. So a program compiled in one process is read by the
# others.
XLA_CACHE = enable_compile_cache(
    os.environ.get(
        "RLTLDR_TEST_XLA_CACHE",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "xla"),
    ),
    key="RLTLDR_TEST_XLA_CACHE",
)
# The processes the tests start (launch/*.py, benchmarks, notebooks, servers) import the package from this checkout,
# as this process does (pytest.ini's pythonpath), whichever copy is installed.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)
# A shell starts a background job (`pytest &`, nohup) with SIGINT ignored, which the trainer's StopSignals respects
# (train/stopping.py), so the Ctrl-C tests would see no signal, here and in the processes they start: give them one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if XLA_CACHE:  # (RLTLDR_TEST_XLA_CACHE="": no cache)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = XLA_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

from rltldr_jax.tokenization import ContextBuilder, Tokenizer, load_tokenizer  # noqa: E402 (after the cache is set)

# RLTLDR_TEST_COMPILE_REPORT=1: where the suite's seconds go in JAX, per test (tracing, lowering, XLA compilation
# or a compilation-cache read), listed at the end of a run in one process (`-n 0`). Subprocesses (launch/*.py,
# notebooks) are not counted.
_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_compile_seconds: dict[str, dict[str, float]] = {}
_compile_by_function: dict[str, tuple[int, float]] = {}
_current_test = ["(collection)"]

if os.environ.get("RLTLDR_TEST_COMPILE_REPORT"):

    def _on_duration(event: str, seconds: float, fun_name: str = "?", **_: object) -> None:
        if event in _COMPILE_EVENTS:
            per_test = _compile_seconds.setdefault(_current_test[0], dict.fromkeys(_COMPILE_EVENTS.values(), 0.0))
            per_test[_COMPILE_EVENTS[event]] += seconds
            if event.endswith("backend_compile_duration"):
                count, total = _compile_by_function.get(fun_name, (0, 0.0))
                _compile_by_function[fun_name] = (count + 1, total + seconds)

    jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current_test[0] = "(between tests)"


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests that used the most CPU seconds (user + system of the test's process, all its threads, "
        "and of the subprocesses it waited for; setup + call + teardown): unlike --durations, a ranking that holds "
        "on a loaded machine",
    )


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measured(phase: str):
    """A wrapper of the `pytest_runtest_{phase}` hook that records the phase's CPU seconds in the test's
    user_properties (which pytest-xdist carries from its workers to the process that reports)."""

    @pytest.hookimpl(wrapper=True)
    def hook(item):
        start = _cpu_seconds()
        try:
            return (yield)
        finally:
            item.user_properties.append((f"cpu_s:{phase}", _cpu_seconds() - start))

    return hook


pytest_runtest_setup = _measured("setup")
pytest_runtest_call = _measured("call")
pytest_runtest_teardown = _measured("teardown")
_cpu_by_test: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":  # (its user_properties hold every phase's)
        _cpu_by_test[report.nodeid] = sum(v for k, v in report.user_properties if k.startswith("cpu_s:"))


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-durations")
    if n and _cpu_by_test:
        terminalreporter.section(f"the {n} tests that used the most CPU (--cpu-durations)")
        terminalreporter.line(f"total: {sum(_cpu_by_test.values()):.0f} CPU s over {len(_cpu_by_test)} tests")
        for nodeid, seconds in sorted(_cpu_by_test.items(), key=lambda kv: -kv[1])[:n]:
            terminalreporter.line(f"{seconds:8.1f} s  {nodeid}")
    if not _compile_seconds:
        return
    rows = sorted(_compile_seconds.items(), key=lambda kv: -sum(kv[1].values()))
    total = {k: sum(r[k] for _, r in rows) for k in _COMPILE_EVENTS.values()}
    terminalreporter.section("JAX trace / lower / compile seconds per test (RLTLDR_TEST_COMPILE_REPORT)")
    terminalreporter.line("total: " + ", ".join(f"{k} {v:.1f} s" for k, v in total.items()))
    for nodeid, r in rows[:40]:
        terminalreporter.line(
            f"{sum(r.values()):7.1f} s  ({', '.join(f'{k} {v:.1f}' for k, v in r.items())})  {nodeid}"
        )
    terminalreporter.line("XLA compilation (or cache reads) by function: seconds, count")
    for name, (count, seconds) in sorted(_compile_by_function.items(), key=lambda kv: -kv[1][1])[:25]:
        terminalreporter.line(f"{seconds:7.1f} s  {count:4d}  {name}")


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def builder(tokenizer) -> ContextBuilder:
    return ContextBuilder(tokenizer)


@pytest.fixture(scope="session")
def tiny_policy():
    """(model, JaxEngine): a tiny random Qwen 3.5 (4 layers) with the real 248,320-token vocabulary."""
    from rltldr_jax.engines import JaxEngine
    from rltldr_jax.models import ModelSpec, get_preset

    config = dataclasses.replace(get_preset("tiny"), num_hidden_layers=4, layer_types=())
    model = ModelSpec(config).build(seed=0)
    with JaxEngine(model, max_batch=2, max_len=2048) as engine:
        yield model, engine


@pytest.fixture(autouse=True)
def _logging_as_found():
    """Each test leaves the logging set-up as it found it: a launcher's `main` run in-process
    (`cli.common.quiet_logging`) adds a handler to the package's logger and sets levels, which
    `replication.driver.isolated` passes on to its workers; left in place, a later test on the same pytest-xdist
    worker would see other output than run alone."""
    import logging

    names = ("", "rltldr_jax", "absl", "orbax", "jax._src.xla_bridge")
    saved = {
        n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
        for n in names
    }
    yield
    for name, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.fixture(scope="session", autouse=True)
def _sapi_tasks_generated_once():
    """Every Trainer (and evaluation) loads its split through `load_tasks`, which generates SAPI's ~16k train tasks
    anew (~9 s on 2 cores); in the tests they are generated once per (split, seed, n) and shared (the Tasks are
    frozen; each caller gets its own list). Installed after collection, so the tests that import `generate_tasks`
    itself (test_sapi.py checks that it is deterministic) call the real function."""
    from rltldr_jax.envs.sapi import tasks

    real = tasks.generate_tasks
    cached = functools.cache(lambda split, seed, n: tuple(real(split, seed=seed, n=n)))

    @functools.wraps(real)
    def generate_tasks(split, seed=0, n=None):
        return list(cached(split, seed, n))

    tasks.generate_tasks = generate_tasks
    yield
    tasks.generate_tasks = real


# The modules that take longest (cold cache, 2 cores, longest first) run first, so that pytest-xdist workers start on
# them and the many short modules fill in at the end (with `--no-loadscope-reorder`; by default xdist would start
# with the modules that hold the most tests, and end on a worker running the notebooks alone).
# Order (--cpu-durations, 2026-12-05): the notebooks (the longest of `-m slow`), then the default run's modules by CPU
# seconds, then modules whose cost is mostly in `-m slow` (the last five added from `-m slow`'s --cpu-durations of
# 2026-12-07: 190-230 CPU s each, which had run last on one worker while the other sat idle).
LONGEST_MODULES = (
    "test_notebooks.py",
    "test_replication.py",
    "test_ablations.py",
    "test_jax_engine.py",
    "test_packing.py",
    "test_train_loop.py",
    "test_kl_term.py",
    "test_overlap.py",
    "test_sharding.py",
    "test_qwen3_5.py",
    "test_attention.py",
    "test_grpc_engine.py",
    "test_extending_loss.py",
    "test_loss_terms.py",
    "test_resume.py",
    "test_collection_benchmark.py",
    "test_multihost.py",
    "test_device_benchmark.py",
    "test_initial_weights.py",
    "test_pretrain_resume.py",
    "test_seeds_benchmark.py",
    "test_lora.py",
    "test_lora_dropout.py",
    "test_replication_v2.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every module keeps its own order


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error where xdist is not installed (`-o addopts=`)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): the suite runs on up to 4 pytest-xdist workers, one per core (XLA compiles on one
    core, and compiling is most of the suite's time); a run of chosen files or tests runs in this process (no
    workers: `pdb` and `-s` work). `-n 0` runs everything in this process; PYTEST_XDIST_AUTO_NUM_WORKERS=N sets N."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if any(arg.endswith(".py") or "::" in arg for arg in config.args):
        return 0
    return max(1, min(4, os.cpu_count() or 1))
