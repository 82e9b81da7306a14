"""Finance app (held out for evaluation): stocks, charts, a watchlist, a portfolio, search history and
chart preferences."""

from __future__ import annotations

import random
from typing import Any, Literal

from ..data import ch, ri
from ..world import NOW, ApiError, App, Ctx, page
from .common import add_account_apis, contains

SECTORS = ("Technology", "Energy", "Healthcare", "Finance", "Consumer", "Industrials")
COMPANIES = [
    "Apex",
    "Borealis",
    "Cobalt",
    "Dynamo",
    "Everline",
    "Fathom",
    "Granite",
    "Helix",
    "Ionic",
    "Juniper",
    "Keystone",
    "Lumen",
    "Meridian",
    "Nimbus",
    "Orchid",
    "Pinnacle",
    "Quartz",
    "Redwood",
    "Summit",
    "Tidal",
]
HORIZONS = ("1D", "1W", "1M", "6M", "1Y", "5Y")
Horizon = Literal["1D", "1W", "1M", "6M", "1Y", "5Y"]


def build(seed: int) -> dict[str, list[dict]]:
    rng = random.Random(f"finance/{seed}")
    stocks = []
    for i, c in enumerate(rng.sample(COMPANIES, 16)):
        suffix = ch(rng, ["Systems", "Energy", "Health", "Capital", "Brands", "Industries"])
        stocks.append(
            {
                "id": i + 1,
                "symbol": (c[:3] + suffix[0]).upper(),
                "name": f"{c} {suffix}",
                "sector": ch(rng, SECTORS),
                "exchange": ch(rng, ["NYSE", "NASDAQ"]),
                "price": round(rng.uniform(5, 600), 2),
                "change_pct": round(rng.uniform(-6, 6), 2),
            }
        )
    watch = [{"id": i + 1, "symbol": s["symbol"]} for i, s in enumerate(rng.sample(stocks, 3))]
    holdings = [
        {"id": i + 1, "symbol": s["symbol"], "shares": ri(rng, 1, 80)} for i, s in enumerate(rng.sample(stocks, 4))
    ]
    history = [{"id": 1, "query": ch(rng, COMPANIES).lower(), "searched_at": "2024-06-10T18:00:00"}]
    prefs = [{"id": 1, "default_chart_horizon": ch(rng, ["1D", "1M"]), "currency": "USD"}]
    return {"stocks": stocks, "watchlist": watch, "holdings": holdings, "search_history": history, "preferences": prefs}


app = add_account_apis(
    App(
        "finance",
        "Stock market app: search stocks, view charts, keep a watchlist, see your "
        "portfolio. The unified search records your search history; the ticker "
        "lookup does not.",
        build,
    )
)


def _stock(ctx: Ctx, symbol: str) -> dict[str, Any]:
    for s in ctx.db["stocks"]:
        if s["symbol"] == symbol:
            return s
    raise ApiError(404, f"No stock with symbol {symbol!r}.")


@app.api()
def search(ctx: Ctx, query: str) -> list[dict[str, Any]]:
    """Unified search over stock names and symbols; the query is recorded in your search history.

    Args:
      query: case-insensitive text.
    Returns: a list of stocks {"id", "symbol", "name", "sector", "exchange", "price", "change_pct"}.
    """
    ctx.db["search_history"].append({"id": ctx.new_id("search_history"), "query": query, "searched_at": NOW})
    return [s for s in ctx.db["stocks"] if contains(s["name"] + " " + s["symbol"], query)]


@app.api()
def search_tickers(
    ctx: Ctx,
    query: str = "",
    sector: str | None = None,
    exchange: str | None = None,
    page_index: int = 0,
    page_limit: int = 5,
) -> list[dict[str, Any]]:
    """Looks up tickers with filters (not recorded in your search history).

    Args:
      query: case-insensitive text in the name or symbol.
      sector: only this exact sector (Technology, Energy, Healthcare, Finance, Consumer, Industrials).
      exchange: only this exact exchange (NYSE, NASDAQ).
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of stocks.
    """
    hits = [
        s
        for s in ctx.db["stocks"]
        if contains(s["name"] + " " + s["symbol"], query)
        and (sector is None or s["sector"] == sector)
        and (exchange is None or s["exchange"] == exchange)
    ]
    return page(hits, page_index, page_limit)


