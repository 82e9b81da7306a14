"""Music player: songs, albums, artists, likes, playlists and play history."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import NOW, ApiError, App, Ctx, page
from .common import add_account_apis, contains

GENRES = ("Rock", "Pop", "Jazz", "Hip-Hop", "Classical", "Electronic", "Folk")
ARTISTS = [
    "The Lanterns",
    "Nova Reed",
    "Blue Harbor",
    "Kai Moreno",
    "Velvet Static",
    "June Park",
    "Echo Vale",
    "Marta Sol",
    "The Fables",
    "Orbit Nine",
    "Ada Quinn",
    "Low Tide",
]
SONG_WORDS = [
    "Midnight",
    "Golden",
    "River",
    "Echoes",
    "Paper",
    "Skyline",
    "Velvet",
    "Fire",
    "Ocean",
    "Summer",
    "Ghost",
    "Neon",
    "Wild",
    "Silver",
    "Heart",
    "Road",
    "Dream",
    "Storm",
    "Shadow",
    "Light",
]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"music/{seed}")
    artists = [{"id": i + 1, "name": n, "genre": ch(rng, GENRES)} for i, n in enumerate(rng.sample(ARTISTS, 7))]
    albums, songs, titles = [], [], set()
    for a in artists:
        for _ in range(ri(rng, 1, 2)):
            alb = {
                "id": len(albums) + 1,
                "title": " ".join(rng.sample(SONG_WORDS, 2)),
                "artist_id": a["id"],
                "year": ri(rng, 1995, 2024),
            }
            albums.append(alb)
            for _ in range(ri(rng, 3, 6)):
                t = " ".join(rng.sample(SONG_WORDS, ri(rng, 1, 3)))
                while t in titles:
                    t = " ".join(rng.sample(SONG_WORDS, 3))
                titles.add(t)
                songs.append(
                    {
                        "id": len(songs) + 1,
                        "title": t,
                        "artist_id": a["id"],
                        "album_id": alb["id"],
                        "genre": a["genre"],
                        "duration_s": ri(rng, 120, 420),
                        "play_count": ri(rng, 0, 5000),
                    }
                )
    likes = [{"id": i + 1, "song_id": s["id"]} for i, s in enumerate(rng.sample(songs, 6))]
    playlists = [
        {
            "id": i + 1,
            "name": n,
            "song_ids": [s["id"] for s in rng.sample(songs, ri(rng, 3, 9))],
            "is_public": rng.random() < 0.5,
        }
        for i, n in enumerate(rng.sample(["Road Trip", "Focus", "Workout", "Chill", "Party", "Sleep", "Morning"], 3))
    ]
    history = [
        {"id": i + 1, "song_id": ch(rng, songs)["id"], "played_at": data.date(rng, -30, -1) + "T20:00:00"}
        for i in range(8)
    ]
    return {
        "artists": artists,
        "albums": albums,
        "songs": songs,
        "likes": likes,
        "playlists": playlists,
        "play_history": history,
    }


app = add_account_apis(
    App(
        "music",
        "A music player: search and play songs, like them, manage playlists; "
        "playing a song records it in your play history.",
        build,
    )
)


def _song(ctx: Ctx, s: dict) -> dict[str, Any]:
    artist = ctx.get("artists", s["artist_id"], "artist")["name"]
    return dict(s, artist=artist)


@app.api()
def search_songs(
    ctx: Ctx,
    query: str = "",
    artist_id: int | None = None,
    album_id: int | None = None,
    genre: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches songs by title, by id.

    Args:
      query: case-insensitive text in the title ("" = all).
      artist_id: only this artist's songs.
      album_id: only this album's songs.
      genre: only this exact genre (e.g. "Rock").
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of songs {"id", "title", "artist_id", "artist", "album_id", "genre", "duration_s",
      "play_count"}.
    """
    hits = [
        s
        for s in ctx.db["songs"]
        if contains(s["title"], query)
        and (artist_id is None or s["artist_id"] == artist_id)
        and (album_id is None or s["album_id"] == album_id)
        and (genre is None or s["genre"] == genre)
    ]
    return [_song(ctx, s) for s in page(hits, page_index, page_limit)]


