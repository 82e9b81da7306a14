"""APIs every app has (login, logout, show_account) and shared helpers for app modules."""

from __future__ import annotations

from typing import Any

from ..world import App, Ctx


def add_account_apis(app: App) -> App:
    """Registers login / logout / show_account on `app`."""

    def login(ctx: Ctx, username: str, password: str) -> dict[str, str]:
        """Logs in to the app and returns an access token.

        Args:
          username: your account email (apis.supervisor.show_profile()["email"]).
          password: the app's password (apis.supervisor.show_account_passwords()).
        Returns: {"access_token": str, "token_type": "Bearer"}. Pass the token as the FIRST POSITIONAL
          argument of this app's other APIs.
        """
        return ctx.world.login(ctx.app, username, password)

    def logout(ctx: Ctx) -> dict[str, str]:
        """Invalidates the access token.

        Returns: {"message": str}.
        """
        for tok, (app_name, _) in list(ctx.world.tokens.items()):
            if app_name == ctx.app:
                del ctx.world.tokens[tok]
        return {"message": "Logged out."}

    def show_account(ctx: Ctx) -> dict[str, Any]:
        """Shows the logged-in account.

        Returns: {"email", "first_name", "last_name"}.
        """
        prof = ctx.world.db["supervisor"]["profile"][0]
        return {k: prof[k] for k in ("email", "first_name", "last_name")}

    app.api(auth="none")(login)
    app.api()(logout)
    app.api()(show_account)
    return app


def match(value: Any, wanted: Any) -> bool:
    """Exact-match filter (None = no filter). Filters are exact and case-sensitive, as documented."""
    return wanted is None or value == wanted


def contains(text: str, query: str | None) -> bool:
    """Case-insensitive substring query (None or "" = everything)."""
    return not query or query.lower() in text.lower()


def pick(record: dict, keys: tuple[str, ...]) -> dict:
    return {k: record[k] for k in keys}
