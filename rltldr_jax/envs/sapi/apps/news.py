"""News reader: articles by source and section, read state, bookmarks, followed sources and feed preferences."""

from __future__ import annotations

import random
from typing import Any, Literal

from .. import data
from ..data import ch, ri
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis, contains

SECTIONS = ("World", "Business", "Sports", "Science", "Technology", "Culture")
SOURCES = ["Daily Ledger", "Metro Times", "The Observer", "Tech Pulse", "Global Wire", "Sport Hub"]
Section = Literal["World", "Business", "Sports", "Science", "Technology", "Culture"]
TITLE_ENDINGS = [
    "what comes next",
    "a turning point",
    "the numbers",
    "five takeaways",
    "an inside look",
    "why it matters",
    "the debate",
]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"news/{seed}")
    arts, titles = [], set()
    for i in range(ri(rng, 24, 40)):
        topic = ch(rng, data.TOPICS)
        t = f"{topic.capitalize()}: {ch(rng, TITLE_ENDINGS)}"
        while t in titles:
            t += " (update)"
        titles.add(t)
        arts.append(
            {
                "id": i + 1,
                "title": t,
                "topic": topic,
                "source": ch(rng, SOURCES),
                "section": ch(rng, SECTIONS),
                "published_at": data.date(rng, -10, 0) + f"T{ri(rng, 6, 22):02d}:00:00",
                "read": rng.random() < 0.3,
                "bookmarked": rng.random() < 0.1,
                "body": f"About {topic}.",
            }
        )
    prefs = [
        {
            "id": 1,
            "default_section": ch(rng, SECTIONS),
            "followed_sources": sorted(rng.sample(SOURCES, 2)),
            "sort_by": "newest",
        }
    ]
    return {"articles": arts, "preferences": prefs}


app = add_account_apis(
    App(
        "news",
        "A news reader: browse and search articles, mark them read, bookmark them, "
        "follow sources and set feed preferences.",
        build,
    )
)


def _summary(a: dict) -> dict[str, Any]:
    return {k: a[k] for k in ("id", "title", "source", "section", "published_at", "read", "bookmarked")}


def _newest(arts: list[dict]) -> list[dict]:
    return sorted(arts, key=lambda a: (a["published_at"], a["id"]), reverse=True)


@app.api()
def show_feed(
    ctx: Ctx, section: Section | None = None, unread_only: bool = False, page_index: int = 0, page_limit: int = 5
) -> list[dict[str, Any]]:
    """Shows your news feed, newest first. `section` only changes this view (default: your saved default
    section); use update_preferences to change the saved default.

    Args:
      section: the section to show.
      unread_only: only articles you have not read.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "title", "source", "section", "published_at", "read", "bookmarked"}.
    """
    sec = section or ctx.db["preferences"][0]["default_section"]
    hits = [a for a in _newest(ctx.db["articles"]) if a["section"] == sec and (not unread_only or not a["read"])]
    return [_summary(a) for a in page(hits, page_index, page_limit)]


@app.api()
def search_articles(
    ctx: Ctx,
    query: str = "",
    source: str | None = None,
    section: Section | None = None,
    published_on: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches articles, newest first.

    Args:
      query: case-insensitive text in the title ("" = all).
      source: only this exact source name.
      section: only this section.
      published_on: only articles published on this date (YYYY-MM-DD).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of article summaries.
    """
    hits = [
        a
        for a in _newest(ctx.db["articles"])
        if contains(a["title"], query)
        and (source is None or a["source"] == source)
        and (section is None or a["section"] == section)
        and (published_on is None or a["published_at"][:10] == published_on)
    ]
    return [_summary(a) for a in page(hits, page_index, page_limit)]


@app.api()
def show_article(ctx: Ctx, article_id: int) -> dict[str, Any]:
    """Shows an article's full text. Viewing does not change its read state.

    Args:
      article_id: the article's id.
    Returns: the article with "body".
    """
    return ctx.get("articles", article_id, "article")


@app.api()
def mark_article_read(ctx: Ctx, article_id: int) -> dict[str, Any]:
    """Marks an article as read.

    Args:
      article_id: the article's id.
    Returns: the article summary.
    """
    a = ctx.get("articles", article_id, "article")
    a["read"] = True
    return _summary(a)


@app.api()
def mark_article_unread(ctx: Ctx, article_id: int) -> dict[str, Any]:
    """Marks an article as unread.

    Args:
      article_id: the article's id.
    Returns: the article summary.
    """
    a = ctx.get("articles", article_id, "article")
    a["read"] = False
    return _summary(a)


@app.api()
def bookmark_article(ctx: Ctx, article_id: int) -> dict[str, Any]:
    """Bookmarks an article.

    Args:
      article_id: the article's id.
    Returns: the article summary.
    """
    a = ctx.get("articles", article_id, "article")
    if a["bookmarked"]:
        raise ApiError(409, "Already bookmarked.")
    a["bookmarked"] = True
    return _summary(a)


@app.api()
def remove_bookmark(ctx: Ctx, article_id: int) -> dict[str, Any]:
    """Removes an article's bookmark.

    Args:
      article_id: the article's id.
    Returns: the article summary.
    """
    a = ctx.get("articles", article_id, "article")
    if not a["bookmarked"]:
        raise ApiError(404, "Not bookmarked.")
    a["bookmarked"] = False
    return _summary(a)


@app.api()
def show_bookmarks(ctx: Ctx, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Shows your bookmarked articles, newest first.

    Args:
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of article summaries.
    """
    return [
        _summary(a) for a in page([a for a in _newest(ctx.db["articles"]) if a["bookmarked"]], page_index, page_limit)
    ]


@app.api()
def show_preferences(ctx: Ctx) -> dict[str, Any]:
    """Shows your feed preferences.

    Returns: {"default_section", "followed_sources", "sort_by"}.
    """
    p = ctx.db["preferences"][0]
    return {k: p[k] for k in ("default_section", "followed_sources", "sort_by")}


@app.api()
def update_preferences(
    ctx: Ctx, default_section: Section | None = None, sort_by: Literal["newest", "oldest", "popular"] | None = None
) -> dict[str, Any]:
    """Saves feed preferences (fields left out stay as they are).

    Args:
      default_section: the section your feed shows by default.
      sort_by: the feed order.
    Returns: the preferences.
    """
    p = ctx.db["preferences"][0]
    if default_section is not None:
        p["default_section"] = default_section
    if sort_by is not None:
        p["sort_by"] = sort_by
    return {k: p[k] for k in ("default_section", "followed_sources", "sort_by")}


@app.api()
def follow_source(ctx: Ctx, source: str) -> dict[str, Any]:
    """Follows a news source.

    Args:
      source: the exact source name.
    Returns: the preferences.
    """
    if source not in {a["source"] for a in ctx.db["articles"]}:
        raise ApiError(404, f"No source named {source!r}.")
    p = ctx.db["preferences"][0]
    p["followed_sources"] = sorted(set(p["followed_sources"]) | {source})
    return show_preferences(ctx)


@app.api()
def unfollow_source(ctx: Ctx, source: str) -> dict[str, Any]:
    """Stops following a news source.

    Args:
      source: the exact source name.
    Returns: the preferences.
    """
    p = ctx.db["preferences"][0]
    if source not in p["followed_sources"]:
        raise ApiError(404, f"You do not follow {source!r}.")
    p["followed_sources"] = [s for s in p["followed_sources"] if s != source]
    return show_preferences(ctx)
