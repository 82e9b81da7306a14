"""To-do app: colored lists of tasks with due dates and priorities, and per-list sort preferences."""

from __future__ import annotations

import random
from typing import Any, Literal

from .. import data
from ..data import ch, ri
from ..world import NOW, App, Ctx, page
from .common import add_account_apis, contains

COLORS = ("Red", "Orange", "Yellow", "Green", "Blue", "Purple", "Gray")
PRIORITIES = ("Low", "Medium", "High", "Urgent")
SORTS = ("manual", "due_date", "priority", "title", "created_at")
LIST_NAMES = ["Groceries", "Work", "Home", "Errands", "Garden", "Travel Prep", "Reading", "Fitness", "Gifts"]
Color = Literal["Red", "Orange", "Yellow", "Green", "Blue", "Purple", "Gray"]
Priority = Literal["Low", "Medium", "High", "Urgent"]
SortBy = Literal["manual", "due_date", "priority", "title", "created_at"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"todo/{seed}")
    lists = [
        {"id": i + 1, "name": n, "color": ch(rng, COLORS), "sort_by": "manual"}
        for i, n in enumerate(rng.sample(LIST_NAMES, 5))
    ]
    tasks = []
    for i in range(ri(rng, 20, 34)):
        done = rng.random() < 0.3
        tasks.append(
            {
                "id": i + 1,
                "list_id": ch(rng, lists)["id"],
                "title": data.title(rng).lower().capitalize(),
                "due_date": data.date(rng, -20, 30) if rng.random() < 0.8 else None,
                "priority": ch(rng, PRIORITIES),
                "completed": done,
                "created_at": data.date(rng, -90, -21) + "T08:00:00",
            }
        )
    return {"lists": lists, "tasks": tasks}


app = add_account_apis(
    App(
        "todo",
        "A to-do app: task lists (with a color and a saved sort preference) and tasks with due dates and priorities.",
        build,
    )
)


def _sorted(tasks: list[dict], sort_by: str) -> list[dict]:
    if sort_by == "due_date":
        return sorted(tasks, key=lambda t: (t["due_date"] is None, t["due_date"] or "", t["id"]))
    if sort_by == "priority":
        return sorted(tasks, key=lambda t: (-PRIORITIES.index(t["priority"]), t["id"]))
    if sort_by in ("title", "created_at"):
        return sorted(tasks, key=lambda t: (t[sort_by], t["id"]))
    return sorted(tasks, key=lambda t: t["id"])


@app.api()
def show_lists(ctx: Ctx) -> list[dict[str, Any]]:
    """Lists your task lists.

    Returns: a list of {"id", "name", "color", "sort_by"} (sort_by is the list's saved sort preference).
    """
    return ctx.db["lists"]


@app.api()
def show_list(
    ctx: Ctx,
    list_id: int,
    sort_by: SortBy | None = None,
    include_completed: bool = True,
    page_index: int = 0,
    page_limit: int = 5,
) -> dict[str, Any]:
    """Shows a list and one page of its tasks. `sort_by` only changes this view; it is not saved (use
    save_sort_preference to change the list's saved sort order).

    Args:
      list_id: the list's id.
      sort_by: order of the tasks in this response (default: the list's saved preference).
      include_completed: include completed tasks.
      page_index: the page of tasks, from 0.
      page_limit: tasks per page (at most 20).
    Returns: {"id", "name", "color", "sort_by", "tasks": [task]}.
    """
    lst = ctx.get("lists", list_id, "list")
    tasks = [t for t in ctx.db["tasks"] if t["list_id"] == list_id and (include_completed or not t["completed"])]
    return dict(lst, tasks=page(_sorted(tasks, sort_by or lst["sort_by"]), page_index, page_limit))


@app.api()
def create_list(ctx: Ctx, name: str, color: Color = "Gray") -> dict[str, Any]:
    """Creates a task list.

    Args:
      name: the list name.
      color: the list color.
    Returns: the new list.
    """
    lst = {"id": ctx.new_id("lists"), "name": name, "color": color, "sort_by": "manual"}
    ctx.db["lists"].append(lst)
    return lst


