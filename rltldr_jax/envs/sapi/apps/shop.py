"""Online shop: products, cart, saved-for-later items and orders. Cart and saved-for-later APIs also work
without an access token, on an anonymous guest session that is not your account."""

from __future__ import annotations

import random
from typing import Any

from .. import data
from ..data import ch, ri
from ..world import NOW, ApiError, App, Ctx, page
from .common import add_account_apis, contains

CATEGORIES = {
    "Shoes": ["Runner", "Trail Shoe", "Sneaker", "Hiking Boot", "Sandal"],
    "Electronics": ["Headphones", "Charger", "Speaker", "Smartwatch", "Keyboard"],
    "Kitchen": ["Kettle", "Blender", "Pan", "Knife Set", "Coffee Grinder"],
    "Outdoor": ["Tent", "Backpack", "Sleeping Bag", "Headlamp", "Water Bottle"],
    "Books": ["Cookbook", "Novel", "Field Guide", "Atlas", "Biography"],
}
_CATS = tuple(CATEGORIES)
BRANDS = ["Nike", "Acme", "Northpeak", "Sonic", "Homely", "Brightline", "Terra"]
TAGS = ["running", "waterproof", "wireless", "eco", "bestseller", "lightweight", "sale"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"shop/{seed}")
    products, names = [], set()
    for i in range(ri(rng, 32, 48)):
        cat = ch(rng, _CATS)
        brand = ch(rng, BRANDS)
        name = f"{brand} {ch(rng, ['Pro', 'Lite', 'Max', 'Classic', 'Air', 'Go', 'X'])} {ch(rng, CATEGORIES[cat])}"
        while name in names:
            name += " II"
        names.add(name)
        products.append(
            {
                "id": i + 1,
                "name": name,
                "category": cat,
                "brand": brand,
                "price": round(rng.uniform(8, 250), 2),
                "tags": sorted(rng.sample(TAGS, ri(rng, 0, 3))),
                "rating": round(rng.uniform(2.5, 5.0), 1),
                "in_stock": rng.random() < 0.9,
            }
        )
    orders = []
    for i in range(ri(rng, 8, 16)):
        items = [
            {"product_id": p["id"], "quantity": ri(rng, 1, 3), "price": p["price"]}
            for p in rng.sample(products, ri(rng, 1, 3))
        ]
        orders.append(
            {
                "id": i + 1,
                "items": items,
                "total": round(sum(x["quantity"] * x["price"] for x in items), 2),
                "status": ch(rng, ["delivered", "delivered", "shipped", "processing", "cancelled"]),
                "placed_at": data.date(rng, -120, -1) + "T10:00:00",
            }
        )
    cart = [{"id": i + 1, "product_id": p["id"], "quantity": 1} for i, p in enumerate(rng.sample(products, 2))]
    saved = [{"id": 1, "product_id": ch(rng, products)["id"], "note": ""}]
    return {
        "products": products,
        "cart": cart,
        "saved_for_later": saved,
        "orders": orders,
        "guest_cart": [],
        "guest_saved_for_later": [],
    }


app = add_account_apis(
    App(
        "shop",
        "An online shop: search products, manage the cart and saved-for-later list, "
        "place and cancel orders. Cart and saved-for-later APIs take an OPTIONAL access "
        "token: without it they use an anonymous guest session, not your account.",
        build,
    )
)


def _t(ctx: Ctx, table: str) -> list[dict]:
    return ctx.db[table if ctx.user else "guest_" + table]


