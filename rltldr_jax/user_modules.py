"""Importing a user's module named in a config (`env.name=package.module:SPEC`, `engine.kind=package.module:name`).

`import_user_module` is `importlib.import_module`, except that a top-level package that is not importable is also
looked for in the current directory — what `python -m package.module` and the `module:attr` loaders of other tools
do — so `--config.env.name=examples.my_env:SPEC` works from the repository root whether the launcher is
`python launch/train.py` (whose own directory, not the current one, starts Python's search path) or an installed
console script. The search path itself is left as it is: the package found there is imported under its name, and
its submodules are found through the package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def import_user_module(name: str) -> ModuleType:
    """The module `name` ("package.module"), imported as `importlib.import_module` does, or with its top-level
    package found in the current directory when no entry of the search path has it.

    Raises:
      ModuleNotFoundError: neither finds it; other exceptions of the module's own code propagate.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        top = name.partition(".")[0]
        if e.name != top or top in sys.modules:  # something inside the module is missing: its own error
            raise
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[top]
            raise
        return importlib.import_module(name)
