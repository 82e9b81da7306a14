"""Clock app (held out for evaluation): alarms with an AM/PM marker, and reminders with priorities."""

from __future__ import annotations

import random
from typing import Any, Literal

from .. import data
from ..data import ch, ri
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis, contains

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LABELS = ["Wake up", "Gym", "Meds", "Standup", "School run", "Laundry", "Call mom", "Bedtime", "Water plants"]
Meridiem = Literal["AM", "PM"]
Priority = Literal["Low", "Normal", "High"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"clock/{seed}")
    alarms = []
    for i, label in enumerate(rng.sample(LABELS, 6)):
        alarms.append(
            {
                "id": i + 1,
                "label": label,
                "hour": ri(rng, 1, 12),
                "minute": ch(rng, [0, 15, 30, 45]),
                "meridiem": ch(rng, ["AM", "PM"]),
                "days": sorted(rng.sample(DAYS, ri(rng, 1, 5)), key=DAYS.index),
                "enabled": rng.random() < 0.7,
            }
        )
    reminders = [
        {
            "id": i + 1,
            "title": data.title(rng),
            "date": data.date(rng, -5, 30),
            "priority": ch(rng, ["Low", "Normal", "High"]),
            "done": rng.random() < 0.2,
        }
        for i in range(10)
    ]
    return {"alarms": alarms, "reminders": reminders}


app = add_account_apis(
    App(
        "clock",
        "Alarms (12-hour clock with an AM/PM marker, repeating on weekdays) and dated reminders with priorities.",
        build,
    )
)


@app.api()
def show_alarms(ctx: Ctx, enabled: bool | None = None) -> list[dict[str, Any]]:
    """Lists your alarms.

    Args:
      enabled: only enabled (True) or disabled (False) alarms.
    Returns: a list of {"id", "label", "hour", "minute", "meridiem", "days", "enabled"}.
    """
    return [a for a in ctx.db["alarms"] if enabled is None or a["enabled"] == enabled]


def _check_time(hour: int | None, minute: int | None) -> None:
    if hour is not None and not 1 <= hour <= 12:
        raise ApiError(422, "hour must be 1..12 (12-hour clock; use meridiem for AM/PM).")
    if minute is not None and not 0 <= minute <= 59:
        raise ApiError(422, "minute must be 0..59.")


@app.api()
def create_alarm(
    ctx: Ctx, hour: int, minute: int, meridiem: Meridiem, label: str = "Alarm", days: list[str] | None = None
) -> dict[str, Any]:
    """Creates an enabled alarm.

    Args:
      hour: 1..12.
      minute: 0..59.
      meridiem: the AM/PM marker.
      label: a label.
      days: weekdays it repeats on ("Mon".."Sun"); empty = once.
    Returns: the alarm.
    """
    _check_time(hour, minute)
    if any(d not in DAYS for d in days or []):
        raise ApiError(422, f"days must be among {list(DAYS)}.")
    a = {
        "id": ctx.new_id("alarms"),
        "label": label,
        "hour": hour,
        "minute": minute,
        "meridiem": meridiem,
        "days": sorted(set(days or []), key=DAYS.index),
        "enabled": True,
    }
    ctx.db["alarms"].append(a)
    return a


@app.api()
def update_alarm(
    ctx: Ctx,
    alarm_id: int,
    hour: int | None = None,
    minute: int | None = None,
    meridiem: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """Edits an alarm (fields left out stay as they are).

    Args:
      alarm_id: the alarm's id.
      hour: 1..12.
      minute: 0..59.
      meridiem: the AM/PM marker, a Meridiem enum value: "AM" or "PM".
      label: a label.
    Returns: the alarm.
    """
    a = ctx.get("alarms", alarm_id, "alarm")
    _check_time(hour, minute)
    for k, v in (("hour", hour), ("minute", minute), ("meridiem", meridiem), ("label", label)):
        if v is not None:
            a[k] = v
    return a


@app.api()
def set_alarm_enabled(ctx: Ctx, alarm_id: int, enabled: bool) -> dict[str, Any]:
    """Turns an alarm on or off.

    Args:
      alarm_id: the alarm's id.
      enabled: True = on.
    Returns: the alarm.
    """
    a = ctx.get("alarms", alarm_id, "alarm")
    a["enabled"] = enabled
    return a


@app.api()
def delete_alarm(ctx: Ctx, alarm_id: int) -> dict[str, str]:
    """Deletes an alarm.

    Args:
      alarm_id: the alarm's id.
    Returns: {"message"}.
    """
    ctx.db["alarms"].remove(ctx.get("alarms", alarm_id, "alarm"))
    return {"message": "Alarm deleted."}


@app.api()
def show_reminders(
    ctx: Ctx,
    query: str = "",
    date: str | None = None,
    include_done: bool = True,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Lists reminders by date.

    Args:
      query: case-insensitive text in the title.
      date: only reminders on this date (YYYY-MM-DD).
      include_done: include reminders marked done.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "title", "date", "priority", "done"}.
    """
    hits = [
        r
        for r in sorted(ctx.db["reminders"], key=lambda r: (r["date"], r["id"]))
        if contains(r["title"], query) and (date is None or r["date"] == date) and (include_done or not r["done"])
    ]
    return page(hits, page_index, page_limit)


@app.api()
def create_reminder(ctx: Ctx, title: str, date: str, priority: Priority = "Normal") -> dict[str, Any]:
    """Creates a reminder.

    Args:
      title: the title.
      date: YYYY-MM-DD.
      priority: the Priority enum value.
    Returns: the reminder.
    """
    r = {"id": ctx.new_id("reminders"), "title": title, "date": date, "priority": priority, "done": False}
    ctx.db["reminders"].append(r)
    return r


@app.api()
def update_reminder(
    ctx: Ctx, reminder_id: int, title: str | None = None, date: str | None = None, priority: Priority | None = None
) -> dict[str, Any]:
    """Edits a reminder.

    Args:
      reminder_id: the reminder's id.
      title: the new title.
      date: the new date.
      priority: the new Priority enum value.
    Returns: the reminder.
    """
    r = ctx.get("reminders", reminder_id, "reminder")
    for k, v in (("title", title), ("date", date), ("priority", priority)):
        if v is not None:
            r[k] = v
    return r


@app.api()
def mark_reminder_done(ctx: Ctx, reminder_id: int, done: bool = True) -> dict[str, Any]:
    """Marks a reminder as done (or not done).

    Args:
      reminder_id: the reminder's id.
      done: the new state.
    Returns: the reminder.
    """
    r = ctx.get("reminders", reminder_id, "reminder")
    r["done"] = done
    return r


@app.api()
def delete_reminder(ctx: Ctx, reminder_id: int) -> dict[str, str]:
    """Deletes a reminder.

    Args:
      reminder_id: the reminder's id.
    Returns: {"message"}.
    """
    ctx.db["reminders"].remove(ctx.get("reminders", reminder_id, "reminder"))
    return {"message": "Reminder deleted."}
