"""What the launchers share: absl flag parsing of `--config=FILE[:PRESET]` / `--config.KEY=VALUE` with clear errors,
path flags made absolute where they enter (`define_path`; config path keys in `ablations.resolve`), model flags that
also take a hub id (`define_model_path`), readable logging, the compilation cache every launcher uses
(`use_compile_cache`: `compile.cache_dir`), and `run_launcher`: SIGTERM / SIGINT as one line and exit status 128 + the
signal's number."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, Literal

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from rltldr_jax.config import ablations, base
from rltldr_jax.settings import Settings, as_dict
from rltldr_jax.train.stopping import Interrupted, StopSignals

#: The checkout this package runs from (the source tree, or an editable install): its `configs/` holds the default
#: config files. An installed wheel has none: there a config file is named relative to the current directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configs_dir() -> str | None:
    """The experiment configs' directory: the checkout's `configs/`, else `configs/` in the current directory, else
    None."""
    for folder in (os.path.join(REPO_ROOT, "configs"), os.path.abspath("configs")):
        if os.path.isfile(os.path.join(folder, "sapi.py")):
            return folder
    return None


def default_config(name: str) -> str | None:
    """`configs/NAME` in `configs_dir()`: a launcher's default `--config` (None when there is none: `parse_flags`
    then asks for `--config`)."""
    folder = configs_dir()
    return os.path.join(folder, name) if folder and os.path.isfile(os.path.join(folder, name)) else None


def define_config_flags(
    ablation_help: str = "A named baseline/ablation of rltldr_jax/config/ablations.py.",
) -> tuple[Any, Any]:
    """`--config=FILE[:PRESET]` (with `--config.KEY=VALUE` overrides) and `--ablation=NAME`; resolve with
    `resolve_config`."""
    config = config_flags.DEFINE_config_file(
        "config", default_config("sapi.py"), "Config file, with an optional :preset.", lock_config=True
    )
    return config, flags.DEFINE_string("ablation", None, ablation_help)


def resolve_config(config_flag: Any, ablation_flag: Any) -> Settings:
    """Preset → ablation → command-line overrides → validation: the run's settings; an invalid config exits with its
    message."""
    try:
        return ablations.resolve(
            config_flag.value, ablation_flag.value, config_flags.get_override_values(flags.FLAGS["config"])
        )
    except base.ConfigError as e:
        sys.exit(f"error: {e}")


def check_runnable(config: Settings, *, dry_run: bool = False, weights: bool = True) -> None:
    """What the config still lacks to run (`config.base.run_errors`: servers, weights), checked before anything
    heavy: exits with it in one line. With `dry_run`, prints the resolved config first, then exits (status 1 when
    something is missing, else 0)."""
    problems = base.run_errors(config, weights=weights)
    if dry_run:
        print(describe(config))
    if problems:
        sys.exit(
            f"error: {'; '.join(problems)}"
            + (" (the config above is valid, but cannot run as given)" if dry_run else "")
        )
    if dry_run:
        sys.exit(0)


def describe(settings: Settings) -> str:
    """The settings as `--dry_run` prints them: every key and value, nested as in the config files."""
    return str(ml_collections.ConfigDict(as_dict(settings)))


class _PathParser(flags.ArgumentParser):
    """A path flag's value, made absolute as it is parsed (`configs.base.absolute_path`)."""

    def parse(self, argument: str) -> str:
        return base.absolute_path(argument)

    def flag_type(self) -> str:
        return "path"


def define_path(name: str, default: str | None, help: str) -> flags.FlagHolder:
    """A flag holding a file or directory (`DIR:STEP` too), made absolute against the current directory where it
    enters, so that it means the same wherever it is used (argparse launchers: `type=base.absolute_path`)."""
    return flags.DEFINE(
        _PathParser(), name, default, help, serializer=flags.ArgumentSerializer(), module_name=_caller_module()
    )


class _ModelPathParser(_PathParser):
    """A flag naming an HF model or tokenizer: a path made absolute, or a hub id resolved to its local snapshot
    (`rltldr_jax.config.base.model_path`); an id that cannot be is the flag's error."""

    def __init__(self, what: Literal["model", "tokenizer"]):
        super().__init__()
        self.what = what

    def parse(self, argument: str) -> str:
        return base.model_path(argument, self.what)


def define_model_path(
    name: str, default: str | None, help: str, *, what: Literal["model", "tokenizer"] = "model"
) -> flags.FlagHolder:
    """`define_path` for a flag naming an HF model (or tokenizer) directory: it also takes a hub id
    `org/name[@revision]`, resolved where it enters to its snapshot in the local HF cache (downloaded if needed:
    rltldr_jax/models/hub.py). An existing local path always wins; a `DIR:STEP` training checkpoint is kept."""
    return flags.DEFINE(
        _ModelPathParser(what), name, default, help, serializer=flags.ArgumentSerializer(), module_name=_caller_module()
    )


def _caller_module() -> str:
    """The module that called the `define_*` function calling this: the launcher that owns the flag (its `--help`
    lists it among its own flags)."""
    return sys._getframe(2).f_globals["__name__"]