@app.api()
def update_list(ctx: Ctx, list_id: int, name: str | None = None, color: str | None = None) -> dict[str, Any]:
    """Renames a list or changes its color.

    Args:
      list_id: the list's id.
      name: the new name.
      color: the new color, a Color enum value: one of Red, Orange, Yellow, Green, Blue, Purple, Gray.
    Returns: the list.
    """
    lst = ctx.get("lists", list_id, "list")
    if name is not None:
        lst["name"] = name
    if color is not None:
        lst["color"] = color
    return lst


@app.api()
def save_sort_preference(ctx: Ctx, list_id: int, sort_by: SortBy) -> dict[str, Any]:
    """Saves how a list's tasks are sorted by default.

    Args:
      list_id: the list's id.
      sort_by: the sort order to save.
    Returns: the list.
    """
    lst = ctx.get("lists", list_id, "list")
    lst["sort_by"] = sort_by
    return lst


@app.api()
def delete_list(ctx: Ctx, list_id: int) -> dict[str, str]:
    """Deletes a list and all its tasks.

    Args:
      list_id: the list's id.
    Returns: {"message"}.
    """
    ctx.db["lists"].remove(ctx.get("lists", list_id, "list"))
    ctx.db["tasks"][:] = [t for t in ctx.db["tasks"] if t["list_id"] != list_id]
    return {"message": "List deleted."}


@app.api()
def search_tasks(
    ctx: Ctx,
    query: str = "",
    list_id: int | None = None,
    completed: bool | None = None,
    priority: Priority | None = None,
    due_before: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches tasks across lists, by id.

    Args:
      query: case-insensitive text in the title ("" = all).
      list_id: only this list.
      completed: only completed (True) or open (False) tasks.
      priority: only this priority.
      due_before: only tasks due strictly before this date (YYYY-MM-DD).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of tasks.
    """
    hits = [
        t
        for t in ctx.db["tasks"]
        if contains(t["title"], query)
        and (list_id is None or t["list_id"] == list_id)
        and (completed is None or t["completed"] == completed)
        and (priority is None or t["priority"] == priority)
        and (due_before is None or (t["due_date"] is not None and t["due_date"] < due_before))
    ]
    return page(hits, page_index, page_limit)


@app.api()
def create_task(
    ctx: Ctx, list_id: int, title: str, due_date: str | None = None, priority: Priority = "Medium"
) -> dict[str, Any]:
    """Adds a task to a list.

    Args:
      list_id: the list's id.
      title: the task title.
      due_date: YYYY-MM-DD.
      priority: the Priority enum value.
    Returns: the new task.
    """
    ctx.get("lists", list_id, "list")
    t = {
        "id": ctx.new_id("tasks"),
        "list_id": list_id,
        "title": title,
        "due_date": due_date,
        "priority": priority,
        "completed": False,
        "created_at": NOW,
    }
    ctx.db["tasks"].append(t)
    return t


@app.api()
def update_task(
    ctx: Ctx,
    task_id: int,
    title: str | None = None,
    due_date: str | None = None,
    priority: Priority | None = None,
    list_id: int | None = None,
) -> dict[str, Any]:
    """Edits a task (fields left out stay as they are).

    Args:
      task_id: the task's id.
      title: the new title.
      due_date: the new due date, YYYY-MM-DD.
      priority: the new priority.
      list_id: move the task to this list.
    Returns: the task.
    """
    t = ctx.get("tasks", task_id, "task")
    if list_id is not None:
        ctx.get("lists", list_id, "list")
        t["list_id"] = list_id
    for k, v in (("title", title), ("due_date", due_date), ("priority", priority)):
        if v is not None:
            t[k] = v
    return t


@app.api()
def mark_task_completed(ctx: Ctx, task_id: int, completed: bool = True) -> dict[str, Any]:
    """Marks a task as completed (or, with completed=False, as open again).

    Args:
      task_id: the task's id.
      completed: the new state.
    Returns: the task.
    """
    t = ctx.get("tasks", task_id, "task")
    t["completed"] = completed
    return t


@app.api()
def delete_task(ctx: Ctx, task_id: int) -> dict[str, str]:
    """Deletes a task.

    Args:
      task_id: the task's id.
    Returns: {"message"}.
    """
    ctx.db["tasks"].remove(ctx.get("tasks", task_id, "task"))
    return {"message": "Task deleted."}
