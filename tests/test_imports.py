"""Every module of the package imports on its own, first thing in a process: an import cycle (a module that works
only when another was imported before it) fails here rather than in the one launcher or notebook that happens to
import it first."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One interpreter; before each module every rltldr_jax module is forgotten, so each is imported from scratch (JAX and
# the other dependencies stay loaded: seconds in all, not one process per module).
_SCRIPT = r"""
import importlib, pkgutil, sys, traceback
import rltldr_jax
names = sorted(m.name for m in pkgutil.walk_packages(rltldr_jax.__path__, "rltldr_jax.")
               if "._" not in m.name and ".proto" not in m.name)
failed = []
from absl import flags
absl_flags = set(flags.FLAGS)
for name in names:
    for loaded in [m for m in sys.modules if m == "rltldr_jax" or m.startswith("rltldr_jax.")]:
        del sys.modules[loaded]
    for flag in set(flags.FLAGS) - absl_flags:  # a launcher's (rltldr_jax.cli.*), defined again by the next one
        delattr(flags.FLAGS, flag)
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print(len(names))
print("\n".join(failed))
"""


def test_every_module_imports_first():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count, *failed = out.stdout.strip().splitlines()
    assert int(count) > 40  # the walk found the package's modules
    assert not [f for f in failed if f], "\n".join(failed)


def test_every_name_a_package_exports_resolves():
    """The packages export their main names lazily (a table of name -> module): each must be found where the table
    says, so a module split or rename cannot leave an export pointing at the old home."""
    import importlib
    import pkgutil

    import rltldr_jax

    packages = ["rltldr_jax"] + [
        m.name for m in pkgutil.walk_packages(rltldr_jax.__path__, "rltldr_jax.") if m.ispkg and "._" not in m.name
    ]
    broken = []
    for name in packages:
        package = importlib.import_module(name)
        for export in getattr(package, "__all__", ()):
            try:
                getattr(package, export)
            except Exception as e:  # noqa: BLE001 (every failure is reported)
                broken.append(f"{name}.{export}: {e!r}")
    assert not broken, "\n".join(broken)
