"""The supervisor: the user on whose behalf the agent acts, their passwords, and task completion."""

from __future__ import annotations

from typing import Any

from ..world import ApiError, App, Ctx

app = App(
    "supervisor",
    "The supervisor (your user): profile, account passwords for every app, and task completion. Needs no access token.",
)


@app.api(auth="none")
def show_profile(ctx: Ctx) -> dict[str, Any]:
    """Shows the supervisor's profile.

    Returns: {"first_name", "last_name", "email", "phone_number"}.
    """
    return dict(ctx.world.db["supervisor"]["profile"][0])


@app.api(auth="none")
def show_account_passwords(ctx: Ctx) -> list[dict[str, str]]:
    """Shows the supervisor's passwords for every app.

    Returns: a list of {"account_name": app name, "password": str}.
    """
    return [
        {"account_name": a["account_name"], "password": a["password"]}
        for a in ctx.world.db["supervisor"]["account_passwords"]
    ]


@app.api(auth="none")
def complete_task(ctx: Ctx, answer: str | float | list | None = None) -> dict[str, str]:
    """Marks the current task as done. Call it once, after all the work is done.

    Args:
      answer: ONLY for tasks that ask a question: the answer (a string or a number, or a list if the task
        asks for several items). Leave it out for tasks that ask no question.
    Returns: {"message": str}.
    """
    if ctx.world.completed:
        raise ApiError(409, "The task has already been completed.")
    ctx.world.completed = True
    ctx.world.answer = answer
    return {"message": "Task marked as completed."}
