"""Trails app (held out for evaluation): outdoor trails with activity, route type and difficulty; bookmarks,
an activity log and reviews."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis

ACTIVITIES = ("Hiking", "Biking", "Running")
ROUTE_TYPES = ("Loop", "Out & Back", "Point to Point")
DIFFICULTIES = ("Easy", "Moderate", "Hard")
NAMES = ["Eagle", "Cedar", "Falls", "Ridge", "Canyon", "Meadow", "Lake", "Pine", "Granite", "Aspen", "Fox", "Sunset"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"trails/{seed}")
    trails, names = [], set()
    for i in range(ri(rng, 36, 56)):
        n = f"{ch(rng, NAMES)} {ch(rng, NAMES)} {ch(rng, ['Trail', 'Path', 'Loop', 'Track'])}"
        while n in names:
            n = n + " East"
        names.add(n)
        trails.append(
            {
                "id": i + 1,
                "name": n,
                "location": ch(rng, data.CITIES[:5]),
                "activity": ch(rng, ACTIVITIES),
                "route_type": ch(rng, ROUTE_TYPES),
                "difficulty": ch(rng, DIFFICULTIES),
                "length_km": round(rng.uniform(1.5, 25), 1),
                "elevation_m": ri(rng, 20, 1400),
                "rating": round(rng.uniform(3, 5), 1),
            }
        )
    bookmarks = [{"id": 1, "trail_id": ch(rng, trails)["id"]}]
    log = [{"id": 1, "trail_id": ch(rng, trails)["id"], "date": data.date(rng, -30, -1), "duration_minutes": 95}]
    return {"trails": trails, "bookmarks": bookmarks, "activity_log": log, "reviews": []}


app = add_account_apis(
    App(
        "trails",
        "Find outdoor trails for hiking, biking and running; bookmark them, log your outings and write reviews.",
        build,
    )
)


@app.api()
def search_trails(
    ctx: Ctx,
    location: str | None = None,
    activity: str | None = None,
    route_type: str | None = None,
    difficulty: str | None = None,
    max_length_km: float | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches trails, by id. All filters are exact and case-sensitive.

    Args:
      location: the town (e.g. "Boulder").
      activity: one of Hiking, Biking, Running.
      route_type: one of Loop, Out & Back, Point to Point.
      difficulty: one of Easy, Moderate, Hard.
      max_length_km: only trails at most this long.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of trails {"id", "name", "location", "activity", "route_type", "difficulty", "length_km",
      "elevation_m", "rating"}.
    """
    hits = [
        t
        for t in ctx.db["trails"]
        if (location is None or t["location"] == location)
        and (activity is None or t["activity"] == activity)
        and (route_type is None or t["route_type"] == route_type)
        and (difficulty is None or t["difficulty"] == difficulty)
        and (max_length_km is None or t["length_km"] <= max_length_km)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_trail(ctx: Ctx, trail_id: int) -> dict[str, Any]:
    """Shows a trail.

    Args:
      trail_id: the trail's id.
    Returns: the trail.
    """
    return ctx.get("trails", trail_id, "trail")


@app.api()
def bookmark_trail(ctx: Ctx, trail_id: int) -> dict[str, str]:
    """Bookmarks a trail.

    Args:
      trail_id: the trail's id.
    Returns: {"message"}.
    """
    ctx.get("trails", trail_id, "trail")
    if any(b["trail_id"] == trail_id for b in ctx.db["bookmarks"]):
        raise ApiError(409, "Already bookmarked.")
    ctx.db["bookmarks"].append({"id": ctx.new_id("bookmarks"), "trail_id": trail_id})
    return {"message": "Bookmarked."}


@app.api()
def remove_bookmark(ctx: Ctx, trail_id: int) -> dict[str, str]:
    """Removes a trail bookmark.

    Args:
      trail_id: the trail's id.
    Returns: {"message"}.
    """
    hit = [b for b in ctx.db["bookmarks"] if b["trail_id"] == trail_id]
    if not hit:
        raise ApiError(404, "Not bookmarked.")
    ctx.db["bookmarks"].remove(hit[0])
    return {"message": "Bookmark removed."}


@app.api()
def show_bookmarks(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows your bookmarked trails.

    Returns: a list of trails.
    """
    return [ctx.get("trails", b["trail_id"], "trail") for b in ctx.db["bookmarks"]]


@app.api()
def log_activity(ctx: Ctx, trail_id: int, date: str, duration_minutes: int) -> dict[str, Any]:
    """Logs an outing on a trail.

    Args:
      trail_id: the trail's id.
      date: YYYY-MM-DD.
      duration_minutes: how long it took.
    Returns: the log entry.
    """
    ctx.get("trails", trail_id, "trail")
    if duration_minutes <= 0:
        raise ApiError(422, "duration_minutes must be positive.")
    e = {"id": ctx.new_id("activity_log"), "trail_id": trail_id, "date": date, "duration_minutes": duration_minutes}
    ctx.db["activity_log"].append(e)
    return e


@app.api()
def show_activity_log(ctx: Ctx, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Shows your logged outings, newest first.

    Args:
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "trail_id", "date", "duration_minutes"}.
    """
    return page(
        sorted(ctx.db["activity_log"], key=lambda e: (e["date"], e["id"]), reverse=True), page_index, page_limit
    )


@app.api()
def write_review(ctx: Ctx, trail_id: int, rating: int, text: str = "") -> dict[str, Any]:
    """Reviews a trail.

    Args:
      trail_id: the trail's id.
      rating: 1..5 stars.
      text: the review.
    Returns: the review.
    """
    ctx.get("trails", trail_id, "trail")
    if not 1 <= rating <= 5:
        raise ApiError(422, "rating must be 1..5.")
    r = {"id": ctx.new_id("reviews"), "trail_id": trail_id, "rating": rating, "text": text}
    ctx.db["reviews"].append(r)
    return r


@app.api()
def show_reviews(ctx: Ctx, trail_id: int) -> list[dict[str, Any]]:
    """Shows your reviews of a trail.

    Args:
      trail_id: the trail's id.
    Returns: a list of reviews.
    """
    return [r for r in ctx.db["reviews"] if r["trail_id"] == trail_id]