@app.api()
def search_products(
    ctx: Ctx,
    query: str = "",
    category: str | None = None,
    brand: str | None = None,
    tag: str | None = None,
    min_price: float | None = None,
    max_price: float | None = None,
    in_stock: bool | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Searches products, by id.

    Args:
      query: case-insensitive text in the product name ("" = all).
      category: only this exact category (Shoes, Electronics, Kitchen, Outdoor, Books).
      brand: only this exact brand.
      tag: only products with this exact tag.
      min_price: only products with price >= min_price.
      max_price: only products with price <= max_price.
      in_stock: only products in stock (True) or out of stock (False).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of products {"id", "name", "category", "brand", "price", "tags", "rating", "in_stock"}.
    """
    hits = [
        p
        for p in ctx.db["products"]
        if contains(p["name"], query)
        and (category is None or p["category"] == category)
        and (brand is None or p["brand"] == brand)
        and (tag is None or tag in p["tags"])
        and (min_price is None or p["price"] >= min_price)
        and (max_price is None or p["price"] <= max_price)
        and (in_stock is None or p["in_stock"] == in_stock)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_product(ctx: Ctx, product_id: int) -> dict[str, Any]:
    """Shows a product.

    Args:
      product_id: the product's id.
    Returns: the product.
    """
    return ctx.get("products", product_id, "product")


@app.api(auth="optional")
def show_cart(ctx: Ctx) -> dict[str, Any]:
    """Shows the cart (your account's cart with a token, the guest cart without).

    Returns: {"items": [{"id", "product_id", "name", "quantity", "price"}], "total"}.
    """
    items = [
        dict(
            c,
            name=ctx.get("products", c["product_id"], "product")["name"],
            price=ctx.get("products", c["product_id"], "product")["price"],
        )
        for c in _t(ctx, "cart")
    ]
    return {"items": items, "total": round(sum(i["price"] * i["quantity"] for i in items), 2)}


@app.api(auth="optional")
def add_to_cart(ctx: Ctx, product_id: int, quantity: int = 1) -> dict[str, Any]:
    """Adds a product to the cart (adds to the quantity if it is already there).

    Args:
      product_id: the product's id.
      quantity: how many (>= 1).
    Returns: the cart item.
    """
    p = ctx.get("products", product_id, "product")
    if quantity < 1:
        raise ApiError(422, "quantity must be >= 1.")
    if not p["in_stock"]:
        raise ApiError(409, f"Product {product_id} is out of stock.")
    cart = _t(ctx, "cart")
    for c in cart:
        if c["product_id"] == product_id:
            c["quantity"] += quantity
            return c
    item = {"id": max((c["id"] for c in cart), default=0) + 1, "product_id": product_id, "quantity": quantity}
    cart.append(item)
    return item


@app.api(auth="optional")
def update_cart_item(ctx: Ctx, product_id: int, quantity: int) -> dict[str, Any]:
    """Sets the quantity of a product in the cart.

    Args:
      product_id: the product's id.
      quantity: the new quantity (>= 1; use remove_from_cart to remove).
    Returns: the cart item.
    """
    if quantity < 1:
        raise ApiError(422, "quantity must be >= 1.")
    for c in _t(ctx, "cart"):
        if c["product_id"] == product_id:
            c["quantity"] = quantity
            return c
    raise ApiError(404, f"Product {product_id} is not in the cart.")


@app.api(auth="optional")
def remove_from_cart(ctx: Ctx, product_id: int) -> dict[str, str]:
    """Removes a product from the cart.

    Args:
      product_id: the product's id.
    Returns: {"message"}.
    """
    cart = _t(ctx, "cart")
    hit = [c for c in cart if c["product_id"] == product_id]
    if not hit:
        raise ApiError(404, f"Product {product_id} is not in the cart.")
    cart.remove(hit[0])
    return {"message": "Removed from cart."}


@app.api(auth="optional")
def save_for_later(ctx: Ctx, product_id: int, note: str = "") -> dict[str, str]:
    """Saves a product for later, with an optional note.

    Args:
      product_id: the product's id.
      note: a note to keep with it.
    Returns: {"message"}.
    """
    ctx.get("products", product_id, "product")
    saved = _t(ctx, "saved_for_later")
    if any(s["product_id"] == product_id for s in saved):
        raise ApiError(409, "The product is already saved for later.")
    saved.append({"id": max((s["id"] for s in saved), default=0) + 1, "product_id": product_id, "note": note})
    return {"message": "Saved for later."}


@app.api(auth="optional")
def show_saved_for_later(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows the saved-for-later list.

    Returns: a list of {"id", "product_id", "note"}.
    """
    return _t(ctx, "saved_for_later")


@app.api(auth="optional")
def remove_saved_for_later(ctx: Ctx, product_id: int) -> dict[str, str]:
    """Removes a product from the saved-for-later list.

    Args:
      product_id: the product's id.
    Returns: {"message"}.
    """
    saved = _t(ctx, "saved_for_later")
    hit = [s for s in saved if s["product_id"] == product_id]
    if not hit:
        raise ApiError(404, "The product is not saved for later.")
    saved.remove(hit[0])
    return {"message": "Removed."}


@app.api()
def show_orders(ctx: Ctx, status: str | None = None, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Lists your orders, newest first.

    Args:
      status: only orders with this exact status (processing, shipped, delivered, cancelled).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of orders {"id", "items", "total", "status", "placed_at"}.
    """
    hits = [
        o
        for o in sorted(ctx.db["orders"], key=lambda o: o["placed_at"], reverse=True)
        if status is None or o["status"] == status
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_order(ctx: Ctx, order_id: int) -> dict[str, Any]:
    """Shows an order.

    Args:
      order_id: the order's id.
    Returns: the order.
    """
    return ctx.get("orders", order_id, "order")


@app.api()
def place_order(ctx: Ctx) -> dict[str, Any]:
    """Orders everything in your cart and empties the cart.

    Returns: the new order.
    """
    if not ctx.db["cart"]:
        raise ApiError(409, "The cart is empty.")
    items = []
    for c in ctx.db["cart"]:
        p = ctx.get("products", c["product_id"], "product")
        items.append({"product_id": p["id"], "quantity": c["quantity"], "price": p["price"]})
    order = {
        "id": ctx.new_id("orders"),
        "items": items,
        "total": round(sum(x["quantity"] * x["price"] for x in items), 2),
        "status": "processing",
        "placed_at": NOW,
    }
    ctx.db["orders"].append(order)
    ctx.db["cart"].clear()
    return order


@app.api()
def cancel_order(ctx: Ctx, order_id: int) -> dict[str, Any]:
    """Cancels an order that is still processing.

    Args:
      order_id: the order's id.
    Returns: the order.
    """
    o = ctx.get("orders", order_id, "order")
    if o["status"] != "processing":
        raise ApiError(409, f"Only processing orders can be cancelled; this one is {o['status']}.")
    o["status"] = "cancelled"
    return o