#: Loggers that print INFO noise at start-up and on every checkpoint: absl (orbax logs through it), JAX's back-end
#: probe ("Unable to initialize backend 'tpu'"), orbax.
NOISY_LOGGERS = ("absl", "jax._src.xla_bridge", "orbax")


class _PlainFormatter(logging.Formatter):
    """`HH:MM:SS message`; warnings and errors say their level."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno <= logging.INFO else text.replace(" ", f" {record.levelname}: ", 1)


def quiet_logging() -> None:
    """The NOISY_LOGGERS at WARNING (call before JAX starts), and the package's own INFO lines (one per phase and
    evaluation) as plain timestamped lines on stderr."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    package = logging.getLogger("rltldr_jax")
    package.setLevel(logging.INFO)
    if not package.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PlainFormatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        package.addHandler(handler)
        package.propagate = False  # not again through absl's handler on the root logger


def _config_files() -> str:
    """The config files to suggest: each one with a get_config (an environment's or the replication's; not
    base.py, ablations.py), or where they are when there is no configs/ directory."""
    folder = configs_dir()
    if folder is None:
        return "an experiment file such as configs/sapi.py of the rltldr_jax repository"
    shown = "configs" if os.path.abspath("configs") == folder else folder
    return "one of " + ", ".join(
        os.path.join(shown, f)
        for f in sorted(os.listdir(folder))
        if f.endswith(".py") and f not in ("__init__.py", "base.py", "ablations.py")
    )


#: The launcher module whose `--help` this process prints (`as_main` sets it).
_launcher: str | None = None
#: `--help` sections: module -> title, after the launcher's own flags.
HELP_SECTIONS = {__name__: "config", "rltldr_jax.cli.multihost": "multi-host (rltldr_jax/cli/multihost.py)"}
#: The help flags every launcher answers by printing `help_text()` to stdout and exiting 0 (absl's own exit 1 and
#: list only the main module's flags; `--helpfull` keeps absl's every-module listing, also with exit status 0).
HELP_FLAGS = ("--help", "-h", "-?", "--helpshort")
#: Old flag names still accepted for one release: old -> new (`define_alias`); using one prints a notice.
RENAMED: dict[str, str] = {}


