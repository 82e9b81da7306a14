"""Messages app: text messages to and from phone numbers."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import NOW, ApiError, App, Ctx, page
from .common import add_account_apis, contains

LINES = [
    "Are we still on for tomorrow?",
    "Running 10 minutes late.",
    "Thanks for dinner!",
    "Call me when free.",
    "Did you see the game?",
    "Happy birthday!",
    "Can you send the file?",
    "Lunch on Friday?",
    "Got the tickets.",
    "See you at the station.",
]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"messages/{seed}")
    ppl = data.people(seed)
    msgs = []
    for i in range(ri(rng, 18, 30)):
        p = ch(rng, ppl[:20])
        incoming = rng.random() < 0.6
        msgs.append(
            {
                "id": i + 1,
                "phone_number": p["phone_number"],
                "direction": "in" if incoming else "out",
                "text": ch(rng, LINES),
                "sent_at": data.date(rng, -40, 0) + f"T{ri(rng, 7, 22):02d}:15:00",
                "read": (not incoming) or rng.random() < 0.5,
            }
        )
    msgs.sort(key=lambda m: m["sent_at"])
    for i, m in enumerate(msgs):
        m["id"] = i + 1
    return {"messages": msgs}


app = add_account_apis(
    App(
        "messages",
        "Text messages (SMS): read, send, mark read and delete messages. Messages are addressed by phone number.",
        build,
    )
)


@app.api()
def search_messages(
    ctx: Ctx,
    query: str = "",
    phone_number: str | None = None,
    unread_only: bool = False,
    direction: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches messages, newest first.

    Args:
      query: case-insensitive text in the message ("" = all).
      phone_number: only messages with this phone number (10 digits).
      unread_only: only unread messages.
      direction: only "in" (received) or "out" (sent) messages.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "phone_number", "direction", "text", "sent_at", "read"}.
    """
    hits = [
        m
        for m in sorted(ctx.db["messages"], key=lambda m: (m["sent_at"], m["id"]), reverse=True)
        if contains(m["text"], query)
        and (phone_number is None or m["phone_number"] == phone_number)
        and (not unread_only or not m["read"])
        and (direction is None or m["direction"] == direction)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def send_message(ctx: Ctx, phone_number: str, text: str) -> dict[str, Any]:
    """Sends a text message.

    Args:
      phone_number: the recipient's phone number (10 digits).
      text: the message.
    Returns: the sent message.
    """
    if not (phone_number.isdigit() and len(phone_number) == 10):
        raise ApiError(422, "phone_number must be 10 digits.")
    m = {
        "id": ctx.new_id("messages"),
        "phone_number": phone_number,
        "direction": "out",
        "text": text,
        "sent_at": NOW,
        "read": True,
    }
    ctx.db["messages"].append(m)
    return m


@app.api()
def mark_message_read(ctx: Ctx, message_id: int, read: bool = True) -> dict[str, Any]:
    """Marks a message as read (or unread with read=False).

    Args:
      message_id: the message's id.
      read: the new state.
    Returns: the message.
    """
    m = ctx.get("messages", message_id, "message")
    m["read"] = read
    return m


@app.api()
def delete_message(ctx: Ctx, message_id: int) -> dict[str, str]:
    """Deletes a message.

    Args:
      message_id: the message's id.
    Returns: {"message"}.
    """
    ctx.db["messages"].remove(ctx.get("messages", message_id, "message"))
    return {"message": "Message deleted."}