@app.api()
def search_artists(ctx: Ctx, query: str = "", page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Searches artists by name.

    Args:
      query: case-insensitive text in the name.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "name", "genre"}.
    """
    return page([a for a in ctx.db["artists"] if contains(a["name"], query)], page_index, page_limit)


@app.api()
def show_album(ctx: Ctx, album_id: int) -> dict[str, Any]:
    """Shows an album with its song ids.

    Args:
      album_id: the album's id.
    Returns: {"id", "title", "artist_id", "year", "song_ids"}.
    """
    alb = ctx.get("albums", album_id, "album")
    return dict(alb, song_ids=[s["id"] for s in ctx.db["songs"] if s["album_id"] == album_id])


@app.api()
def show_song(ctx: Ctx, song_id: int) -> dict[str, Any]:
    """Shows a song's details (does not play it).

    Args:
      song_id: the song's id.
    Returns: the song.
    """
    return _song(ctx, ctx.get("songs", song_id, "song"))


@app.api()
def play_song(ctx: Ctx, song_id: int) -> dict[str, Any]:
    """Plays a song: adds it to your play history and counts the play.

    Args:
      song_id: the song's id.
    Returns: {"message", "song_id"}.
    """
    s = ctx.get("songs", song_id, "song")
    s["play_count"] += 1
    ctx.db["play_history"].append({"id": ctx.new_id("play_history"), "song_id": song_id, "played_at": NOW})
    return {"message": f"Now playing {s['title']!r}.", "song_id": song_id}


@app.api()
def show_play_history(ctx: Ctx, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Shows your play history, newest first.

    Args:
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "song_id", "played_at"}.
    """
    return page(
        sorted(ctx.db["play_history"], key=lambda h: (h["played_at"], h["id"]), reverse=True), page_index, page_limit
    )


@app.api()
def show_liked_songs(ctx: Ctx, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Shows the songs you liked.

    Args:
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of songs.
    """
    ids = [lk["song_id"] for lk in ctx.db["likes"]]
    return [_song(ctx, ctx.get("songs", i, "song")) for i in page(ids, page_index, page_limit)]


@app.api()
def like_song(ctx: Ctx, song_id: int) -> dict[str, str]:
    """Likes a song.

    Args:
      song_id: the song's id.
    Returns: {"message"}.
    """
    ctx.get("songs", song_id, "song")
    if any(lk["song_id"] == song_id for lk in ctx.db["likes"]):
        raise ApiError(409, "You already like this song.")
    ctx.db["likes"].append({"id": ctx.new_id("likes"), "song_id": song_id})
    return {"message": "Song liked."}


@app.api()
def unlike_song(ctx: Ctx, song_id: int) -> dict[str, str]:
    """Removes a song from your liked songs.

    Args:
      song_id: the song's id.
    Returns: {"message"}.
    """
    hit = [lk for lk in ctx.db["likes"] if lk["song_id"] == song_id]
    if not hit:
        raise ApiError(404, "You do not like this song.")
    ctx.db["likes"].remove(hit[0])
    return {"message": "Song unliked."}


@app.api()
def show_playlists(ctx: Ctx) -> list[dict[str, Any]]:
    """Lists your playlists.

    Returns: a list of {"id", "name", "song_ids", "is_public"}.
    """
    return ctx.db["playlists"]


@app.api()
def show_playlist(ctx: Ctx, playlist_id: int) -> dict[str, Any]:
    """Shows a playlist with its songs.

    Args:
      playlist_id: the playlist's id.
    Returns: the playlist with "songs" (full song records).
    """
    pl = ctx.get("playlists", playlist_id, "playlist")
    return dict(pl, songs=[_song(ctx, ctx.get("songs", i, "song")) for i in pl["song_ids"]])


@app.api()
def create_playlist(ctx: Ctx, name: str, is_public: bool = False) -> dict[str, Any]:
    """Creates an empty playlist.

    Args:
      name: the name.
      is_public: whether others can see it.
    Returns: the playlist.
    """
    pl = {"id": ctx.new_id("playlists"), "name": name, "song_ids": [], "is_public": is_public}
    ctx.db["playlists"].append(pl)
    return pl


@app.api()
def add_song_to_playlist(ctx: Ctx, playlist_id: int, song_id: int) -> dict[str, Any]:
    """Appends a song to a playlist.

    Args:
      playlist_id: the playlist's id.
      song_id: the song's id.
    Returns: the playlist.
    """
    pl = ctx.get("playlists", playlist_id, "playlist")
    ctx.get("songs", song_id, "song")
    if song_id in pl["song_ids"]:
        raise ApiError(409, "The song is already in the playlist.")
    pl["song_ids"].append(song_id)
    return pl


@app.api()
def remove_song_from_playlist(ctx: Ctx, playlist_id: int, song_id: int) -> dict[str, Any]:
    """Removes a song from a playlist.

    Args:
      playlist_id: the playlist's id.
      song_id: the song's id.
    Returns: the playlist.
    """
    pl = ctx.get("playlists", playlist_id, "playlist")
    if song_id not in pl["song_ids"]:
        raise ApiError(404, "The song is not in the playlist.")
    pl["song_ids"].remove(song_id)
    return pl


@app.api()
def delete_playlist(ctx: Ctx, playlist_id: int) -> dict[str, str]:
    """Deletes a playlist.

    Args:
      playlist_id: the playlist's id.
    Returns: {"message"}.
    """
    ctx.db["playlists"].remove(ctx.get("playlists", playlist_id, "playlist"))
    return {"message": "Playlist deleted."}
