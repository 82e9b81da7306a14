"""Recipes app (held out for evaluation): recipes, saved recipes, a meal plan and a shopping list."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import ApiError, App, Ctx, page
from .common import add_account_apis, contains

CUISINES = ("Italian", "Mexican", "Indian", "Japanese", "Greek", "Thai")
MEALS = ("Breakfast", "Lunch", "Dinner")
DISHES = ["Pasta", "Tacos", "Curry", "Ramen", "Salad", "Soup", "Omelette", "Stir Fry", "Risotto", "Bowl", "Pancakes"]
ADJ = ["Spicy", "Quick", "Creamy", "Herby", "Smoky", "Lemon", "Garlic", "Classic", "Green", "Crispy"]
INGREDIENTS = [
    "rice",
    "eggs",
    "tomatoes",
    "onion",
    "garlic",
    "basil",
    "chicken",
    "tofu",
    "lime",
    "cheese",
    "beans",
    "spinach",
    "ginger",
    "noodles",
    "yogurt",
    "flour",
    "milk",
    "peppers",
]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"recipes/{seed}")
    recipes, titles = [], set()
    for i in range(ri(rng, 30, 45)):
        t = f"{ch(rng, ADJ)} {ch(rng, DISHES)}"
        while t in titles:
            t = f"{ch(rng, ADJ)} {t}"
        titles.add(t)
        recipes.append(
            {
                "id": i + 1,
                "title": t,
                "cuisine": ch(rng, CUISINES),
                "meal_type": ch(rng, MEALS),
                "minutes": ch(rng, [10, 15, 20, 30, 45, 60, 90]),
                "ingredients": sorted(rng.sample(INGREDIENTS, ri(rng, 3, 6))),
                "rating": round(rng.uniform(3, 5), 1),
            }
        )
    saved = [{"id": i + 1, "recipe_id": r["id"]} for i, r in enumerate(rng.sample(recipes, 3))]
    plan = [{"id": 1, "recipe_id": ch(rng, recipes)["id"], "date": data.date(rng, 1, 6), "meal": "Dinner"}]
    shopping = [{"id": i + 1, "item": it, "checked": False} for i, it in enumerate(rng.sample(INGREDIENTS, 3))]
    return {"recipes": recipes, "saved": saved, "meal_plan": plan, "shopping_list": shopping}


app = add_account_apis(
    App(
        "recipes",
        "Recipes: search by cuisine, meal type and time; save recipes, plan meals by date and keep a shopping list.",
        build,
    )
)


@app.api()
def search_recipes(
    ctx: Ctx,
    query: str = "",
    cuisine: str | None = None,
    meal_type: str | None = None,
    max_minutes: int | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches recipes, by id. Filters are exact and case-sensitive.

    Args:
      query: case-insensitive text in the title ("" = all).
      cuisine: one of Italian, Mexican, Indian, Japanese, Greek, Thai.
      meal_type: one of Breakfast, Lunch, Dinner.
      max_minutes: only recipes that take at most this long.
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of recipes {"id", "title", "cuisine", "meal_type", "minutes", "ingredients", "rating"}.
    """
    hits = [
        r
        for r in ctx.db["recipes"]
        if contains(r["title"], query)
        and (cuisine is None or r["cuisine"] == cuisine)
        and (meal_type is None or r["meal_type"] == meal_type)
        and (max_minutes is None or r["minutes"] <= max_minutes)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_recipe(ctx: Ctx, recipe_id: int) -> dict[str, Any]:
    """Shows a recipe.

    Args:
      recipe_id: the recipe's id.
    Returns: the recipe.
    """
    return ctx.get("recipes", recipe_id, "recipe")


@app.api()
def save_recipe(ctx: Ctx, recipe_id: int) -> dict[str, str]:
    """Saves a recipe to your collection.

    Args:
      recipe_id: the recipe's id.
    Returns: {"message"}.
    """
    ctx.get("recipes", recipe_id, "recipe")
    if any(s["recipe_id"] == recipe_id for s in ctx.db["saved"]):
        raise ApiError(409, "Already saved.")
    ctx.db["saved"].append({"id": ctx.new_id("saved"), "recipe_id": recipe_id})
    return {"message": "Saved."}


@app.api()
def unsave_recipe(ctx: Ctx, recipe_id: int) -> dict[str, str]:
    """Removes a recipe from your collection.

    Args:
      recipe_id: the recipe's id.
    Returns: {"message"}.
    """
    hit = [s for s in ctx.db["saved"] if s["recipe_id"] == recipe_id]
    if not hit:
        raise ApiError(404, "Not saved.")
    ctx.db["saved"].remove(hit[0])
    return {"message": "Removed."}


@app.api()
def show_saved_recipes(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows your saved recipes.

    Returns: a list of recipes.
    """
    return [ctx.get("recipes", s["recipe_id"], "recipe") for s in ctx.db["saved"]]


@app.api()
def show_meal_plan(ctx: Ctx, start_date: str | None = None, end_date: str | None = None) -> list[dict[str, Any]]:
    """Shows your meal plan entries by date.

    Args:
      start_date: only entries on or after this date.
      end_date: only entries on or before this date.
    Returns: a list of {"id", "recipe_id", "date", "meal"}.
    """
    return [
        e
        for e in sorted(ctx.db["meal_plan"], key=lambda e: (e["date"], e["id"]))
        if (start_date is None or e["date"] >= start_date) and (end_date is None or e["date"] <= end_date)
    ]


@app.api()
def add_to_meal_plan(ctx: Ctx, recipe_id: int, date: str, meal: str) -> dict[str, Any]:
    """Plans a recipe for a meal on a date.

    Args:
      recipe_id: the recipe's id.
      date: YYYY-MM-DD.
      meal: the Meal enum value: Breakfast, Lunch or Dinner.
    Returns: the meal plan entry.
    """
    ctx.get("recipes", recipe_id, "recipe")
    e = {"id": ctx.new_id("meal_plan"), "recipe_id": recipe_id, "date": date, "meal": meal}
    ctx.db["meal_plan"].append(e)
    return e


@app.api()
def remove_from_meal_plan(ctx: Ctx, entry_id: int) -> dict[str, str]:
    """Removes a meal plan entry.

    Args:
      entry_id: the entry's id.
    Returns: {"message"}.
    """
    ctx.db["meal_plan"].remove(ctx.get("meal_plan", entry_id, "meal plan entry"))
    return {"message": "Removed."}


@app.api()
def show_shopping_list(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows your shopping list.

    Returns: a list of {"id", "item", "checked"}.
    """
    return ctx.db["shopping_list"]


@app.api()
def add_shopping_item(ctx: Ctx, item: str) -> dict[str, Any]:
    """Adds an item to the shopping list.

    Args:
      item: the item, e.g. "eggs".
    Returns: the entry.
    """
    if any(s["item"] == item for s in ctx.db["shopping_list"]):
        raise ApiError(409, f"{item!r} is already on the list.")
    e = {"id": ctx.new_id("shopping_list"), "item": item, "checked": False}
    ctx.db["shopping_list"].append(e)
    return e


@app.api()
def check_shopping_item(ctx: Ctx, item_id: int, checked: bool = True) -> dict[str, Any]:
    """Checks off (or un-checks) a shopping list item.

    Args:
      item_id: the entry's id.
      checked: the new state.
    Returns: the entry.
    """
    e = ctx.get("shopping_list", item_id, "shopping list item")
    e["checked"] = checked
    return e


@app.api()
def remove_shopping_item(ctx: Ctx, item_id: int) -> dict[str, str]:
    """Removes an item from the shopping list.

    Args:
      item_id: the entry's id.
    Returns: {"message"}.
    """
    ctx.db["shopping_list"].remove(ctx.get("shopping_list", item_id, "shopping list item"))
    return {"message": "Removed."}
