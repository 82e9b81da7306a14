"""API documentation, generated from the registered API definitions and readable from agent code."""

from __future__ import annotations

from typing import Any

from ..world import ApiError, App, Ctx

CONVENTIONS = (
    "Call APIs as apis.<app_name>.<api_name>(...). Log in with apis.<app_name>.login(username, password) "
    "using the email from apis.supervisor.show_profile() and the password from "
    "apis.supervisor.show_account_passwords(). Every API that needs a logged-in user takes the access token "
    "as its FIRST POSITIONAL argument (e.g. apis.todo.show_lists(token, page_index=0)); passing it as "
    "access_token=... is an error. Other parameters are best passed by keyword. List/search APIs are paginated "
    "(page_index from 0, page_limit at most 20). Filters are exact and case-sensitive; enum values are "
    "case-sensitive. When done, call apis.supervisor.complete_task() -- with answer=... only if the task asks "
    "a question."
)

app = App("api_docs", "Documentation of all apps and APIs. Needs no access token. " + CONVENTIONS)


def _app(ctx: Ctx, app_name: str) -> Any:
    if app_name not in ctx.world.apps:
        raise ApiError(404, f"No app named {app_name!r}. Available apps: {sorted(ctx.world.apps)}.")
    return ctx.world.apps[app_name]


@app.api(auth="none")
def show_app_descriptions(ctx: Ctx) -> dict[str, Any]:
    """Lists the available apps with short descriptions, and the calling conventions.

    Returns: {"conventions": str, "apps": [{"name", "description"}]}.
    """
    return {
        "conventions": CONVENTIONS,
        "apps": [{"name": a.name, "description": a.description} for a in ctx.world.apps.values()],
    }


@app.api(auth="none")
def show_api_descriptions(ctx: Ctx, app_name: str) -> list[dict[str, str]]:
    """Lists the APIs of an app with one-line descriptions.

    Args:
      app_name: the app's name, e.g. "todo".
    Returns: a list of {"name", "description"}.
    """
    return [{"name": s.name, "description": s.description} for s in _app(ctx, app_name).apis.values()]


@app.api(auth="none")
def show_api_doc(ctx: Ctx, app_name: str, api_name: str) -> dict[str, Any]:
    """Shows the full documentation of one API: signature, parameters, types, constraints and return value.

    Args:
      app_name: the app's name.
      api_name: the API's name.
    Returns: {"app_name", "api_name", "signature", "description", "parameters", "returns"}.
    """
    a = _app(ctx, app_name)
    if api_name not in a.apis:
        raise ApiError(404, f"No API named {api_name!r} in app {app_name!r}.")
    return a.apis[api_name].doc()


@app.api(auth="none")
def search_api_docs(ctx: Ctx, query: str, app_name: str | None = None) -> list[dict[str, str]]:
    """Searches API names and descriptions (case-insensitive substring match on every word of the query).

    Args:
      query: words to look for.
      app_name: restrict to one app.
    Returns: a list of {"app_name", "name", "description"}.
    """
    words = query.lower().split()
    out = []
    for a in ctx.world.apps.values():
        if app_name is not None and a.name != app_name:
            continue
        for s in a.apis.values():
            text = f"{s.name} {s.description}".lower().replace("_", " ")
            if all(w in text or w in s.name for w in words):
                out.append({"app_name": a.name, "name": s.name, "description": s.description})
    return out
