"""Task templates: each samples parameters from a seeded world, writes the goal, the golden solution and the
requirement tests.

A template's `prepare(rng, db)` picks the task's parameters and may edit the freshly built database (to make
the task well-defined); it must be deterministic given `rng` and `db`. `check(v, p)` adds the template's tests
to the Checker `v` and returns the changes it allows (see `Checker.no_other_changes`). QA templates also
define `answer_ok`. Requirement texts never contain the expected values; the report shows the agent's values.

Where the Table 5 failure types arise (see also tests/test_sapi.py):
  capitalization: todo_list_color (update_list stores color as given), clock_alarm_time (meridiem),
    recipes_meal_plan (meal), shop_cheapest_in_category (case-sensitive category filter), plus strict enums
    (loud 422) in todo_add_task, clock_reminder, contacts_family_count_qa.
  unrecorded action: news_read_article (show_article does not mark read), music_play_song (show_song does not
    play), finance_search (search_tickers does not record history).
  extra parameter: every non-QA template (complete_task(answer=...)).
  unsaved setting: todo_sort_preference (show_list sort_by vs save_sort_preference), news_default_section
    (show_feed section vs update_preferences), finance_chart_default (show_chart horizon vs
    set_default_chart_horizon).
  over-filtering: shop_add_by_tag (query vs tag filter), trails_bookmark (activity/route_type filters),
    finance_watchlist_sector (sector filter), shop_cheapest_in_category.
  argument position: shop_save_for_later (no token = guest session), and everywhere `access_token=` (422).
"""

from __future__ import annotations

import abc
import random
from typing import Any

from . import data
from .apps import clock, todo
from .verifier import Checker
from .world import TODAY

DB = dict[str, dict[str, list[dict]]]

PRELUDE = (
    "profile = apis.supervisor.show_profile()\n"
    'passwords = {a["account_name"]: a["password"] for a in apis.supervisor.show_account_passwords()}\n'
)
ALL_PAGES = (
    "def all_pages(fn, *args, **kwargs):\n"
    "    items, i = [], 0\n"
    "    while True:\n"
    "        batch = fn(*args, page_index=i, page_limit=20, **kwargs)\n"
    "        items += batch\n"
    "        if len(batch) < 20:\n"
    "            return items\n"
    "        i += 1\n"
)


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.replace("$", "").replace(",", "").strip())
        except ValueError:
            return None
    return None


def _names(c: dict) -> str:
    return f"{c['first_name']} {c['last_name']}"


class Template(abc.ABC):
    """One task family. Subclasses set `name`, `apps`, `qa` and implement the four abstract methods."""

    name: str = ""
    apps: tuple[str, ...] = ()
    qa: bool = False

    @abc.abstractmethod
    def prepare(self, rng: random.Random, db: DB) -> dict[str, Any]:
        """Chooses the task parameters from the seeded world (may edit `db` to plant the task's records)."""

    @abc.abstractmethod
    def goal(self, p: dict[str, Any]) -> str:
        """The instruction the agent sees."""

    @abc.abstractmethod
    def body(self, p: dict[str, Any]) -> str:
        """The golden solution after the login prelude (must end with complete_task)."""

    @abc.abstractmethod
    def check(self, v: Checker, p: dict[str, Any]) -> dict[str, Any]:
        """Adds the requirement tests to `v`; returns the expected changes per table (for "no other changes")."""

    def answer_ok(self, answer: Any, p: dict[str, Any]) -> bool:
        return False

    def solution(self, p: dict[str, Any]) -> str:
        """The full golden solution: log in to the template's apps, then `body`."""
        logins = "".join(
            f'{a}_token = apis.{a}.login(profile["email"], passwords["{a}"])["access_token"]\n' for a in self.apps
        )
        return PRELUDE + logins + ALL_PAGES + self.body(p)


TEMPLATES: list[Template] = []


def register(cls: type[Template]) -> type[Template]:
    TEMPLATES.append(cls())
    return cls


def _added_with(v: Checker, key: str, **fields: Any) -> list[dict]:
    return [r for r in v.added(key) if all(r.get(k) == x for k, x in fields.items())]


