"""The simulated apps. Training tasks use TRAIN_APPS; evaluation tasks use only the held-out EVAL_APPS."""

from __future__ import annotations

from ..world import App
from . import (
    api_docs,
    calendar,
    clock,
    contacts,
    finance,
    messages,
    music,
    news,
    notes,
    recipes,
    shop,
    supervisor,
    todo,
    trails,
)

TRAIN_APPS = ("notes", "todo", "music", "shop", "contacts", "messages", "calendar", "news")
EVAL_APPS = ("clock", "finance", "trails", "recipes")
APPS: dict[str, App] = {
    m.app.name: m.app
    for m in (
        supervisor,
        api_docs,
        notes,
        todo,
        music,
        shop,
        contacts,
        messages,
        calendar,
        news,
        clock,
        finance,
        trails,
        recipes,
    )
}