@app.api()
def show_stock(ctx: Ctx, symbol: str) -> dict[str, Any]:
    """Shows a stock quote.

    Args:
      symbol: the ticker symbol.
    Returns: the stock.
    """
    return _stock(ctx, symbol)


@app.api()
def show_chart(ctx: Ctx, symbol: str, horizon: Horizon | None = None) -> dict[str, Any]:
    """Shows a price chart. `horizon` only changes this view (default: your saved default horizon); use
    set_default_chart_horizon to save a default.

    Args:
      symbol: the ticker symbol.
      horizon: the time span to show.
    Returns: {"symbol", "horizon", "points": [price, ...]}.
    """
    s = _stock(ctx, symbol)
    h = horizon or ctx.db["preferences"][0]["default_chart_horizon"]
    n = {"1D": 8, "1W": 7, "1M": 10, "6M": 12, "1Y": 12, "5Y": 10}[h]
    return {
        "symbol": symbol,
        "horizon": h,
        "points": [round(s["price"] * (1 + 0.01 * ((i * 7 + s["id"]) % 9 - 4)), 2) for i in range(n)],
    }


@app.api()
def set_default_chart_horizon(ctx: Ctx, horizon: Horizon) -> dict[str, Any]:
    """Saves the default chart horizon.

    Args:
      horizon: the horizon.
    Returns: the preferences.
    """
    ctx.db["preferences"][0]["default_chart_horizon"] = horizon
    return ctx.db["preferences"][0]


@app.api()
def show_preferences(ctx: Ctx) -> dict[str, Any]:
    """Shows your preferences.

    Returns: {"id", "default_chart_horizon", "currency"}.
    """
    return ctx.db["preferences"][0]


@app.api()
def show_watchlist(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows your watchlist.

    Returns: a list of stocks.
    """
    return [_stock(ctx, w["symbol"]) for w in ctx.db["watchlist"]]


@app.api()
def add_to_watchlist(ctx: Ctx, symbol: str) -> dict[str, str]:
    """Adds a stock to your watchlist.

    Args:
      symbol: the ticker symbol.
    Returns: {"message"}.
    """
    _stock(ctx, symbol)
    if any(w["symbol"] == symbol for w in ctx.db["watchlist"]):
        raise ApiError(409, f"{symbol} is already on your watchlist.")
    ctx.db["watchlist"].append({"id": ctx.new_id("watchlist"), "symbol": symbol})
    return {"message": "Added."}


@app.api()
def remove_from_watchlist(ctx: Ctx, symbol: str) -> dict[str, str]:
    """Removes a stock from your watchlist.

    Args:
      symbol: the ticker symbol.
    Returns: {"message"}.
    """
    hit = [w for w in ctx.db["watchlist"] if w["symbol"] == symbol]
    if not hit:
        raise ApiError(404, f"{symbol} is not on your watchlist.")
    ctx.db["watchlist"].remove(hit[0])
    return {"message": "Removed."}


@app.api()
def show_portfolio(ctx: Ctx) -> list[dict[str, Any]]:
    """Shows your holdings with current prices.

    Returns: a list of {"symbol", "shares", "price", "value"}.
    """
    out = []
    for h in ctx.db["holdings"]:
        p = _stock(ctx, h["symbol"])["price"]
        out.append({"symbol": h["symbol"], "shares": h["shares"], "price": p, "value": round(p * h["shares"], 2)})
    return out


@app.api()
def show_search_history(ctx: Ctx, page_index: int = 0, page_limit: int = 5) -> list[dict[str, Any]]:
    """Shows your search history, newest first.

    Args:
      page_index: the page, from 0.
      page_limit: results per page (at most 20).
    Returns: a list of {"id", "query", "searched_at"}.
    """
    return page(sorted(ctx.db["search_history"], key=lambda h: h["id"], reverse=True), page_index, page_limit)


@app.api()
def clear_search_history(ctx: Ctx) -> dict[str, str]:
    """Deletes your whole search history.

    Returns: {"message"}.
    """
    ctx.db["search_history"].clear()
    return {"message": "Search history cleared."}
