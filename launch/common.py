"""What the launchers share: absl flag parsing of `--config=FILE[:PRESET]` / `--config.KEY=VALUE` with clear errors."""

from __future__ import annotations

import os
import sys
from typing import Any

from absl import flags
from ml_collections import config_flags

from configs import ablations, base

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def define_config_flags(ablation_help: str = "A named baseline/ablation of configs/ablations.py.") -> tuple[Any, Any]:
    """`--config=FILE[:PRESET]` (with `--config.KEY=VALUE` overrides) and `--ablation=NAME`; resolve with
    `resolve_config`."""
    config = config_flags.DEFINE_config_file(
        "config", os.path.join(REPO_ROOT, "configs", "sapi.py"), "Config file, with an optional :preset.", lock_config=True
    )
    return config, flags.DEFINE_string("ablation", None, ablation_help)


def resolve_config(config_flag: Any, ablation_flag: Any) -> Any:
    """Preset → ablation → command-line overrides → validation; an invalid config exits with its message."""
    try:
        return ablations.resolve(config_flag.value, ablation_flag.value, config_flags.get_override_values(flags.FLAGS["config"]))
    except base.ConfigError as e:
        sys.exit(f"error: {e}")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with clear errors: an unknown `--config.KEY` or a bad value names the flag and the fix."""
    for arg in argv[1:]:
        if arg.startswith(("--config.", "--noconfig.")):
            key = arg.split("=", 1)[0].removeprefix("--no").removeprefix("--").removeprefix("config.")
            try:
                base.get(base.get_config(), key)  # every preset has the keys of base.get_config()
            except base.ConfigError as e:
                sys.exit(f"error: {e} (from {arg!r}); every key is documented in configs/base.py")
        elif arg.startswith("--config="):
            path = arg.removeprefix("--config=").split(":", 1)[0]
            if not os.path.isfile(path):
                sys.exit(f"error: no config file {path!r}; use one of configs/sapi.py, configs/appworld.py, configs/leetcode.py")
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        # config_flags re-raises a config file's exception with a traceback in its text: report the original.
        cause, original = e.__cause__ or e.__context__, None
        while cause is not None:
            if isinstance(cause, base.ConfigError):
                original = cause
            cause = cause.__cause__ or cause.__context__
        sys.exit(f"error: {original if original is not None else e}")
