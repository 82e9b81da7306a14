"""What the experiment config files (`configs/*.py`, loaded by path: `--config=configs/sapi.py:tiny`) share:
`base` (the ConfigDict of every key of `rltldr_jax.settings`, and its validation), `ablations` (the paper's baselines
and ablations by name; `resolve` makes a config the run's `Settings`) and `replicate` (the small-scale replication's
presets, arms and grids); `load` reads an experiment file by path, as `--config=FILE[:PRESET]` does."""

from __future__ import annotations

import importlib.util
import os
from typing import Any


def load(spec: str) -> Any:
    """`get_config(PRESET)` of an experiment config file named as on the command line, `FILE[:PRESET]` (e.g.
    `load("configs/sapi.py:tiny")`, FILE relative to the current directory), as `--config=FILE[:PRESET]` loads it:
    not validated or resolved (`ablations.resolve` does that)."""
    path, _, preset = spec.partition(":")
    if not os.path.isfile(path):
        folder = os.path.join(os.path.dirname(path) or ".", "")
        files = sorted(
            f
            for f in (os.listdir(folder) if os.path.isdir(folder) else [])
            if f.endswith(".py") and f not in ("__init__.py", "base.py", "ablations.py")
        )
        hint = f"; {folder} holds {', '.join(files)}" if files else "; run from the repository root (configs/ is there)"
        raise FileNotFoundError(f"no config file {path!r} (in {os.getcwd()}){hint}")
    module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(preset or None)
