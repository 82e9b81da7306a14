"""Builds the colab/ notebooks (.ipynb) from their jupytext percent-format sources (.py), and checks them.

Each notebook `colab/NN_name.ipynb` is paired with `colab/NN_name.py` (jupytext's percent format: `# %%` starts a
code cell, `# %% [markdown]` a markdown cell whose lines are comments; the pairing is declared in
colab/jupytext.toml). The .py file is the reviewed source: edit it (or the notebook in Jupyter with jupytext,
which keeps the .py in sync), then

    python colab/build_notebooks.py            # (re)write colab/*.ipynb from colab/*.py
    python colab/build_notebooks.py --check    # exit 1 if a notebook differs from what its .py builds

Every notebook is nbformat 4.5 JSON laid out as nbformat writes it (sorted keys, one-space indent), with empty
outputs, stable cell ids (`nb01-00`, ...) and fixed metadata (Colab's `colab` block, the Python 3 kernel), so the
.ipynb files only change when their source does, and `jupytext --sync` writes the same bytes for them. Code cells
are plain Python (no `!`/`%` magics), so tests/test_notebooks.py can run them top to bottom in a subprocess. The
set-up cells (from the "## 0. Set-up" heading to the next markdown cell) are repeated in every notebook, so that
each one runs on its own; `--check` also fails when they differ between notebooks.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_HEADING = "## 0. Set-up"


def sources(folder: str = HERE) -> list[str]:
    """The notebook sources of `folder` (`NN_name.py`), in order."""
    return sorted(glob.glob(os.path.join(folder, "[0-9][0-9]_*.py")))


def _lines(text: str) -> list[str]:
    """nbformat's multi-line string: a list of lines, each but the last ending in a newline."""
    lines = text.strip("\n").split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def notebook(source: str) -> dict[str, Any]:
    """The nbformat 4.5 document built from one percent-format source (empty outputs, stable cell ids)."""
    import jupytext  # in the `test` extra; imported here so that `--help` works without it

    name = os.path.splitext(os.path.basename(source))[0] + ".ipynb"
    stem = name.split("_")[0]
    cells = []
    for i, cell in enumerate(jupytext.read(source, fmt="py:percent").cells):
        if cell.cell_type not in ("markdown", "code"):
            raise ValueError(f"{source}: cell {i} is a {cell.cell_type} cell (only markdown and code cells)")
        out = {
            "cell_type": cell.cell_type,
            "id": f"nb{stem}-{i:02d}",
            "metadata": dict(cell.metadata),
            "source": _lines(cell.source),
        }
        if cell.cell_type == "code":
            out.update(execution_count=None, outputs=[])
        cells.append(out)
    return {
        "cells": cells,
        "metadata": {
            "colab": {"name": name, "provenance": []},
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(source: str) -> str:
    """The exact file text of the notebook built from `source` (nbformat's own layout: sorted keys, indent 1)."""
    return json.dumps(notebook(source), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def setup_section(nb: dict[str, Any]) -> list[str]:
    """The sources of the set-up cells: the "## 0. Set-up" markdown cell and the code cells after it."""
    cells = nb["cells"]
    start = next(
        (
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "markdown" and "".join(c["source"]).startswith(SETUP_HEADING)
        ),
        None,
    )
    if start is None:
        return []
    section = [cells[start]]
    for cell in cells[start + 1 :]:
        if cell["cell_type"] != "code":
            break
        section.append(cell)
    return ["".join(c["source"]) for c in section]


def setup_mismatches(notebooks: dict[str, dict[str, Any]]) -> list[str]:
    """Notebooks whose set-up cells disagree with another's (the shorter section must be a prefix of the longer)."""
    sections = {name: setup_section(nb) for name, nb in notebooks.items()}
    bad = [name for name, section in sections.items() if not section]
    names = [name for name in sections if sections[name]]
    for a, b in itertools.combinations(names, 2):
        n = min(len(sections[a]), len(sections[b]))
        if sections[a][:n] != sections[b][:n]:
            bad.append(f"{a} vs {b}")
    return bad


def main(argv: list[str]) -> int:
    """Writes (or with `--check`, compares) every notebook; returns the exit status."""
    if "--help" in argv[1:] or "-h" in argv[1:]:
        print(__doc__)
        return 0
    try:
        import jupytext  # noqa: F401
    except ImportError:
        print("building the notebooks needs jupytext (in the `test` extra): pip install jupytext", file=sys.stderr)
        return 2
    check = "--check" in argv[1:]
    stale, built = [], {}
    for source in sources():
        path = os.path.splitext(source)[0] + ".ipynb"
        name = os.path.basename(path)
        text = render(source)
        built[name] = json.loads(text)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current == text:
            continue
        if check:
            stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {path}")
    orphans = [
        os.path.basename(p)
        for p in sorted(glob.glob(os.path.join(HERE, "*.ipynb")))
        if os.path.basename(p) not in built
    ]
    status = 0
    if stale:
        print(f"out of date (run python colab/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        status = 1
    if orphans:
        print(f"notebooks without a .py source: {', '.join(orphans)}", file=sys.stderr)
        status = 1
    mismatched = setup_mismatches(built)
    if mismatched:
        print(f"set-up cells missing or different between notebooks: {', '.join(mismatched)}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
