"""Notes app: notebooks and notes with tags and pins."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import NOW, ApiError, App, Ctx, page
from .common import add_account_apis, contains

NOTEBOOKS = ["Personal", "Work", "Recipes", "Travel", "Ideas", "Journal"]
TAGS = ["urgent", "later", "family", "finance", "health", "draft", "archive"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"notes/{seed}")
    nbs = [{"id": i + 1, "name": n} for i, n in enumerate(rng.sample(NOTEBOOKS, 4))]
    notes, titles = [], set()
    for i in range(ri(rng, 14, 26)):
        t = data.title(rng)
        while t in titles:
            t = data.title(rng, 3)
        titles.add(t)
        notes.append(
            {
                "id": i + 1,
                "notebook_id": ch(rng, nbs)["id"],
                "title": t,
                "content": f"{t}: " + " ".join(rng.sample(data.WORDS, 6)) + ".",
                "tags": sorted(rng.sample(TAGS, ri(rng, 0, 2))),
                "pinned": rng.random() < 0.15,
                "created_at": data.date(rng, -200, 0) + "T12:00:00",
                "updated_at": None,
            }
        )
    return {"notebooks": nbs, "notes": notes}


app = add_account_apis(App("notes", "A note-taking app: notebooks, notes, tags and pins.", build))
_SUMMARY = ("id", "notebook_id", "title", "tags", "pinned")


@app.api()
def show_notebooks(ctx: Ctx) -> list[dict[str, Any]]:
    """Lists your notebooks.

    Returns: a list of {"id", "name"}.
    """
    return ctx.db["notebooks"]


@app.api()
def create_notebook(ctx: Ctx, name: str) -> dict[str, Any]:
    """Creates a notebook.

    Args:
      name: the notebook name (must be unique).
    Returns: {"id", "name"}.
    """
    if any(n["name"] == name for n in ctx.db["notebooks"]):
        raise ApiError(409, f"A notebook named {name!r} already exists.")
    nb = {"id": ctx.new_id("notebooks"), "name": name}
    ctx.db["notebooks"].append(nb)
    return nb


@app.api()
def rename_notebook(ctx: Ctx, notebook_id: int, name: str) -> dict[str, Any]:
    """Renames a notebook.

    Args:
      notebook_id: the notebook's id.
      name: the new name.
    Returns: the notebook.
    """
    nb = ctx.get("notebooks", notebook_id, "notebook")
    nb["name"] = name
    return nb


@app.api()
def delete_notebook(ctx: Ctx, notebook_id: int) -> dict[str, str]:
    """Deletes an EMPTY notebook.

    Args:
      notebook_id: the notebook's id.
    Returns: {"message"}.
    """
    nb = ctx.get("notebooks", notebook_id, "notebook")
    if any(n["notebook_id"] == notebook_id for n in ctx.db["notes"]):
        raise ApiError(409, "The notebook is not empty.")
    ctx.db["notebooks"].remove(nb)
    return {"message": "Notebook deleted."}


@app.api()
def search_notes(
    ctx: Ctx,
    query: str = "",
    notebook_id: int | None = None,
    tag: str | None = None,
    pinned: bool | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches notes by text in title or content, newest first.

    Args:
      query: case-insensitive text to look for ("" = all notes).
      notebook_id: only notes in this notebook.
      tag: only notes with this exact tag.
      pinned: only pinned (True) or unpinned (False) notes.
      page_index: the page to show, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "notebook_id", "title", "tags", "pinned"}.
    """
    hits = [
        n
        for n in sorted(ctx.db["notes"], key=lambda n: n["created_at"], reverse=True)
        if contains(n["title"] + " " + n["content"], query)
        and (notebook_id is None or n["notebook_id"] == notebook_id)
        and (tag is None or tag in n["tags"])
        and (pinned is None or n["pinned"] == pinned)
    ]
    return [{k: n[k] for k in _SUMMARY} for n in page(hits, page_index, page_limit)]


@app.api()
def show_note(ctx: Ctx, note_id: int) -> dict[str, Any]:
    """Shows a note in full.

    Args:
      note_id: the note's id.
    Returns: the note with "content", "created_at" and "updated_at".
    """
    return ctx.get("notes", note_id, "note")


@app.api()
def create_note(
    ctx: Ctx, title: str, content: str = "", notebook_id: int | None = None, tags: list[str] | None = None
) -> dict[str, Any]:
    """Creates a note.

    Args:
      title: the title.
      content: the body text.
      notebook_id: the notebook to put it in (default: the first notebook).
      tags: tags to attach.
    Returns: the new note.
    """
    nb = notebook_id if notebook_id is not None else ctx.db["notebooks"][0]["id"]
    ctx.get("notebooks", nb, "notebook")
    note = {
        "id": ctx.new_id("notes"),
        "notebook_id": nb,
        "title": title,
        "content": content,
        "tags": sorted(set(tags or [])),
        "pinned": False,
        "created_at": NOW,
        "updated_at": None,
    }
    ctx.db["notes"].append(note)
    return note


@app.api()
def update_note(
    ctx: Ctx, note_id: int, title: str | None = None, content: str | None = None, notebook_id: int | None = None
) -> dict[str, Any]:
    """Edits a note's title, content or notebook (fields left out stay as they are).

    Args:
      note_id: the note's id.
      title: the new title.
      content: the new content (replaces the old content).
      notebook_id: move the note to this notebook.
    Returns: the note.
    """
    note = ctx.get("notes", note_id, "note")
    if notebook_id is not None:
        ctx.get("notebooks", notebook_id, "notebook")
        note["notebook_id"] = notebook_id
    if title is not None:
        note["title"] = title
    if content is not None:
        note["content"] = content
    note["updated_at"] = NOW
    return note


@app.api()
def add_note_tag(ctx: Ctx, note_id: int, tag: str) -> dict[str, Any]:
    """Adds a tag to a note.

    Args:
      note_id: the note's id.
      tag: the tag.
    Returns: the note.
    """
    note = ctx.get("notes", note_id, "note")
    note["tags"] = sorted(set(note["tags"]) | {tag})
    return note


@app.api()
def remove_note_tag(ctx: Ctx, note_id: int, tag: str) -> dict[str, Any]:
    """Removes a tag from a note.

    Args:
      note_id: the note's id.
      tag: the tag.
    Returns: the note.
    """
    note = ctx.get("notes", note_id, "note")
    if tag not in note["tags"]:
        raise ApiError(404, f"The note has no tag {tag!r}.")
    note["tags"] = [t for t in note["tags"] if t != tag]
    return note


@app.api()
def set_note_pinned(ctx: Ctx, note_id: int, pinned: bool) -> dict[str, Any]:
    """Pins or unpins a note.

    Args:
      note_id: the note's id.
      pinned: True to pin, False to unpin.
    Returns: the note.
    """
    note = ctx.get("notes", note_id, "note")
    note["pinned"] = pinned
    return note


@app.api()
def delete_note(ctx: Ctx, note_id: int) -> dict[str, str]:
    """Deletes a note.

    Args:
      note_id: the note's id.
    Returns: {"message"}.
    """
    ctx.db["notes"].remove(ctx.get("notes", note_id, "note"))
    return {"message": "Note deleted."}
