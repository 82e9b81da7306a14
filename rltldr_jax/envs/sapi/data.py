"""Word lists and seeded helpers from which the apps build their initial databases."""

from __future__ import annotations

import datetime
import functools
import random
from typing import Any

FIRST = [
    "Ava",
    "Liam",
    "Noah",
    "Emma",
    "Olivia",
    "Mason",
    "Sophia",
    "Lucas",
    "Mia",
    "Ethan",
    "Isla",
    "Leo",
    "Chloe",
    "Aria",
    "Jack",
    "Nora",
    "Owen",
    "Zoe",
    "Ruby",
    "Felix",
    "Hazel",
    "Milo",
    "Ivy",
    "Theo",
    "Lena",
    "Omar",
    "Priya",
    "Kenji",
    "Sofia",
    "Diego",
    "Amara",
    "Yusuf",
]
LAST = [
    "Smith",
    "Garcia",
    "Chen",
    "Patel",
    "Kim",
    "Nguyen",
    "Brown",
    "Lopez",
    "Müller",
    "Rossi",
    "Silva",
    "Khan",
    "Cohen",
    "Novak",
    "Larsen",
    "Okafor",
    "Tanaka",
    "Dubois",
    "Schmidt",
    "Ward",
]
SUPERVISOR_LAST = ["Bennett", "Alvarez", "Fischer", "Moreau", "Sato", "Haddad", "Lindqvist", "Ortega"]
WORDS = [
    "budget",
    "garden",
    "travel",
    "recipe",
    "meeting",
    "project",
    "birthday",
    "workout",
    "reading",
    "invoice",
    "design",
    "launch",
    "holiday",
    "review",
    "plan",
    "ideas",
    "draft",
    "summary",
    "school",
    "music",
    "photos",
    "repair",
    "moving",
    "taxes",
    "wedding",
    "camping",
    "research",
    "podcast",
]
TOPICS = [
    "climate",
    "elections",
    "football",
    "startups",
    "space",
    "vaccines",
    "markets",
    "tennis",
    "movies",
    "housing",
    "energy",
    "robots",
    "oceans",
    "olympics",
    "chips",
    "wildfires",
]
CITIES = ["Boulder", "Denver", "Portland", "Seattle", "Austin", "Asheville", "Moab", "Bend", "Tahoe", "Aspen"]


def ch(rng: random.Random, seq: Any) -> Any:
    """A fast `rng.choice` (world building calls it hundreds of thousands of times per split)."""
    return seq[int(rng.random() * len(seq))]


def ri(rng: random.Random, lo: int, hi: int) -> int:
    """A fast `rng.randint(lo, hi)` (inclusive)."""
    return lo + int(rng.random() * (hi - lo + 1))


def person(rng: random.Random, taken: set[str]) -> dict[str, str]:
    """A distinct person with name, email and phone number."""
    while True:
        first, last = ch(rng, FIRST), ch(rng, LAST)
        if f"{first} {last}" not in taken:
            taken.add(f"{first} {last}")
            break
    email = f"{first.lower()}.{last.lower().replace('ü', 'u')}@{ch(rng, ('gmail.com', 'mail.com', 'proton.me'))}"
    phone = f"{ri(rng, 201, 989)}{ri(rng, 200, 999)}{ri(rng, 1000, 9999)}"
    return {"first_name": first, "last_name": last, "email": email, "phone_number": phone}


@functools.lru_cache(maxsize=16)
def people(seed: int, n: int = 24) -> tuple[dict[str, str], ...]:
    """The world's people other than the supervisor (shared by contacts, messages and calendar; cached, so
    callers must copy a record before changing it)."""
    rng = random.Random(f"people/{seed}")
    taken: set[str] = set()
    return tuple(person(rng, taken) for _ in range(n))


_DATES = {k: (datetime.date(2024, 6, 14) + datetime.timedelta(days=k)).isoformat() for k in range(-400, 401)}


def date(rng: random.Random, lo: int = -60, hi: int = 60) -> str:
    """A date `lo..hi` days around the world's today (2024-06-14)."""
    return _DATES[ri(rng, lo, hi)]


def add_days(day: str, n: int) -> str:
    return (datetime.date.fromisoformat(day) + datetime.timedelta(days=n)).isoformat()


def title(rng: random.Random, k: int = 2) -> str:
    return " ".join(ch(rng, WORDS).capitalize() for _ in range(k))
