"""Builds the colab/ notebooks (.ipynb) from their jupytext percent-format sources (.py), and checks them.

Each notebook `colab/NN_name.ipynb` is paired with `colab/NN_name.py` (jupytext's percent format: `# %%` starts a
code cell, `# %% [markdown]` a markdown cell whose lines are comments; the pairing is declared in
colab/jupytext.toml). The .py file is the reviewed source: edit it (or the notebook in Jupyter with jupytext,
which keeps the .py in sync), then

    python colab/build_notebooks.py            # (re)write colab/*.ipynb from colab/*.py
    python colab/build_notebooks.py --check    # exit 1 if a notebook differs from what its .py builds
    python colab/build_notebooks.py --execute  # run each notebook on this machine and keep its outputs

Every notebook is nbformat 4.5 JSON laid out as nbformat writes it (sorted keys, one-space indent), with stable cell
ids (`nb01-00`, ...) and fixed metadata (Colab's `colab` block, the Python 3 kernel), so the .ipynb files only
change when their source does.

**Rendered outputs.** `--execute` (needs `nbclient`, `ipykernel` and `ipywidgets`, so that progress bars are widgets
as in Colab: `pip install nbclient ipykernel ipywidgets`) runs a
notebook top to bottom in a fresh kernel from colab/ (the set-up cell finds the checkout; nothing is cloned) and keeps
what a reader should see before running it: printed text (log lines as the terminal would show them: progress-bar
redraws collapsed, progress widgets dropped), tables and figures; an error stops it and nothing is written. The
notebook records what rendered it (`RENDERED` in its metadata: the sha256 of its .py source, the commit, the date,
the machine, the seconds). A build keeps those outputs while the source is unchanged and drops them when it
changed (never outputs of another source), so `--check` fails on outputs left from an older source. Code cells
are plain Python (no `!`/`%` magics), so tests/test_notebooks.py can run them top to bottom in a subprocess. The
set-up cells (from the "## 0. Set-up" heading to the next markdown cell) are repeated in every notebook, so that
each one runs on its own; `--check` also fails when they differ between notebooks.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_HEADING = "## 0. Set-up"
#: Notebook metadata key of rendered outputs: {"source_sha256", "commit", "date", "machine", "seconds"}.
RENDERED = "rltldr_rendered"
#: The output data kept when rendering (text, tables, figures); widgets (progress bars) and the rest are dropped.
KEPT_DATA = ("text/plain", "text/html", "text/markdown", "image/png")
#: The most bytes of kept outputs per notebook (the figures are most of it).
MAX_OUTPUT_BYTES = 2_000_000


def sources(folder: str = HERE) -> list[str]:
    """The notebook sources of `folder` (`NN_name.py`), in order."""
    return sorted(glob.glob(os.path.join(folder, "[0-9][0-9]_*.py")))


def _lines(text: str) -> list[str]:
    """nbformat's multi-line string: a list of lines, each but the last ending in a newline."""
    lines = text.strip("\n").split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def source_sha256(source: str) -> str:
    """The sha256 of a notebook source file's bytes (what its rendered outputs record)."""
    import hashlib

    with open(source, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _ipynb(source: str) -> str:
    return os.path.splitext(source)[0] + ".ipynb"


def rendered_outputs(source: str) -> dict[str, Any] | None:
    """The outputs the committed notebook of `source` holds, when they were rendered from this very source:
    {"metadata": its `RENDERED` record, "cells": [(outputs, execution_count) per cell]}; else None."""
    path = _ipynb(source)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    record = nb.get("metadata", {}).get(RENDERED)
    if not record or record.get("source_sha256") != source_sha256(source):
        return None
    return {
        "metadata": record,
        "cells": [(c.get("outputs", []), c.get("execution_count")) for c in nb["cells"]],
    }


def notebook(source: str, outputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The nbformat 4.5 document built from one percent-format source (stable cell ids), with `outputs`
    (`rendered_outputs`: rendered from this source) or none."""
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
            kept, count = outputs["cells"][i] if outputs is not None else ([], None)
            out.update(execution_count=count, outputs=kept)
        cells.append(out)
    metadata = {
        "colab": {"name": name, "provenance": []},
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    if outputs is not None:
        metadata[RENDERED] = outputs["metadata"]
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def _text(nb: dict[str, Any]) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def render(source: str) -> str:
    """The exact file text of the notebook built from `source` (nbformat's own layout: sorted keys, indent 1), with
    the outputs its committed notebook holds if they were rendered from this source."""
    return _text(notebook(source, rendered_outputs(source)))


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _terminal_text(text: str) -> str:
    """Stream text as a terminal would leave it: each line's last carriage-return segment (a progress bar's final
    redraw; a bar that cleared itself leaves nothing), colours removed, lines that move the cursor (the redraws of
    bars drawn on several lines) and blank lines dropped."""
    lines = (_COLOUR.sub("", line.rsplit("\r", 1)[-1]).rstrip() for line in text.split("\n"))
    kept = [line for line in lines if line.strip() and "\x1b" not in line]
    return "".join(line + "\n" for line in kept)


def kept_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outputs of one executed cell worth storing (module docstring), stream text merged per stream."""
    kept: list[dict[str, Any]] = []
    for out in outputs:
        kind = out["output_type"]
        if kind == "stream":
            text = _terminal_text("".join(out["text"]) if isinstance(out["text"], list) else out["text"])
            if not text:
                continue
            if kept and kept[-1]["output_type"] == "stream" and kept[-1]["name"] == out["name"]:
                kept[-1]["text"] += text
            else:
                kept.append({"name": out["name"], "output_type": "stream", "text": text})
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if any(mime.startswith("application/vnd.jupyter.widget") for mime in data):
                continue  # a progress widget: nothing a reader could see without the kernel
            data = {mime: value for mime, value in data.items() if mime in KEPT_DATA}
            if not data:
                continue
            entry = {"data": data, "metadata": out.get("metadata", {}), "output_type": kind}
            if kind == "execute_result":
                entry["execution_count"] = out.get("execution_count")
            kept.append(entry)
        else:
            raise ValueError(f"an output of type {kind!r}: the notebook failed; nothing is written")
    for entry in kept:
        if entry["output_type"] == "stream":
            entry["text"] = entry["text"].splitlines(keepends=True)
    return kept


def execute(source: str, *, timeout: int = 3600) -> dict[str, Any]:
    """Runs the notebook of `source` in a fresh kernel (cwd colab/) and returns it with its kept outputs and the
    `RENDERED` record; raises on the first failing cell."""
    import subprocess
    import time

    import nbformat
    from nbclient import NotebookClient

    nb = notebook(source)
    t0 = time.time()
    client = NotebookClient(
        nbformat.reads(json.dumps(nb), as_version=4),
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": HERE}},
    )
    ran = client.execute()
    seconds = time.time() - t0
    count = 0
    outputs = []
    for cell in ran.cells:
        if cell.cell_type != "code":
            outputs.append(([], None))
            continue
        count += 1
        kept = kept_outputs([dict(o) for o in cell.outputs])
        for entry in kept:
            if entry["output_type"] == "execute_result":
                entry["execution_count"] = count
        outputs.append((kept, count))
    commit = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "source_sha256": source_sha256(source),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": _machine(),
        "seconds": round(seconds),
    }
    done = notebook(source, {"metadata": record, "cells": outputs})
    size = len(json.dumps([c.get("outputs", []) for c in done["cells"]]))
    if size > MAX_OUTPUT_BYTES:
        raise ValueError(f"{source}: {size} bytes of outputs (> {MAX_OUTPUT_BYTES}): print or plot less")
    return done


def _machine() -> str:
    """The machine a rendering ran on, in words: its cores and JAX's backend."""
    import platform

    import jax

    return f"{os.cpu_count()} CPU cores ({platform.machine()}), JAX on {jax.default_backend()}"


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
    run = "--execute" in argv[1:]
    only = [a for a in argv[1:] if not a.startswith("-")]  # notebook names (01_replicate_small) to execute
    stale, built = [], {}
    for source in sources():
        path = _ipynb(source)
        name = os.path.basename(path)
        if run and (not only or os.path.splitext(name)[0] in only):
            print(f"executing {name} ...", flush=True)
            text = _text(execute(source))
        else:
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
        print(
            f"out of date (run python colab/build_notebooks.py; outputs rendered from an older source are dropped, "
            f"--execute renders new ones): {', '.join(stale)}",
            file=sys.stderr,
        )
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