# =========================================================== to-do ==========================================
@register
class TodoListColor(Template):
    name, apps = "todo_list_color", ("todo",)

    def prepare(self, rng, db):
        lst = rng.choice(db["todo"]["lists"])
        color = rng.choice([c for c in todo.COLORS if c != lst["color"]])
        return {"list_id": lst["id"], "list": lst["name"], "color": color}

    def goal(self, p):
        return f"Change the color of my '{p['list']}' to-do list to {p['color'].lower()}."

    def body(self, p):
        return (
            f'lst = [l for l in apis.todo.show_lists(todo_token) if l["name"] == {p["list"]!r}][0]\n'
            f'apis.todo.update_list(todo_token, list_id=lst["id"], color={p["color"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.record("todo.lists", p["list_id"])["color"]
        v.test(
            f"assert the color of the '{p['list']}' list was changed to the requested color, written as a valid "
            "Color enum value (one of Red, Orange, Yellow, Green, Blue, Purple, Gray; case-sensitive)",
            got == p["color"],
            f"color={got!r}",
        )
        return {"todo.lists": {"ids": {p["list_id"]: ("color",)}}}


SORT_LABELS = {"due_date": "due date", "priority": "priority", "title": "title", "created_at": "creation date"}


@register
class TodoSortPreference(Template):
    name, apps = "todo_sort_preference", ("todo",)

    def prepare(self, rng, db):
        lst = rng.choice(db["todo"]["lists"])
        return {"list_id": lst["id"], "list": lst["name"], "sort_by": rng.choice(sorted(SORT_LABELS))}

    def goal(self, p):
        return f"From now on, keep my '{p['list']}' to-do list sorted by {SORT_LABELS[p['sort_by']]}."

    def body(self, p):
        return (
            f'lst = [l for l in apis.todo.show_lists(todo_token) if l["name"] == {p["list"]!r}][0]\n'
            f'apis.todo.save_sort_preference(todo_token, list_id=lst["id"], sort_by={p["sort_by"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.record("todo.lists", p["list_id"])["sort_by"]
        v.test(
            f"assert the saved sort preference of the '{p['list']}' list (stored in the database) was changed to "
            "the requested order",
            got == p["sort_by"],
            f"saved sort_by={got!r}",
        )
        return {"todo.lists": {"ids": {p["list_id"]: ("sort_by",)}}}


@register
class TodoCompleteOverdue(Template):
    name, apps = "todo_complete_overdue", ("todo",)

    def prepare(self, rng, db):
        tasks = db["todo"]["tasks"]
        counts = {lst["id"]: sum(t["list_id"] == lst["id"] for t in tasks) for lst in db["todo"]["lists"]}
        lst = max(db["todo"]["lists"], key=lambda x: (counts[x["id"]], x["id"]))
        mine = [t for t in tasks if t["list_id"] == lst["id"]]
        for t in rng.sample(mine, min(2, len(mine))):
            t["completed"], t["due_date"] = False, data.date(rng, -15, -1)
        expected = sorted(t["id"] for t in mine if not t["completed"] and t["due_date"] and t["due_date"] < TODAY)
        return {"list_id": lst["id"], "list": lst["name"], "expected": expected}

    def goal(self, p):
        return f"Mark every open task in my '{p['list']}' to-do list that was due before {TODAY} (today) as completed."

    def body(self, p):
        return (
            f'lst = [l for l in apis.todo.show_lists(todo_token) if l["name"] == {p["list"]!r}][0]\n'
            f'for t in all_pages(apis.todo.search_tasks, todo_token, list_id=lst["id"], completed=False, '
            f"due_before={TODAY!r}):\n"
            '    apis.todo.mark_task_completed(todo_token, task_id=t["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        done = sorted(new["id"] for old, new in v.changed("todo.tasks") if new["completed"] and not old["completed"])
        v.test(
            f"assert exactly the open tasks of the '{p['list']}' list that were due before {TODAY} were marked "
            "as completed",
            done == p["expected"],
            f"task ids marked completed: {done}",
        )
        return {"todo.tasks": {"ids": {i: ("completed",) for i in p["expected"]}}}


CHORES = [
    "Buy light bulbs",
    "Call the plumber",
    "Renew library card",
    "Pay water bill",
    "Book dentist",
    "Return rental skis",
    "Order printer ink",
    "Pick up dry cleaning",
    "Email landlord",
    "Back up laptop",
]


@register
class TodoAddTask(Template):
    name, apps = "todo_add_task", ("todo",)

    def prepare(self, rng, db):
        lst = rng.choice(db["todo"]["lists"])
        return {
            "list_id": lst["id"],
            "list": lst["name"],
            "title": rng.choice(CHORES),
            "due_date": data.date(rng, 1, 30),
            "priority": rng.choice(todo.PRIORITIES),
        }

    def goal(self, p):
        return (
            f"Add a task '{p['title']}' to my '{p['list']}' to-do list, due on {p['due_date']}, with "
            f"{p['priority'].lower()} priority."
        )

    def body(self, p):
        return (
            f'lst = [l for l in apis.todo.show_lists(todo_token) if l["name"] == {p["list"]!r}][0]\n'
            f'apis.todo.create_task(todo_token, list_id=lst["id"], title={p["title"]!r}, '
            f"due_date={p['due_date']!r}, priority={p['priority']!r})\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "todo.tasks", title=p["title"], list_id=p["list_id"])
        v.test(
            f"assert one task with the requested title was added to the '{p['list']}' list",
            len(new) == 1,
            f"tasks added: {[(t['title'], t['list_id']) for t in v.added('todo.tasks')]}",
        )
        if len(new) == 1:
            v.test(
                "assert the new task has the requested due date (YYYY-MM-DD)",
                new[0]["due_date"] == p["due_date"],
                f"due_date={new[0]['due_date']!r}",
            )
            v.test(
                "assert the new task has the requested priority",
                new[0]["priority"] == p["priority"],
                f"priority={new[0]['priority']!r}",
            )
        return {"todo.tasks": {"added": 1}}


# =========================================================== notes ==========================================
NOTE_TEXTS = [
    "Remember to bring the charger.",
    "Ask about the warranty.",
    "Three options, compare prices.",
    "Meet at the north entrance.",
    "Draft due next Monday.",
]


@register
class NotesCreate(Template):
    name, apps = "notes_create", ("notes",)

    def prepare(self, rng, db):
        nb = rng.choice(db["notes"]["notebooks"])
        titles = {n["title"] for n in db["notes"]["notes"]}
        title = data.title(rng, 3)
        while title in titles:
            title = data.title(rng, 3)
        return {
            "notebook_id": nb["id"],
            "notebook": nb["name"],
            "title": title,
            "content": rng.choice(NOTE_TEXTS),
            "tag": rng.choice(["urgent", "later", "family", "finance", "health"]),
        }

    def goal(self, p):
        return (
            f"Create a note titled '{p['title']}' in my '{p['notebook']}' notebook with the content "
            f"'{p['content']}', tagged '{p['tag']}'."
        )

    def body(self, p):
        return (
            f'nb = [n for n in apis.notes.show_notebooks(notes_token) if n["name"] == {p["notebook"]!r}][0]\n'
            f"apis.notes.create_note(notes_token, title={p['title']!r}, content={p['content']!r}, "
            f'notebook_id=nb["id"], tags=[{p["tag"]!r}])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "notes.notes", title=p["title"])
        v.test(
            "assert one note with the requested title was created",
            len(new) == 1,
            f"notes created: {[n['title'] for n in v.added('notes.notes')]}",
        )
        if len(new) == 1:
            n = new[0]
            v.test(
                f"assert the note is in the '{p['notebook']}' notebook",
                n["notebook_id"] == p["notebook_id"],
                f"notebook_id={n['notebook_id']!r}",
            )
            v.test(
                "assert the note has the requested content", n["content"] == p["content"], f"content={n['content']!r}"
            )
            v.test("assert the note has exactly the requested tag", n["tags"] == [p["tag"]], f"tags={n['tags']!r}")
        return {"notes.notes": {"added": 1}}


@register
class NotesTagNotebook(Template):
    name, apps = "notes_tag_notebook", ("notes",)

    def prepare(self, rng, db):
        notes = db["notes"]["notes"]
        nb = max(db["notes"]["notebooks"], key=lambda b: (sum(n["notebook_id"] == b["id"] for n in notes), b["id"]))
        mine = [n for n in notes if n["notebook_id"] == nb["id"]]
        tag = rng.choice(
            [
                t
                for t in ["urgent", "later", "family", "finance", "health", "draft", "archive"]
                if any(t not in n["tags"] for n in mine)
            ]
        )
        return {"notebook_id": nb["id"], "notebook": nb["name"], "tag": tag, "note_ids": sorted(n["id"] for n in mine)}

    def goal(self, p):
        return f"Add the tag '{p['tag']}' to every note in my '{p['notebook']}' notebook that does not have it yet."

    def body(self, p):
        return (
            f'nb = [n for n in apis.notes.show_notebooks(notes_token) if n["name"] == {p["notebook"]!r}][0]\n'
            'for n in all_pages(apis.notes.search_notes, notes_token, notebook_id=nb["id"]):\n'
            f'    if {p["tag"]!r} not in n["tags"]:\n'
            f'        apis.notes.add_note_tag(notes_token, note_id=n["id"], tag={p["tag"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        missing = [i for i in p["note_ids"] if p["tag"] not in v.record("notes.notes", i)["tags"]]
        v.test(
            f"assert every note in the '{p['notebook']}' notebook has the tag",
            not missing,
            f"note ids in the notebook still without the tag: {missing}",
        )
        lost = [
            i
            for i in p["note_ids"]
            if not set(v.record("notes.notes", i, "before")["tags"]) <= set(v.record("notes.notes", i)["tags"])
        ]
        v.test("assert the notes kept their other tags", not lost, f"note ids that lost tags: {lost}")
        return {"notes.notes": {"ids": {i: ("tags",) for i in p["note_ids"]}}}


@register
class NotesCountQA(Template):
    name, apps, qa = "notes_count_qa", ("notes",), True

    def prepare(self, rng, db):
        tags = sorted({t for n in db["notes"]["notes"] for t in n["tags"]})
        tag = rng.choice(tags) if tags else "urgent"
        return {"tag": tag, "answer": sum(tag in n["tags"] for n in db["notes"]["notes"])}

    def goal(self, p):
        return f"How many of my notes are tagged '{p['tag']}'?"

    def body(self, p):
        return (
            f"n = len(all_pages(apis.notes.search_notes, notes_token, tag={p['tag']!r}))\n"
            "apis.supervisor.complete_task(answer=n)\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        return _num(answer) == p["answer"]


# =========================================================== music ==========================================
def _artist(db: DB, artist_id: int) -> str:
    return next(a["name"] for a in db["music"]["artists"] if a["id"] == artist_id)


@register
class MusicPlaySong(Template):
    name, apps = "music_play_song", ("music",)

    def prepare(self, rng, db):
        s = rng.choice(db["music"]["songs"])
        return {"song_id": s["id"], "title": s["title"], "artist": _artist(db, s["artist_id"])}

    def goal(self, p):
        return f"Play the song '{p['title']}' by {p['artist']}."

    def body(self, p):
        return (
            f"song = [s for s in all_pages(apis.music.search_songs, music_token, query={p['title']!r}) "
            f'if s["title"] == {p["title"]!r} and s["artist"] == {p["artist"]!r}][0]\n'
            'apis.music.play_song(music_token, song_id=song["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        played = [h["song_id"] for h in v.added("music.play_history")]
        v.test(
            "assert the requested song was played, i.e. a play-history record was created for it",
            played == [p["song_id"]],
            f"song ids of new play-history records: {played}",
        )
        return {"music.play_history": {"added": 1}, "music.songs": {"ids": {p["song_id"]: ("play_count",)}}}


@register
class MusicLikeArtist(Template):
    name, apps = "music_like_artist", ("music",)

    def prepare(self, rng, db):
        liked = {lk["song_id"] for lk in db["music"]["likes"]}
        a = rng.choice(
            [
                a
                for a in db["music"]["artists"]
                if any(s["artist_id"] == a["id"] and s["id"] not in liked for s in db["music"]["songs"])
            ]
        )
        songs = sorted(s["id"] for s in db["music"]["songs"] if s["artist_id"] == a["id"])
        return {"artist": a["name"], "song_ids": songs, "new": [i for i in songs if i not in liked]}

    def goal(self, p):
        return f"Like every song by {p['artist']} that I have not liked yet."

    def body(self, p):
        return (
            f"artist = [a for a in all_pages(apis.music.search_artists, music_token, query={p['artist']!r}) "
            f'if a["name"] == {p["artist"]!r}][0]\n'
            'liked = {s["id"] for s in all_pages(apis.music.show_liked_songs, music_token)}\n'
            'for s in all_pages(apis.music.search_songs, music_token, artist_id=artist["id"]):\n'
            '    if s["id"] not in liked:\n'
            '        apis.music.like_song(music_token, song_id=s["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        liked = {lk["song_id"] for lk in v.table("music.likes")}
        added = sorted(lk["song_id"] for lk in v.added("music.likes"))
        v.test(
            "assert every song by the artist is in your liked songs",
            set(p["song_ids"]) <= liked,
            f"song ids you liked in this task: {added}",
        )
        return {"music.likes": {"added": len(p["new"])}}


@register
class MusicPlaylistFromAlbum(Template):
    name, apps = "music_playlist_from_album", ("music",)

    def prepare(self, rng, db):
        albums = db["music"]["albums"]
        alb = rng.choice(albums)
        songs = [s["id"] for s in db["music"]["songs"] if s["album_id"] == alb["id"]]
        names = {pl["name"] for pl in db["music"]["playlists"]}
        name = rng.choice(
            [n for n in ["Album Night", "On Repeat", "Deep Listen", "Full Album", "Sunday Set"] if n not in names]
        )
        return {
            "album": alb["title"],
            "artist": _artist(db, alb["artist_id"]),
            "album_id": alb["id"],
            "song_ids": songs,
            "playlist": name,
        }

    def goal(self, p):
        return (
            f"Create a private playlist named '{p['playlist']}' with all the songs of the album '{p['album']}' by "
            f"{p['artist']}, in album order."
        )

    def body(self, p):
        return (
            f"artist = [a for a in all_pages(apis.music.search_artists, music_token, query={p['artist']!r}) "
            f'if a["name"] == {p["artist"]!r}][0]\n'
            'songs = all_pages(apis.music.search_songs, music_token, artist_id=artist["id"])\n'
            "albums = [apis.music.show_album(music_token, album_id=i) "
            'for i in sorted({s["album_id"] for s in songs})]\n'
            f'album = [a for a in albums if a["title"] == {p["album"]!r}][0]\n'
            f"pl = apis.music.create_playlist(music_token, name={p['playlist']!r}, is_public=False)\n"
            'for sid in album["song_ids"]:\n'
            '    apis.music.add_song_to_playlist(music_token, playlist_id=pl["id"], song_id=sid)\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "music.playlists", name=p["playlist"])
        v.test(
            "assert one playlist with the requested name was created",
            len(new) == 1,
            f"playlists created: {[pl['name'] for pl in v.added('music.playlists')]}",
        )
        if len(new) == 1:
            v.test(
                "assert the new playlist holds exactly the album's songs, in album order",
                new[0]["song_ids"] == p["song_ids"],
                f"song_ids={new[0]['song_ids']}",
            )
            v.test(
                "assert the new playlist is private", new[0]["is_public"] is False, f"is_public={new[0]['is_public']!r}"
            )
        return {"music.playlists": {"added": 1}}


@register
class MusicPlaylistDurationQA(Template):
    name, apps, qa = "music_playlist_duration_qa", ("music",), True

    def prepare(self, rng, db):
        pl = rng.choice(db["music"]["playlists"])
        dur = {s["id"]: s["duration_s"] for s in db["music"]["songs"]}
        return {"playlist": pl["name"], "minutes": sum(dur[i] for i in pl["song_ids"]) / 60}

    def goal(self, p):
        return f"How long is my '{p['playlist']}' playlist in total, in minutes rounded to the nearest minute?"

    def body(self, p):
        return (
            f'pl = [x for x in apis.music.show_playlists(music_token) if x["name"] == {p["playlist"]!r}][0]\n'
            'songs = apis.music.show_playlist(music_token, playlist_id=pl["id"])["songs"]\n'
            'apis.supervisor.complete_task(answer=round(sum(s["duration_s"] for s in songs) / 60))\n'
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        x = _num(answer)
        return x is not None and abs(x - p["minutes"]) <= 0.5 + 1e-9


# =========================================================== shop ===========================================
@register
class ShopSaveForLater(Template):
    name, apps = "shop_save_for_later", ("shop",)

    def prepare(self, rng, db):
        saved = {s["product_id"] for s in db["shop"]["saved_for_later"]}
        prod = rng.choice([x for x in db["shop"]["products"] if x["id"] not in saved])
        note = rng.choice(["gift for dad", "wait for a sale", "compare sizes", "for the trip", "birthday idea"])
        return {"product_id": prod["id"], "product": prod["name"], "note": note}

    def goal(self, p):
        return f"Save the '{p['product']}' for later in the shop, with the note '{p['note']}'."

    def body(self, p):
        return (
            f"prod = [x for x in all_pages(apis.shop.search_products, shop_token, query={p['product']!r}) "
            f'if x["name"] == {p["product"]!r}][0]\n'
            f'apis.shop.save_for_later(shop_token, product_id=prod["id"], note={p["note"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        added = [(s["product_id"], s["note"]) for s in v.added("shop.saved_for_later")]
        v.test(
            "assert the product was added, with the requested note, to the saved-for-later list of your account "
            "(the logged-in user, not a guest session)",
            added == [(p["product_id"], p["note"])],
            f"entries added to your account's saved-for-later list (product_id, note): {added}",
        )
        return {"shop.saved_for_later": {"added": 1}}


def _cart_deltas(v: Checker) -> dict[int, int]:
    before = {c["product_id"]: c["quantity"] for c in v.table("shop.cart", "before")}
    after = {c["product_id"]: c["quantity"] for c in v.table("shop.cart")}
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(set(before) | set(after))
        if after.get(k, 0) != before.get(k, 0)
    }


@register
class ShopAddByTag(Template):
    name, apps = "shop_add_by_tag", ("shop",)

    def prepare(self, rng, db):
        prods = [x for x in db["shop"]["products"] if x["in_stock"]]
        pairs = sorted({(x["brand"], t) for x in prods for t in x["tags"]})
        brand, tag = rng.choice(pairs)
        cands = sorted(x["price"] for x in prods if x["brand"] == brand and tag in x["tags"])
        limit = int(rng.choice(cands)) + 1
        expected = sorted(x["id"] for x in prods if x["brand"] == brand and tag in x["tags"] and x["price"] <= limit)
        return {"brand": brand, "tag": tag, "max_price": limit, "expected": expected}

    def goal(self, p):
        return (
            f"Add one of every in-stock {p['brand']} product tagged '{p['tag']}' that costs at most "
            f"${p['max_price']} to my shop cart."
        )

    def body(self, p):
        return (
            f"for x in all_pages(apis.shop.search_products, shop_token, brand={p['brand']!r}, tag={p['tag']!r}, "
            f"max_price={float(p['max_price'])!r}, in_stock=True):\n"
            '    apis.shop.add_to_cart(shop_token, product_id=x["id"], quantity=1)\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        d = _cart_deltas(v)
        v.test(
            "assert exactly one unit of each product matching the request (brand, tag, in stock, price limit) was "
            "added to your cart, and nothing else",
            d == {i: 1 for i in p["expected"]},
            f"cart changes (product_id: added quantity): {d}",
        )
        return {"shop.cart": "*"}


@register
class ShopCheapestInCategory(Template):
    name, apps = "shop_cheapest_in_category", ("shop",)

    def prepare(self, rng, db):
        prods = [x for x in db["shop"]["products"] if x["in_stock"]]
        pairs = sorted({(x["category"], x["brand"]) for x in prods})
        cat, brand = rng.choice(pairs)
        best = min(
            (x for x in prods if x["category"] == cat and x["brand"] == brand), key=lambda x: (x["price"], x["id"])
        )
        return {"category": cat, "brand": brand, "product_id": best["id"], "quantity": rng.randint(1, 3)}

    def goal(self, p):
        return (
            f"Add {p['quantity']} of the cheapest in-stock {p['category'].lower()} product from {p['brand']} to my "
            "shop cart."
        )

    def body(self, p):
        return (
            f"items = all_pages(apis.shop.search_products, shop_token, category={p['category']!r}, "
            f"brand={p['brand']!r}, in_stock=True)\n"
            'best = min(items, key=lambda x: x["price"])\n'
            f'apis.shop.add_to_cart(shop_token, product_id=best["id"], quantity={p["quantity"]})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        d = _cart_deltas(v)
        v.test(
            "assert the requested quantity of the cheapest matching product (category, brand, in stock) was added "
            "to your cart, and nothing else",
            d == {p["product_id"]: p["quantity"]},
            f"cart changes (product_id: added quantity): {d}",
        )
        return {"shop.cart": "*"}


@register
class ShopDeliveredSpendQA(Template):
    name, apps, qa = "shop_delivered_spend_qa", ("shop",), True

    def prepare(self, rng, db):
        since = data.date(rng, -100, -10)
        return {
            "since": since,
            "answer": round(
                sum(
                    o["total"]
                    for o in db["shop"]["orders"]
                    if o["status"] == "delivered" and o["placed_at"][:10] >= since
                ),
                2,
            ),
        }

    def goal(self, p):
        return (
            f"How much have I spent in total on shop orders placed on or after {p['since']} that have been "
            "delivered? Answer in dollars."
        )

    def body(self, p):
        return (
            'orders = all_pages(apis.shop.show_orders, shop_token, status="delivered")\n'
            f'total = sum(o["total"] for o in orders if o["placed_at"][:10] >= {p["since"]!r})\n'
            "apis.supervisor.complete_task(answer=round(total, 2))\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        x = _num(answer)
        return x is not None and abs(x - p["answer"]) < 0.011


@register
class ShopCancelProcessing(Template):
    name, apps = "shop_cancel_processing", ("shop",)

    def prepare(self, rng, db):
        orders = db["shop"]["orders"]
        if not any(o["status"] == "processing" for o in orders):
            rng.choice(orders)["status"] = "processing"
        return {"expected": sorted(o["id"] for o in orders if o["status"] == "processing")}

    def goal(self, p):
        return "Cancel all of my shop orders that are still being processed."

    def body(self, p):
        return (
            'for o in all_pages(apis.shop.show_orders, shop_token, status="processing"):\n'
            '    apis.shop.cancel_order(shop_token, order_id=o["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = sorted(new["id"] for old, new in v.changed("shop.orders") if new["status"] == "cancelled")
        v.test(
            "assert exactly the orders that were still processing were cancelled",
            got == p["expected"],
            f"order ids cancelled: {got}",
        )
        return {"shop.orders": {"ids": {i: ("status",) for i in p["expected"]}}}


# ==================================================== contacts / messages / calendar =======================
@register
class ContactsUpdatePhone(Template):
    name, apps = "contacts_update_phone", ("contacts",)

    def prepare(self, rng, db):
        c = rng.choice(db["contacts"]["contacts"])
        phone = f"{rng.randint(201, 989)}{rng.randint(200, 999)}{rng.randint(1000, 9999)}"
        return {"contact_id": c["id"], "name": _names(c), "phone": phone}

    def goal(self, p):
        ph = p["phone"]
        return f"{p['name']} has a new phone number: ({ph[:3]}) {ph[3:6]}-{ph[6:]}. Update it in my contacts."

    def body(self, p):
        return (
            f"c = [x for x in all_pages(apis.contacts.search_contacts, contacts_token, query={p['name']!r})][0]\n"
            f'apis.contacts.update_contact(contacts_token, contact_id=c["id"], phone_number={p["phone"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.record("contacts.contacts", p["contact_id"])["phone_number"]
        v.test(
            "assert the contact's phone number was changed to the new number",
            got == p["phone"],
            f"phone_number={got!r}",
        )
        return {"contacts.contacts": {"ids": {p["contact_id"]: ("phone_number",)}}}


@register
class ContactsFamilyCountQA(Template):
    name, apps, qa = "contacts_family_count_qa", ("contacts",), True

    def prepare(self, rng, db):
        rel = rng.choice(["Family", "Friend", "Coworker", "Neighbor"])
        return {"relationship": rel, "answer": sum(c["relationship"] == rel for c in db["contacts"]["contacts"])}

    def goal(self, p):
        word = {"Family": "family members", "Friend": "friends", "Coworker": "coworkers", "Neighbor": "neighbors"}
        return f"How many of my contacts are {word[p['relationship']]}?"

    def body(self, p):
        return (
            f"n = len(all_pages(apis.contacts.search_contacts, contacts_token, relationship={p['relationship']!r}))\n"
            "apis.supervisor.complete_task(answer=n)\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        return _num(answer) == p["answer"]


TEXTS = [
    "Running late, see you at 7.",
    "Can you pick up milk?",
    "Happy anniversary!",
    "The meeting moved to 3pm.",
    "Thanks for the book!",
    "Call me when you land.",
]


@register
class MessagesTextContact(Template):
    name, apps = "messages_text_contact", ("contacts", "messages")

    def prepare(self, rng, db):
        c = rng.choice(db["contacts"]["contacts"])
        return {"name": _names(c), "phone": c["phone_number"], "text": rng.choice(TEXTS)}

    def goal(self, p):
        return f"Send {p['name']} a text message saying '{p['text']}'."

    def body(self, p):
        return (
            f"c = all_pages(apis.contacts.search_contacts, contacts_token, query={p['name']!r})[0]\n"
            f'apis.messages.send_message(messages_token, phone_number=c["phone_number"], text={p["text"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        sent = [(m["phone_number"], m["text"]) for m in v.added("messages.messages")]
        v.test(
            "assert exactly one message with the requested text was sent, to the contact's phone number",
            sent == [(p["phone"], p["text"])],
            f"messages sent (phone_number, text): {sent}",
        )
        return {"messages.messages": {"added": 1}}


@register
class MessagesMarkReadFrom(Template):
    name, apps = "messages_mark_read_from", ("contacts", "messages")

    def prepare(self, rng, db):
        msgs = db["messages"]["messages"]
        contacts = db["contacts"]["contacts"]
        phones = {c["phone_number"] for c in contacts}
        incoming = [m for m in msgs if m["direction"] == "in" and m["phone_number"] in phones]
        if not any(not m["read"] for m in incoming):
            rng.choice(incoming)["read"] = False
        unread_phones = sorted({m["phone_number"] for m in incoming if not m["read"]})
        phone = rng.choice(unread_phones)
        c = next(c for c in contacts if c["phone_number"] == phone)
        return {
            "name": _names(c),
            "phone": phone,
            "expected": sorted(m["id"] for m in msgs if m["phone_number"] == phone and not m["read"]),
        }

    def goal(self, p):
        return f"Mark all unread messages from {p['name']} as read."

    def body(self, p):
        return (
            f"c = all_pages(apis.contacts.search_contacts, contacts_token, query={p['name']!r})[0]\n"
            'for m in all_pages(apis.messages.search_messages, messages_token, phone_number=c["phone_number"], '
            "unread_only=True):\n"
            '    apis.messages.mark_message_read(messages_token, message_id=m["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        left = [m["id"] for m in v.table("messages.messages") if m["phone_number"] == p["phone"] and not m["read"]]
        v.test(
            "assert every message from the contact is marked as read",
            not left,
            f"message ids from that number still unread: {left}",
        )
        return {"messages.messages": {"ids": {i: ("read",) for i in p["expected"]}}}


EVENTS = ["Coffee catch-up", "Planning session", "Quarterly review", "Tennis", "Study group", "Dinner"]


def _h12(t: str) -> str:
    h, m = int(t[:2]), t[3:]
    return f"{(h - 1) % 12 + 1}:{m} {'AM' if h < 12 else 'PM'}"


@register
class CalendarCreateEvent(Template):
    name, apps = "calendar_create_event", ("contacts", "calendar")

    def prepare(self, rng, db):
        a, b = rng.sample(db["contacts"]["contacts"], 2)
        return {
            "title": rng.choice(EVENTS),
            "date": data.date(rng, 1, 30),
            "start_time": f"{rng.randint(8, 18):02d}:{rng.choice(['00', '30'])}",
            "duration": rng.choice([30, 45, 60, 90]),
            "names": [_names(a), _names(b)],
            "emails": sorted([a["email"], b["email"]]),
        }

    def goal(self, p):
        return (
            f"Schedule '{p['title']}' in my calendar on {p['date']} at {_h12(p['start_time'])} for {p['duration']} "
            f"minutes, and invite {p['names'][0]} and {p['names'][1]}."
        )

    def body(self, p):
        return (
            'emails = [all_pages(apis.contacts.search_contacts, contacts_token, query=n)[0]["email"] '
            f"for n in {p['names']!r}]\n"
            f"apis.calendar.create_event(calendar_token, title={p['title']!r}, date={p['date']!r}, "
            f"start_time={p['start_time']!r}, duration_minutes={p['duration']}, attendee_emails=emails)\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "calendar.events", title=p["title"])
        v.test(
            "assert one event with the requested title was created",
            len(new) == 1,
            f"events created: {[e['title'] for e in v.added('calendar.events')]}",
        )
        if len(new) == 1:
            e = new[0]
            v.test("assert the event is on the requested date", e["date"] == p["date"], f"date={e['date']!r}")
            v.test(
                "assert the event starts at the requested time (HH:MM, 24-hour clock)",
                e["start_time"] == p["start_time"],
                f"start_time={e['start_time']!r}",
            )
            v.test(
                "assert the event has the requested duration",
                e["duration_minutes"] == p["duration"],
                f"duration_minutes={e['duration_minutes']!r}",
            )
            v.test(
                "assert the attendees are exactly the two requested contacts (by email)",
                sorted(e["attendee_emails"]) == p["emails"],
                f"attendee_emails={e['attendee_emails']!r}",
            )
        return {"calendar.events": {"added": 1}}


@register
class CalendarCountQA(Template):
    name, apps, qa = "calendar_count_qa", ("calendar",), True

    def prepare(self, rng, db):
        d1 = data.date(rng, -10, 10)
        d2 = data.add_days(d1, rng.randint(6, 20))
        return {"start": d1, "end": d2, "answer": sum(d1 <= e["date"] <= d2 for e in db["calendar"]["events"])}

    def goal(self, p):
        return f"How many events do I have in my calendar from {p['start']} to {p['end']}, both days included?"

    def body(self, p):
        return (
            f"n = len(all_pages(apis.calendar.search_events, calendar_token, start_date={p['start']!r}, "
            f"end_date={p['end']!r}))\n"
            "apis.supervisor.complete_task(answer=n)\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        return _num(answer) == p["answer"]


@register
class CalendarReschedule(Template):
    name, apps = "calendar_reschedule", ("calendar",)

    def prepare(self, rng, db):
        evs = db["calendar"]["events"]
        keys = {}
        for e in evs:
            keys.setdefault((e["title"], e["date"]), []).append(e)
        e = rng.choice([g[0] for g in keys.values() if len(g) == 1])
        return {
            "event_id": e["id"],
            "title": e["title"],
            "date": e["date"],
            "new_date": data.add_days(e["date"], rng.choice([1, 2, 3, 7, 14])),
        }

    def goal(self, p):
        return f"Move my '{p['title']}' event on {p['date']} to {p['new_date']}, keeping the same time."

    def body(self, p):
        return (
            f"e = [x for x in all_pages(apis.calendar.search_events, calendar_token, query={p['title']!r}, "
            f'start_date={p["date"]!r}, end_date={p["date"]!r}) if x["title"] == {p["title"]!r}][0]\n'
            f'apis.calendar.update_event(calendar_token, event_id=e["id"], date={p["new_date"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.record("calendar.events", p["event_id"])
        v.test(
            "assert the event was moved to the requested date",
            got is not None and got["date"] == p["new_date"],
            f"date={got['date'] if got else None!r}",
        )
        return {"calendar.events": {"ids": {p["event_id"]: ("date",)}}}


# =========================================================== news ===========================================
@register
class NewsReadArticle(Template):
    name, apps = "news_read_article", ("news",)

    def prepare(self, rng, db):
        arts = db["news"]["articles"]
        src = rng.choice(sorted({a["source"] for a in arts}))
        top = max((a for a in arts if a["source"] == src), key=lambda a: (a["published_at"], a["id"]))
        top["read"] = False
        return {"source": src, "article_id": top["id"]}

    def goal(self, p):
        return f"Read the most recent article from {p['source']} in my news app."

    def body(self, p):
        return (
            f"a = apis.news.search_articles(news_token, source={p['source']!r}, page_limit=1)[0]\n"
            'apis.news.show_article(news_token, article_id=a["id"])\n'
            'apis.news.mark_article_read(news_token, article_id=a["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        newly = [new["id"] for old, new in v.changed("news.articles") if new["read"] and not old["read"]]
        v.test(
            "assert the requested article is marked as read in the database",
            newly == [p["article_id"]],
            f"article ids newly marked as read: {newly}",
        )
        return {"news.articles": {"ids": {p["article_id"]: ("read",)}}}


@register
class NewsDefaultSection(Template):
    name, apps = "news_default_section", ("news",)

    def prepare(self, rng, db):
        cur = db["news"]["preferences"][0]["default_section"]
        return {
            "section": rng.choice(
                [s for s in ("World", "Business", "Sports", "Science", "Technology", "Culture") if s != cur]
            )
        }

    def goal(self, p):
        return f"I want my news feed to open on the {p['section']} section by default from now on."

    def body(self, p):
        return (
            f"apis.news.update_preferences(news_token, default_section={p['section']!r})\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.table("news.preferences")[0]["default_section"]
        v.test(
            "assert the default feed section saved in your news preferences was changed as requested",
            got == p["section"],
            f"saved default_section={got!r}",
        )
        return {"news.preferences": {"ids": {1: ("default_section",)}}}


@register
class NewsBookmarkSource(Template):
    name, apps = "news_bookmark_source", ("news",)

    def prepare(self, rng, db):
        arts = db["news"]["articles"]
        pairs = sorted({(a["source"], a["section"]) for a in arts if not a["bookmarked"]})
        src, sec = rng.choice(pairs)
        ids = sorted(a["id"] for a in arts if a["source"] == src and a["section"] == sec)
        return {
            "source": src,
            "section": sec,
            "ids": ids,
            "new": [i for i in ids if not next(a for a in arts if a["id"] == i)["bookmarked"]],
        }

    def goal(self, p):
        return f"Bookmark all {p['section']} articles from {p['source']}."

    def body(self, p):
        return (
            f"for a in all_pages(apis.news.search_articles, news_token, source={p['source']!r}, "
            f"section={p['section']!r}):\n"
            '    if not a["bookmarked"]:\n'
            '        apis.news.bookmark_article(news_token, article_id=a["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        missing = [i for i in p["ids"] if not v.record("news.articles", i)["bookmarked"]]
        added = [new["id"] for old, new in v.changed("news.articles") if new["bookmarked"] and not old["bookmarked"]]
        v.test(
            "assert every article matching the request (source and section) is bookmarked",
            not missing,
            f"article ids you bookmarked: {added}",
        )
        return {"news.articles": {"ids": {i: ("bookmarked",) for i in p["new"]}}}


# ==================================================== held-out apps (eval) ==================================
DAY_NAMES = {
    "Mon": "Monday",
    "Tue": "Tuesday",
    "Wed": "Wednesday",
    "Thu": "Thursday",
    "Fri": "Friday",
    "Sat": "Saturday",
    "Sun": "Sunday",
}


@register
class ClockAlarmTime(Template):
    name, apps = "clock_alarm_time", ("clock",)

    def prepare(self, rng, db):
        a = rng.choice(db["clock"]["alarms"])
        while True:
            h, m, mer = rng.randint(1, 12), rng.choice(range(0, 60, 5)), rng.choice(["AM", "PM"])
            if (h, m, mer) != (a["hour"], a["minute"], a["meridiem"]):
                break
        return {"alarm_id": a["id"], "label": a["label"], "hour": h, "minute": m, "meridiem": mer}

    def goal(self, p):
        return f"Change my '{p['label']}' alarm to {p['hour']}:{p['minute']:02d} {p['meridiem'].lower()}."

    def body(self, p):
        return (
            f'a = [x for x in apis.clock.show_alarms(clock_token) if x["label"] == {p["label"]!r}][0]\n'
            f'apis.clock.update_alarm(clock_token, alarm_id=a["id"], hour={p["hour"]}, minute={p["minute"]}, '
            f"meridiem={p['meridiem']!r})\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        a = v.record("clock.alarms", p["alarm_id"])
        v.test(
            "assert the alarm's hour and minute were set as requested",
            (a["hour"], a["minute"]) == (p["hour"], p["minute"]),
            f"hour={a['hour']!r}, minute={a['minute']!r}",
        )
        v.test(
            "assert the alarm's AM/PM marker was set as requested, as a valid Meridiem enum value ('AM' or 'PM', "
            "case-sensitive)",
            a["meridiem"] == p["meridiem"],
            f"meridiem={a['meridiem']!r}",
        )
        return {"clock.alarms": {"ids": {p["alarm_id"]: ("hour", "minute", "meridiem")}}}


@register
class ClockReminder(Template):
    name, apps = "clock_reminder", ("clock",)

    def prepare(self, rng, db):
        return {
            "title": rng.choice(CHORES),
            "date": data.date(rng, 1, 20),
            "priority": rng.choice(clock.Priority.__args__),
        }

    def goal(self, p):
        return f"Create a reminder '{p['title']}' for {p['date']} with {p['priority'].lower()} priority."

    def body(self, p):
        return (
            f"apis.clock.create_reminder(clock_token, title={p['title']!r}, date={p['date']!r}, "
            f"priority={p['priority']!r})\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "clock.reminders", title=p["title"])
        v.test(
            "assert one reminder with the requested title was created",
            len(new) == 1,
            f"reminders created: {[r['title'] for r in v.added('clock.reminders')]}",
        )
        if len(new) == 1:
            v.test(
                "assert the reminder is on the requested date", new[0]["date"] == p["date"], f"date={new[0]['date']!r}"
            )
            v.test(
                "assert the reminder has the requested Priority enum value",
                new[0]["priority"] == p["priority"],
                f"priority={new[0]['priority']!r}",
            )
        return {"clock.reminders": {"added": 1}}


@register
class ClockDisableDay(Template):
    name, apps = "clock_disable_day", ("clock",)

    def prepare(self, rng, db):
        alarms = db["clock"]["alarms"]
        day = rng.choice(sorted({d for a in alarms for d in a["days"]}))
        for a in alarms:
            if day in a["days"]:
                a["enabled"] = True
                break
        return {"day": day, "expected": sorted(a["id"] for a in alarms if day in a["days"] and a["enabled"])}

    def goal(self, p):
        return f"Turn off all of my alarms that ring on {DAY_NAMES[p['day']]}s."

    def body(self, p):
        return (
            f"for a in apis.clock.show_alarms(clock_token, enabled=True):\n"
            f'    if {p["day"]!r} in a["days"]:\n'
            '        apis.clock.set_alarm_enabled(clock_token, alarm_id=a["id"], enabled=False)\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        still = [a["id"] for a in v.table("clock.alarms") if p["day"] in a["days"] and a["enabled"]]
        v.test(
            "assert every alarm that rings on the requested weekday is turned off",
            not still,
            f"alarm ids for that day still enabled: {still}",
        )
        return {"clock.alarms": {"ids": {i: ("enabled",) for i in p["expected"]}}}


@register
class FinanceSearch(Template):
    name, apps = "finance_search", ("finance",)

    def prepare(self, rng, db):
        s = rng.choice(db["finance"]["stocks"])
        return {"query": s["name"].split()[0]}

    def goal(self, p):
        return f"Search for {p['query']} in the finance app."

    def body(self, p):
        return f"apis.finance.search(finance_token, query={p['query']!r})\napis.supervisor.complete_task()\n"

    def check(self, v, p):
        qs = [h["query"] for h in v.added("finance.search_history")]
        v.test(
            "assert a search whose query contains the requested text was recorded in your search history",
            any(p["query"].lower() in q.lower() for q in qs),
            f"queries added to the search history: {qs}",
        )
        return {"finance.search_history": "*"}


HORIZON_WORDS = {"1W": "one week", "1M": "one month", "6M": "six months", "1Y": "one year", "5Y": "five years"}


@register
class FinanceChartDefault(Template):
    name, apps = "finance_chart_default", ("finance",)

    def prepare(self, rng, db):
        cur = db["finance"]["preferences"][0]["default_chart_horizon"]
        return {"horizon": rng.choice([h for h in HORIZON_WORDS if h != cur])}

    def goal(self, p):
        return f"From now on, I want stock charts in the finance app to cover {HORIZON_WORDS[p['horizon']]} by default."

    def body(self, p):
        return (
            f"apis.finance.set_default_chart_horizon(finance_token, horizon={p['horizon']!r})\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        got = v.table("finance.preferences")[0]["default_chart_horizon"]
        v.test(
            "assert the default chart horizon saved in your preferences was changed as requested",
            got == p["horizon"],
            f"saved default_chart_horizon={got!r}",
        )
        return {"finance.preferences": {"ids": {1: ("default_chart_horizon",)}}}


SECTOR_WORDS = {
    "Technology": "tech",
    "Energy": "energy",
    "Healthcare": "healthcare",
    "Finance": "financial",
    "Consumer": "consumer",
    "Industrials": "industrial",
}


@register
class FinanceWatchlistSector(Template):
    name, apps = "finance_watchlist_sector", ("finance",)

    def prepare(self, rng, db):
        stocks = db["finance"]["stocks"]
        watched = {w["symbol"] for w in db["finance"]["watchlist"]}
        sector, exch = rng.choice(sorted({(s["sector"], s["exchange"]) for s in stocks if s["symbol"] not in watched}))
        syms = sorted(s["symbol"] for s in stocks if s["sector"] == sector and s["exchange"] == exch)
        return {"sector": sector, "exchange": exch, "symbols": syms, "new": [s for s in syms if s not in watched]}

    def goal(self, p):
        return (
            f"Add every {SECTOR_WORDS[p['sector']]} stock traded on the {p['exchange']} to my watchlist, unless "
            "it is already there."
        )

    def body(self, p):
        return (
            'watched = {s["symbol"] for s in apis.finance.show_watchlist(finance_token)}\n'
            f"for s in all_pages(apis.finance.search_tickers, finance_token, sector={p['sector']!r}, "
            f"exchange={p['exchange']!r}):\n"
            '    if s["symbol"] not in watched:\n'
            '        apis.finance.add_to_watchlist(finance_token, symbol=s["symbol"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        on = {w["symbol"] for w in v.table("finance.watchlist")}
        added = [w["symbol"] for w in v.added("finance.watchlist")]
        v.test(
            "assert every stock matching the request (sector and exchange) is on your watchlist",
            set(p["symbols"]) <= on,
            f"symbols you added to the watchlist: {added}",
        )
        return {"finance.watchlist": {"added": len(p["new"])}}


@register
class FinancePortfolioQA(Template):
    name, apps, qa = "finance_portfolio_qa", ("finance",), True

    def prepare(self, rng, db):
        price = {s["symbol"]: s["price"] for s in db["finance"]["stocks"]}
        return {"answer": round(sum(price[h["symbol"]] * h["shares"] for h in db["finance"]["holdings"]), 2)}

    def goal(self, p):
        return "What is the total current value of my stock portfolio, in dollars?"

    def body(self, p):
        return (
            'apis.supervisor.complete_task(answer=round(sum(h["value"] for h in '
            "apis.finance.show_portfolio(finance_token)), 2))\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        x = _num(answer)
        return x is not None and abs(x - p["answer"]) < 0.05


@register
class TrailsBookmark(Template):
    name, apps = "trails_bookmark", ("trails",)

    def prepare(self, rng, db):
        trails = db["trails"]["trails"]
        marked = {b["trail_id"] for b in db["trails"]["bookmarks"]}
        loc, act = rng.choice(sorted({(t["location"], t["activity"]) for t in trails}))
        lengths = sorted(
            t["length_km"] for t in trails if t["location"] == loc and t["activity"] == act and t["id"] not in marked
        )
        km = int(rng.choice(lengths)) + 1
        ids = sorted(t["id"] for t in trails if t["location"] == loc and t["activity"] == act and t["length_km"] <= km)
        return {"location": loc, "activity": act, "max_km": km, "ids": ids, "new": [i for i in ids if i not in marked]}

    def goal(self, p):
        return (
            f"Bookmark all the {p['activity'].lower()} trails in {p['location']} that are at most {p['max_km']} km "
            "long."
        )

    def body(self, p):
        return (
            'marked = {t["id"] for t in apis.trails.show_bookmarks(trails_token)}\n'
            f"for t in all_pages(apis.trails.search_trails, trails_token, location={p['location']!r}, "
            f"activity={p['activity']!r}, max_length_km={float(p['max_km'])!r}):\n"
            '    if t["id"] not in marked:\n'
            '        apis.trails.bookmark_trail(trails_token, trail_id=t["id"])\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        on = {b["trail_id"] for b in v.table("trails.bookmarks")}
        added = [b["trail_id"] for b in v.added("trails.bookmarks")]
        v.test(
            "assert every trail matching the request (location, activity, length) is bookmarked",
            set(p["ids"]) <= on,
            f"trail ids you bookmarked: {added}",
        )
        return {"trails.bookmarks": {"added": len(p["new"])}}


@register
class TrailsCountQA(Template):
    name, apps, qa = "trails_count_qa", ("trails",), True

    def prepare(self, rng, db):
        t = rng.choice(db["trails"]["trails"])
        key = (t["location"], t["activity"], t["difficulty"])
        n = sum((x["location"], x["activity"], x["difficulty"]) == key for x in db["trails"]["trails"])
        return {"location": key[0], "activity": key[1], "difficulty": key[2], "answer": n}

    def goal(self, p):
        return f"How many {p['difficulty'].lower()} {p['activity'].lower()} trails are there in {p['location']}?"

    def body(self, p):
        return (
            f"n = len(all_pages(apis.trails.search_trails, trails_token, location={p['location']!r}, "
            f"activity={p['activity']!r}, difficulty={p['difficulty']!r}))\n"
            "apis.supervisor.complete_task(answer=n)\n"
        )

    def check(self, v, p):
        return {}

    def answer_ok(self, answer, p):
        return _num(answer) == p["answer"]


@register
class RecipesMealPlan(Template):
    name, apps = "recipes_meal_plan", ("recipes",)

    def prepare(self, rng, db):
        r = rng.choice(db["recipes"]["recipes"])
        return {
            "recipe_id": r["id"],
            "title": r["title"],
            "date": data.date(rng, 1, 14),
            "meal": rng.choice(["Breakfast", "Lunch", "Dinner"]),
        }

    def goal(self, p):
        return f"Plan the '{p['title']}' recipe for {p['meal'].lower()} on {p['date']}."

    def body(self, p):
        return (
            f"r = [x for x in all_pages(apis.recipes.search_recipes, recipes_token, query={p['title']!r}) "
            f'if x["title"] == {p["title"]!r}][0]\n'
            f'apis.recipes.add_to_meal_plan(recipes_token, recipe_id=r["id"], date={p["date"]!r}, meal={p["meal"]!r})\n'
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        new = _added_with(v, "recipes.meal_plan", recipe_id=p["recipe_id"], date=p["date"])
        v.test(
            "assert one meal plan entry for the requested recipe and date was added",
            len(new) == 1,
            f"entries added (recipe_id, date): {[(e['recipe_id'], e['date']) for e in v.added('recipes.meal_plan')]}",
        )
        if len(new) == 1:
            v.test(
                "assert the entry's meal was set as requested, as a valid Meal enum value (Breakfast, Lunch, Dinner; "
                "case-sensitive)",
                new[0]["meal"] == p["meal"],
                f"meal={new[0]['meal']!r}",
            )
        return {"recipes.meal_plan": {"added": 1}}


@register
class RecipesShoppingFromRecipe(Template):
    name, apps = "recipes_shopping_from_recipe", ("recipes",)

    def prepare(self, rng, db):
        have = {s["item"] for s in db["recipes"]["shopping_list"]}
        r = rng.choice([r for r in db["recipes"]["recipes"] if not set(r["ingredients"]) <= have])
        return {
            "title": r["title"],
            "ingredients": r["ingredients"],
            "new": [i for i in r["ingredients"] if i not in have],
        }

    def goal(self, p):
        return f"Add the ingredients of the '{p['title']}' recipe that are not on my shopping list yet to it."

    def body(self, p):
        return (
            f"r = [x for x in all_pages(apis.recipes.search_recipes, recipes_token, query={p['title']!r}) "
            f'if x["title"] == {p["title"]!r}][0]\n'
            'have = {s["item"] for s in apis.recipes.show_shopping_list(recipes_token)}\n'
            'for item in r["ingredients"]:\n'
            "    if item not in have:\n"
            "        apis.recipes.add_shopping_item(recipes_token, item=item)\n"
            "apis.supervisor.complete_task()\n"
        )

    def check(self, v, p):
        items = {s["item"] for s in v.table("recipes.shopping_list")}
        added = [s["item"] for s in v.added("recipes.shopping_list")]
        v.test(
            "assert every ingredient of the recipe is on the shopping list",
            set(p["ingredients"]) <= items,
            f"items you added: {added}",
        )
        return {"recipes.shopping_list": {"added": len(p["new"])}}


BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}
