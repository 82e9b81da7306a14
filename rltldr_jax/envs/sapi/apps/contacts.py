"""Contacts app: people with phone numbers, emails, birthdays and a relationship."""

from __future__ import annotations

import random
from typing import Any, Literal

from .. import data
from ..data import ch
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis, contains

RELATIONSHIPS = ("Friend", "Family", "Coworker", "Neighbor", "Other")
Relationship = Literal["Friend", "Family", "Coworker", "Neighbor", "Other"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"contacts/{seed}")
    contacts = []
    for i, p in enumerate(data.people(seed)[:18]):
        contacts.append(
            dict(
                p,
                id=i + 1,
                relationship=ch(rng, RELATIONSHIPS),
                birthday=data.date(rng, -180, 180),
                favorite=rng.random() < 0.2,
            )
        )
    return {"contacts": contacts}


app = add_account_apis(
    App(
        "contacts",
        "Your address book: names, phone numbers, emails, birthdays and relationships of the people you know.",
        build,
    )
)


@app.api()
def search_contacts(
    ctx: Ctx,
    query: str = "",
    relationship: Relationship | None = None,
    favorite: bool | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches contacts by name, email or phone number.

    Args:
      query: case-insensitive text in the full name, email or phone number ("" = all).
      relationship: only this relationship.
      favorite: only favorites (True) or non-favorites (False).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of contacts {"id", "first_name", "last_name", "email", "phone_number", "relationship",
      "birthday", "favorite"}.
    """
    hits = [
        c
        for c in ctx.db["contacts"]
        if contains(f"{c['first_name']} {c['last_name']} {c['email']} {c['phone_number']}", query)
        and (relationship is None or c["relationship"] == relationship)
        and (favorite is None or c["favorite"] == favorite)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_contact(ctx: Ctx, contact_id: int) -> dict[str, Any]:
    """Shows a contact.

    Args:
      contact_id: the contact's id.
    Returns: the contact.
    """
    return ctx.get("contacts", contact_id, "contact")


@app.api()
def create_contact(
    ctx: Ctx,
    first_name: str,
    last_name: str,
    phone_number: str,
    email: str | None = None,
    relationship: Relationship = "Other",
    birthday: str | None = None,
) -> dict[str, Any]:
    """Adds a contact.

    Args:
      first_name: first name.
      last_name: last name.
      phone_number: digits only, 10 digits.
      email: email address.
      relationship: the relationship.
      birthday: YYYY-MM-DD.
    Returns: the new contact.
    """
    if not (phone_number.isdigit() and len(phone_number) == 10):
        raise ApiError(422, "phone_number must be 10 digits.")
    c = {
        "id": ctx.new_id("contacts"),
        "first_name": first_name,
        "last_name": last_name,
        "email": email,
        "phone_number": phone_number,
        "relationship": relationship,
        "birthday": birthday,
        "favorite": False,
    }
    ctx.db["contacts"].append(c)
    return c


@app.api()
def update_contact(
    ctx: Ctx,
    contact_id: int,
    phone_number: str | None = None,
    email: str | None = None,
    relationship: Relationship | None = None,
    birthday: str | None = None,
    favorite: bool | None = None,
) -> dict[str, Any]:
    """Edits a contact (fields left out stay as they are).

    Args:
      contact_id: the contact's id.
      phone_number: 10 digits.
      email: email address.
      relationship: the relationship.
      birthday: YYYY-MM-DD.
      favorite: mark or unmark as favorite.
    Returns: the contact.
    """
    c = ctx.get("contacts", contact_id, "contact")
    if phone_number is not None and not (phone_number.isdigit() and len(phone_number) == 10):
        raise ApiError(422, "phone_number must be 10 digits.")
    for k, v in (
        ("phone_number", phone_number),
        ("email", email),
        ("relationship", relationship),
        ("birthday", birthday),
        ("favorite", favorite),
    ):
        if v is not None:
            c[k] = v
    return c


@app.api()
def delete_contact(ctx: Ctx, contact_id: int) -> dict[str, str]:
    """Deletes a contact.

    Args:
      contact_id: the contact's id.
    Returns: {"message"}.
    """
    ctx.db["contacts"].remove(ctx.get("contacts", contact_id, "contact"))
    return {"message": "Contact deleted."}
