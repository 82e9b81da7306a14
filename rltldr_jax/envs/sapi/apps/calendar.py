"""Calendar app: events with dates, times, locations and attendees (by email)."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis, contains

EVENT_NAMES = [
    "Dentist",
    "Team sync",
    "Yoga",
    "Book club",
    "Project review",
    "Lunch",
    "Piano lesson",
    "Budget meeting",
    "Haircut",
    "Board games",
    "Soccer practice",
    "Vet visit",
    "Design critique",
]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"calendar/{seed}")
    ppl = data.people(seed)
    events = []
    for i in range(ri(rng, 16, 28)):
        events.append(
            {
                "id": i + 1,
                "title": ch(rng, EVENT_NAMES),
                "date": data.date(rng, -20, 40),
                "start_time": f"{ri(rng, 8, 19):02d}:{ch(rng, ['00', '30'])}",
                "duration_minutes": ch(rng, [30, 45, 60, 90]),
                "location": ch(rng, ["Office", "Home", "Cafe", "Gym", "Online", ""]),
                "attendee_emails": [p["email"] for p in rng.sample(ppl[:20], ri(rng, 0, 3))],
            }
        )
    return {"events": events}


app = add_account_apis(
    App(
        "calendar",
        "Your calendar: events with date, start time, duration, location and attendees (identified by email).",
        build,
    )
)


def _time_ok(t: str) -> bool:
    return len(t) == 5 and t[2] == ":" and t[:2].isdigit() and t[3:].isdigit() and int(t[:2]) < 24 and int(t[3:]) < 60


@app.api()
def search_events(
    ctx: Ctx,
    query: str = "",
    start_date: str | None = None,
    end_date: str | None = None,
    attendee_email: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches events, in date and time order.

    Args:
      query: case-insensitive text in the title ("" = all).
      start_date: only events on or after this date (YYYY-MM-DD).
      end_date: only events on or before this date (YYYY-MM-DD).
      attendee_email: only events with this attendee.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of events {"id", "title", "date", "start_time", "duration_minutes", "location",
      "attendee_emails"}.
    """
    hits = [
        e
        for e in sorted(ctx.db["events"], key=lambda e: (e["date"], e["start_time"], e["id"]))
        if contains(e["title"], query)
        and (start_date is None or e["date"] >= start_date)
        and (end_date is None or e["date"] <= end_date)
        and (attendee_email is None or attendee_email in e["attendee_emails"])
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_event(ctx: Ctx, event_id: int) -> dict[str, Any]:
    """Shows an event.

    Args:
      event_id: the event's id.
    Returns: the event.
    """
    return ctx.get("events", event_id, "event")


@app.api()
def create_event(
    ctx: Ctx,
    title: str,
    date: str,
    start_time: str,
    duration_minutes: int = 60,
    location: str = "",
    attendee_emails: list[str] | None = None,
) -> dict[str, Any]:
    """Creates an event.

    Args:
      title: the title.
      date: YYYY-MM-DD.
      start_time: HH:MM, 24-hour clock.
      duration_minutes: length in minutes.
      location: where.
      attendee_emails: the attendees' email addresses.
    Returns: the new event.
    """
    if not _time_ok(start_time):
        raise ApiError(422, "start_time must be HH:MM (24-hour clock).")
    e = {
        "id": ctx.new_id("events"),
        "title": title,
        "date": date,
        "start_time": start_time,
        "duration_minutes": duration_minutes,
        "location": location,
        "attendee_emails": list(attendee_emails or []),
    }
    ctx.db["events"].append(e)
    return e


@app.api()
def update_event(
    ctx: Ctx,
    event_id: int,
    title: str | None = None,
    date: str | None = None,
    start_time: str | None = None,
    duration_minutes: int | None = None,
    location: str | None = None,
) -> dict[str, Any]:
    """Edits an event (fields left out stay as they are).

    Args:
      event_id: the event's id.
      title: the new title.
      date: the new date, YYYY-MM-DD.
      start_time: the new start time, HH:MM.
      duration_minutes: the new length.
      location: the new location.
    Returns: the event.
    """
    e = ctx.get("events", event_id, "event")
    if start_time is not None and not _time_ok(start_time):
        raise ApiError(422, "start_time must be HH:MM (24-hour clock).")
    for k, v in (
        ("title", title),
        ("date", date),
        ("start_time", start_time),
        ("duration_minutes", duration_minutes),
        ("location", location),
    ):
        if v is not None:
            e[k] = v
    return e


@app.api()
def add_attendee(ctx: Ctx, event_id: int, email: str) -> dict[str, Any]:
    """Invites someone to an event.

    Args:
      event_id: the event's id.
      email: the attendee's email.
    Returns: the event.
    """
    e = ctx.get("events", event_id, "event")
    if email in e["attendee_emails"]:
        raise ApiError(409, "Already an attendee.")
    e["attendee_emails"].append(email)
    return e


@app.api()
def remove_attendee(ctx: Ctx, event_id: int, email: str) -> dict[str, Any]:
    """Removes an attendee from an event.

    Args:
      event_id: the event's id.
      email: the attendee's email.
    Returns: the event.
    """
    e = ctx.get("events", event_id, "event")
    if email not in e["attendee_emails"]:
        raise ApiError(404, "Not an attendee.")
    e["attendee_emails"].remove(email)
    return e


@app.api()
def delete_event(ctx: Ctx, event_id: int) -> dict[str, str]:
    """Deletes an event.

    Args:
      event_id: the event's id.
    Returns: {"message"}.
    """
    ctx.db["events"].remove(ctx.get("events", event_id, "event"))
    return {"message": "Event deleted."}
