"""What the launchers share: absl flag parsing of `--config=FILE[:PRESET]` / `--config.KEY=VALUE` with clear errors."""

from __future__ import annotations

import os
import sys

from absl import flags

from configs import base


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
