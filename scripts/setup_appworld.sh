#!/usr/bin/env bash
# Creates the separate virtualenv that runs AppWorld (PyPI `appworld`, which pins pydantic<2 and so cannot share
# the main pydantic-2 environment), installs the package and decrypts its apps (offline).
#
#   bash scripts/setup_appworld.sh            # venv at ~/.venvs/appworld
#   APPWORLD_VENV=/opt/aw bash scripts/setup_appworld.sh
#
# Env vars: APPWORLD_VENV (venv folder, default ~/.venvs/appworld), APPWORLD_VERSION (default 0.1.3.post1),
# PYTHON (the interpreter that creates the venv; AppWorld needs Python >=3.11), APPWORLD_ROOT (where the task data
# goes: $APPWORLD_ROOT/data; default ~/appworld, the adapter's default too: keep it outside the git checkout).
# The adapter (rltldr_jax/envs/appworld.py) finds the venv's python through APPWORLD_PYTHON or the default path.
set -euo pipefail

VENV="${APPWORLD_VENV:-$HOME/.venvs/appworld}"
VERSION="${APPWORLD_VERSION:-0.1.3.post1}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
if [[ -z "$PY" ]] || ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "setup_appworld: need Python >= 3.11 to create the venv (set PYTHON=...)" >&2
  exit 1
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "== creating venv $VENV with $($PY -V 2>&1)"
  "$PY" -m venv "$VENV"
fi
echo "== pip install appworld==$VERSION"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "appworld==$VERSION"

echo "== appworld install (decrypts the bundled apps; offline)"
# `appworld install` writes into site-packages and into $APPWORLD_CACHE (default ~/.appworld).
"$VENV/bin/appworld" install

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import appworld.apps  # noqa: F401  (fails if the decryption did not happen)
print("appworld", md.version("appworld"), "| pydantic", md.version("pydantic"))
PY
echo "== done in $(( $(date +%s) - start )) s"

ROOT="${APPWORLD_ROOT:-$HOME/appworld}"
cat <<MSG

AppWorld venv ready: $VENV
  python for the adapter:  export APPWORLD_PYTHON=$VENV/bin/python   (this path is also the default)

Task data (tasks, databases, ground truth) is NOT in the package. It comes only from AWS S3:
  on a machine with internet:   $VENV/bin/appworld download data --root /some/folder
                                (or: pip install appworld==$VERSION && appworld install && appworld download data)
  then copy the resulting data/ folder here:   $ROOT/data
  (expected: $ROOT/data/datasets/{train,dev,test_normal,test_challenge}.txt and $ROOT/data/tasks/<task_id>/)
  ($HOME/appworld is the adapter's default root; for another folder export APPWORLD_ROOT=... before using it).
Never commit the decrypted apps or the data: AppWorld's licence allows redistribution only in encrypted form.
MSG
