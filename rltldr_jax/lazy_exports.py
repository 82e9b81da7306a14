"""A package's main names, imported on first use: `from rltldr_jax.train import Trainer` works, and importing the
package (or one of its modules) does not import the modules behind the other names.

    __all__, __getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "rltldr_jax.train.loop", ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """The `__all__`, module `__getattr__` (PEP 562) and `__dir__` of `package`, exporting each name of `exports`
    (name -> the module defining it) from that module, imported when the name is first read."""
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return sorted(table), __getattr__, __dir__