def define_alias(old: str, new: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """`--old` as a deprecated alias of the flag `--new` (defined before, on `flag_values`): it sets the same flag,
    and using it prints one notice naming the new name (`parse_flags`, `notice_renamed`). Kept for a release after a
    flag is renamed, so scripts keep working."""
    flags.DEFINE_alias(old, new, flag_values=flag_values)
    RENAMED[old] = new


def help_text(module: str | None = None) -> str:
    """What `--help` prints: the launcher's docstring (its usage examples), then its own flags, then the config flags
    and the multi-host flags when it has them, each with its one-line help and default."""
    module = module or _launcher or "__main__"
    doc = (sys.modules[module].__doc__ or "").strip() if module in sys.modules else ""
    by_module = flags.FLAGS.flags_by_module_dict()
    main = module if module in by_module else sys.argv[0]  # (absl files `python -m`'s __main__ flags under argv[0])
    sections = []
    for name, title in ((main, "flags"), *HELP_SECTIONS.items()):
        shown = sorted((f for f in by_module.get(name, []) if f.name not in RENAMED), key=lambda f: f.name)
        if shown:
            sections.append(f"{title}:\n" + "\n".join(_flag_help(f) for f in shown))
    if RENAMED:
        sections.append(
            "renamed (old names still accepted for one release):\n"
            + "\n".join(f"  --{old} -> --{new}" for old, new in sorted(RENAMED.items()))
        )
    return "\n\n".join(filter(None, [doc, *sections])) + "\n"


def _flag_help(flag: flags.Flag) -> str:
    """One flag as `--help` lists it: `--name: help` (`--[no]name` for a boolean), then its default when it has one,
    wrapped at 80 columns."""
    import textwrap

    name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
    text = textwrap.fill(f"{name}: {flag.help}", 80, initial_indent="  ", subsequent_indent="    ")
    if flag.default is not None and flag.default != "":
        text += f"\n    (default: {flag.default_as_str})"
    return text


def notice_renamed(argv: list[str]) -> None:
    """One notice on stderr per deprecated flag name used (`define_alias`)."""
    for arg in argv[1:]:
        name = arg.split("=", 1)[0].removeprefix("--no" if arg.startswith("--no") else "--")
        if arg.startswith("--") and (name in RENAMED or arg.split("=", 1)[0][2:] in RENAMED):
            old = name if name in RENAMED else arg.split("=", 1)[0][2:]
            print(f"notice: --{old} is now --{RENAMED[old]} (the old name goes in the next release)", file=sys.stderr)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with clear errors: an unknown `--config.KEY`, a missing config file (also in the form
    `--config FILE`, which absl would otherwise load as an unreadable config) or a bad value names the flag and the
    fix. `--help` (`-h`) prints `help_text()` and exits 0; a renamed flag's old name prints a notice."""
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        sys.stdout.write(help_text())
        sys.exit(0)
    if "--helpfull" in argv[1:]:
        sys.stdout.write(flags.FLAGS.get_help() + "\n")
        sys.exit(0)
    notice_renamed(argv)
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith(("--config.", "--noconfig.")):
            key = arg.split("=", 1)[0].removeprefix("--no").removeprefix("--").removeprefix("config.")
            try:
                base.get(base.get_config(), key)  # every preset has the keys of base.get_config()
            except base.ConfigError as e:
                sys.exit(f"error: {e} (from {arg!r}); every key is documented in rltldr_jax/settings.py")
        elif arg.startswith("--config="):
            path = arg.removeprefix("--config=").split(":", 1)[0]
            if not os.path.isfile(path):
                sys.exit(f"error: no config file {path!r}; use {_config_files()}")
        elif arg == "--config":
            value = argv[i + 1] if i + 1 < len(argv) else ""
            if not value or value.startswith("-"):
                sys.exit("error: --config needs a file: use --config=FILE[:PRESET], e.g. --config=configs/sapi.py:tiny")
            path = value.split(":", 1)[0]
            if not os.path.isfile(path):
                sys.exit(
                    f"error: no config file {path!r} (from '--config {value}'); use --config=FILE[:PRESET] with "
                    f"{_config_files()}"
                )
    try:
        argv = flags.FLAGS(argv)
    except flags.Error as e:
        # config_flags re-raises a config file's exception with a traceback in its text: report the original.
        cause, original = e.__cause__ or e.__context__, None
        while cause is not None:
            if isinstance(cause, base.ConfigError):
                original = cause
            cause = cause.__cause__ or cause.__context__
        sys.exit(f"error: {original if original is not None else e}")
    if "config" in flags.FLAGS and flags.FLAGS["config"].value is None:  # no --config, and no default file found
        sys.exit(f"error: no --config given and no default here: use --config=FILE[:PRESET] with {_config_files()}")
    return argv


def use_compile_cache(cache_dir: str | None, *, key: str = "compile.cache_dir") -> str | None:
    """JAX's persistent compilation cache in `cache_dir` (`rltldr_jax.compile_cache.enable_compile_cache`: None = the
    default per-user directory, "" = none), before anything compiles; a directory that cannot be used exits with
    one line naming `key` and the fix. Returns the directory (None when disabled)."""
    from rltldr_jax.compile_cache import CompileCacheError, enable_compile_cache

    try:
        return enable_compile_cache(cache_dir, key=key)
    except CompileCacheError as e:
        sys.exit(f"error: {e}")


def with_pretrained(config: Settings) -> Settings:
    """`config` with `model.checkpoint` set to its pretrained policy when `pretrain.steps > 0` and no checkpoint is
    given (pretrains it first, or finds it in the cache: train/pretrain.py); exits with the reason on failure."""
    from rltldr_jax.train.pretrain import ensure_pretrained

    try:
        return ensure_pretrained(config, progress=sys.stderr.isatty())
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


def as_main(module: str) -> None:
    """A launcher's docstring and flags as `--help` shows them, when the launcher runs from a console script or
    launch/*.py (whose `__main__` module only calls its `run`) as when it is `__main__` itself: absl's usage text is
    `__main__`'s docstring, and `--help` lists the flags of the main module and of this one (`--config`, ...)."""
    global _launcher
    _launcher = module
    main = sys.modules["__main__"]
    if main is not sys.modules[module]:
        main.__doc__ = sys.modules[module].__doc__
        for name in (module, __name__, "rltldr_jax.cli.multihost"):
            for flag in flags.FLAGS.get_key_flags_for_module(name):
                flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run_launcher(main: Callable[[list[str]], Any], *, hint: str = "") -> None:
    """`app.run(main, flags_parser=parse_flags)` with SIGTERM and SIGINT handled from the start (rltldr_jax/train/
    stopping.py): a `Trainer.run` inside stops at its next safe point with a checkpoint ("stopped by SIGTERM at phase
    3; checkpoint saved (step 3)"); anywhere else (start-up, pretraining, a second signal) the launcher stops at once
    ("interrupted by SIGINT"). Either way that is the one line printed, followed by `hint` (e.g. "; resume with
    --resume"), with no traceback, and the exit status is 128 + the signal's number: 143 for SIGTERM (preemption, a
    scheduler's time limit), 130 for SIGINT (Ctrl-C)."""
    with StopSignals(defer=False, quiet_abort=True):
        try:
            app.run(main, flags_parser=parse_flags)
        except Interrupted as e:  # (RunStopped too)
            _interrupted(e.exit_status, f"{e}{hint}")
        except KeyboardInterrupt:  # (Python's own SIGINT handler: before this one was installed)
            _interrupted(130, f"interrupted by SIGINT{hint}")


def _interrupted(status: int, line: str) -> None:
    logging.disable(logging.ERROR)  # what the stopped threads still report at exit would follow the line
    print(line, file=sys.stderr, flush=True)
    sys.exit(status)
