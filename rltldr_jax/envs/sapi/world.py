"""The SAPI world: API registry, strict argument validation, the in-memory database and the call log.

An app is a set of API functions registered with `App.api`. Each function takes a `Ctx` first and its API
parameters as keyword arguments; its type hints and docstring define the parameter schema and the docs that
`apis.api_docs` shows, so validation and documentation cannot drift apart.

Calling convention (documented to the agent in `api_docs.show_app_descriptions()`):
  * APIs that need a logged-in user take the access token as their FIRST POSITIONAL argument
    (`apis.todo.show_lists(token, page_index=0)`); passing it as `access_token=...` is an error.
  * A few shop APIs accept an optional token ("guest mode"): without one they act on an anonymous guest
    session, which is NOT the supervisor's account.
  * Every other parameter may be passed by keyword (recommended) or positionally in documented order.
  * Unknown parameters, wrong types and enum values outside the listed (case-sensitive) values are rejected
    with `Response status code is 422: ...`.

The database is `{app: {table: [record, ...]}}` of plain JSON-able values, so it deep-copies and diffs cheaply.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

NOW = "2024-06-14T09:30:00"  # the world's frozen clock (a Friday)
TODAY = NOW[:10]
MAX_PAGE_LIMIT = 20


class ApiError(Exception):
    """An API failure, shown to the agent AppWorld-style: `Response status code is 422:\\n{"message": ...}`."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        super().__init__(f"Response status code is {status}:\n" + json.dumps({"message": message}))


@dataclasses.dataclass(frozen=True)
class Param:
    """One API parameter: `kind` is str/int/float/bool/dict/list[str]/list[int]/enum; `choices` for enums."""

    name: str
    kind: str
    required: bool
    default: Any
    nullable: bool
    choices: tuple[Any, ...] = ()
    doc: str = ""

    def type_name(self) -> str:
        return {
            "str": "string",
            "int": "integer",
            "float": "number",
            "bool": "boolean",
            "dict": "object",
            "list[str]": "list[string]",
            "list[int]": "list[integer]",
            "enum": "enum",
            "any": "string | number | list",
        }[self.kind]


@dataclasses.dataclass(frozen=True)
class ApiSpec:
    """One API: its app, name, auth mode ("required" | "optional" | "none"), parameters and docs."""

    app: str
    name: str
    auth: str
    params: tuple[Param, ...]
    description: str
    returns: str
    fn: Callable[..., Any]

    def signature(self) -> str:
        parts = (
            ["access_token, /"]
            if self.auth == "required"
            else (["access_token=None, /"] if self.auth == "optional" else [])
        )
        for p in self.params:
            parts.append(p.name if p.required else f"{p.name}={p.default!r}")
        return f"apis.{self.app}.{self.name}({', '.join(parts)})"

    def doc(self) -> dict[str, Any]:
        """The api_docs entry (what `show_api_doc` returns)."""
        params = []
        if self.auth != "none":
            params.append(
                {
                    "name": "access_token",
                    "type": "string",
                    "required": self.auth == "required",
                    "position": "first positional argument (never a keyword argument)",
                    "description": f"Access token from apis.{self.app}.login(username, password)."
                    + (
                        " Without it the call acts on an anonymous guest session, not your account."
                        if self.auth == "optional"
                        else ""
                    ),
                }
            )
        for p in self.params:
            d: dict[str, Any] = {"name": p.name, "type": p.type_name(), "required": p.required, "description": p.doc}
            if not p.required:
                d["default"] = p.default
            if p.kind == "enum":
                d["constraints"] = f"value in {list(p.choices)} (case-sensitive)"
            params.append(d)
        return {
            "app_name": self.app,
            "api_name": self.name,
            "signature": self.signature(),
            "description": self.description,
            "parameters": params,
            "returns": self.returns,
        }


_DOC_ARG = re.compile(r"^\s{2,}(\w+):\s*(.*)$")


def _parse_doc(doc: str) -> tuple[str, dict[str, str], str]:
    """(description, {param: text}, returns) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc, args, returns, section, last = [], {}, [], "desc", None
    for line in lines:
        s = line.strip()
        if s == "Args:":
            section = "args"
        elif s.startswith("Returns:"):
            section, rest = "returns", s[len("Returns:") :].strip()
            returns += [rest] if rest else []
        elif section == "desc":
            desc.append(s)
        elif section == "args":
            m = _DOC_ARG.match(line)
            if m:
                last = m.group(1)
                args[last] = m.group(2)
            elif last and s:
                args[last] += " " + s
        elif s:
            returns.append(s)
    return " ".join(d for d in desc if d).strip(), args, " ".join(returns)


def _param_kind(tp: Any) -> tuple[str, bool, tuple[Any, ...]]:
    nullable = False
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(inner) != len(typing.get_args(tp))
        if len(inner) > 1:
            return "any", nullable, ()
        tp, origin = inner[0], typing.get_origin(inner[0])
    if origin is Literal:
        return "enum", nullable, typing.get_args(tp)
    if origin is list:
        (el,) = typing.get_args(tp)
        return f"list[{el.__name__}]", nullable, ()
    name = {str: "str", int: "int", float: "float", bool: "bool", dict: "dict"}[tp]
    return name, nullable, ()


class App:
    """A simulated app: name, description, a DB builder and its registered APIs."""

    def __init__(self, name: str, description: str, build: Callable[..., dict[str, list[dict]]] | None = None):
        self.name = name
        self.description = description
        self.build = build
        self.apis: dict[str, ApiSpec] = {}

    def api(self, auth: str = "required") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Registers `fn(ctx, **params)` as an API; the schema comes from its hints and docstring."""
        assert auth in ("required", "optional", "none")

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            hints = typing.get_type_hints(fn)
            desc, arg_docs, returns = _parse_doc(fn.__doc__ or "")
            params = []
            for name, p in list(inspect.signature(fn).parameters.items())[1:]:
                kind, nullable, choices = _param_kind(hints[name])
                required = p.default is inspect.Parameter.empty
                params.append(
                    Param(
                        name, kind, required, None if required else p.default, nullable, choices, arg_docs.get(name, "")
                    )
                )
            self.apis[fn.__name__] = ApiSpec(self.name, fn.__name__, auth, tuple(params), desc, returns, fn)
            return fn

        return deco


def page(items: list[Any], page_index: int, page_limit: int) -> list[Any]:
    """One page of `items`; validates the paging arguments."""
    if page_index < 0:
        raise ApiError(422, "page_index must be >= 0.")
    if not 1 <= page_limit <= MAX_PAGE_LIMIT:
        raise ApiError(422, f"page_limit must be between 1 and {MAX_PAGE_LIMIT}.")
    return items[page_index * page_limit : (page_index + 1) * page_limit]


@dataclasses.dataclass
class Ctx:
    """What an API function sees: the world, its app's tables and the logged-in user (None = guest)."""

    world: World
    app: str
    user: str | None

    @property
    def db(self) -> dict[str, list[dict]]:
        return self.world.db[self.app]

    def get(self, table: str, record_id: Any, what: str) -> dict:
        for r in self.db[table]:
            if r["id"] == record_id:
                return r
        raise ApiError(404, f"No {what} found with id {record_id!r}.")

    def new_id(self, table: str) -> int:
        return max((r["id"] for r in self.db[table]), default=0) + 1


def _type_ok(p: Param, v: Any) -> bool:
    if v is None:
        return p.nullable or (not p.required and p.default is None)
    if p.kind == "enum":
        return v in p.choices
    if p.kind == "any":
        return isinstance(v, (str, int, float, list)) and not isinstance(v, bool)
    if p.kind == "str":
        return isinstance(v, str)
    if p.kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if p.kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if p.kind == "bool":
        return isinstance(v, bool)
    if p.kind == "dict":
        return isinstance(v, dict)
    if p.kind == "list[str]":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if p.kind == "list[int]":
        return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    raise AssertionError(p.kind)


def _bad_value(spec: ApiSpec, p: Param, v: Any) -> ApiError:
    if p.kind == "enum":
        hint = ""
        if isinstance(v, str):
            near = [c for c in p.choices if isinstance(c, str) and c.lower() == v.lower()]
            hint = " Enum values are case-sensitive." if near else ""
        return ApiError(
            422,
            f"Invalid value {v!r} for parameter '{p.name}' of {spec.app}.{spec.name}: "
            f"must be one of {list(p.choices)}.{hint}",
        )
    return ApiError(
        422,
        f"Invalid type for parameter '{p.name}' of {spec.app}.{spec.name}: expected "
        f"{p.type_name()}{' or null' if p.nullable else ''}, got {type(v).__name__} ({v!r}).",
    )


@dataclasses.dataclass
class CallRecord:
    """One API call in the log: what was asked, and the error message if it failed."""

    app: str
    api: str
    args: list[Any]
    kwargs: dict[str, Any]
    user: str | None = None
    error: str | None = None


class World:
    """One task's world: the supervisor, the apps' database, tokens, the completion state and the call log.

    Args:
      db: {app: {table: [records]}} (taken over, not copied), including "supervisor" with its profile.
      apps: the registered apps available in this world (at least supervisor and api_docs).
    """

    def __init__(self, db: dict[str, dict[str, list[dict]]], apps: Mapping[str, App]):
        self.db = db
        self.apps = dict(apps)
        self.tokens: dict[str, tuple[str, str]] = {}  # token -> (app, user email)
        self.completed = False
        self.answer: Any = None
        self.log: list[CallRecord] = []
        self.max_calls = 2000

    def call(self, app: str, api_name: str, args: list[Any] | tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Runs one API call from agent code; raises ApiError with an informative message on any misuse."""
        rec = CallRecord(app, api_name, list(args), dict(kwargs))
        self.log.append(rec)
        try:
            out = self._call(rec)
        except ApiError as e:
            rec.error = e.message
            raise
        except Exception as e:  # noqa: BLE001 -- an argument combination an app did not anticipate: still the agent's call
            rec.error = f"internal error: {type(e).__name__}: {e}"
            raise ApiError(500, f"Internal error in {app}.{api_name}: {type(e).__name__}: {e}") from None
        return json.loads(json.dumps(out))  # what a client would get: no aliasing into the DB

    def _call(self, rec: CallRecord) -> Any:
        if len(self.log) > self.max_calls:
            raise ApiError(429, f"Too many API calls in this task (limit {self.max_calls}).")
        if rec.app not in self.apps:
            raise ApiError(
                404,
                f"No app named {rec.app!r}. Available apps: {sorted(self.apps)}. "
                "See apis.api_docs.show_app_descriptions().",
            )
        app = self.apps[rec.app]
        spec = app.apis.get(rec.api)
        if spec is None:
            raise ApiError(
                404,
                f"No API named {rec.api!r} in app {rec.app!r}. "
                f"See apis.api_docs.show_api_descriptions(app_name={rec.app!r}).",
            )
        args, kwargs = list(rec.args), dict(rec.kwargs)
        user = None
        if spec.auth != "none":
            if "access_token" in kwargs:
                raise ApiError(
                    422,
                    f"{rec.app}.{rec.api}: pass the access token as the first positional "
                    "argument, not as the keyword argument 'access_token'.",
                )
            if spec.auth == "required" and not args:
                raise ApiError(
                    401,
                    f"{rec.app}.{rec.api} requires an access token as its first positional "
                    f"argument; get one with apis.{rec.app}.login(username, password).",
                )
            if args:
                token = args.pop(0)
                owner = self.tokens.get(token) if isinstance(token, str) else None
                if owner is None or owner[0] != rec.app:
                    raise ApiError(401, f"Invalid or expired access token for app {rec.app!r}: {token!r}.")
                user = owner[1]
        rec.user = user
        names = [p.name for p in spec.params]
        if len(args) > len(names):
            raise ApiError(
                422,
                f"{rec.app}.{rec.api} takes at most {len(names)} positional arguments after the "
                f"access token ({', '.join(names) or 'none'}); got {len(args)}.",
            )
        bound: dict[str, Any] = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k not in names:
                raise ApiError(422, f"Unexpected parameter {k!r} for {rec.app}.{rec.api}. Valid parameters: {names}.")
            if k in bound:
                raise ApiError(422, f"Parameter {k!r} of {rec.app}.{rec.api} was given twice.")
            bound[k] = v
        for p in spec.params:
            if p.name not in bound:
                if p.required:
                    raise ApiError(422, f"Missing required parameter {p.name!r} for {rec.app}.{rec.api}.")
                bound[p.name] = copy.deepcopy(p.default)
            elif not _type_ok(p, bound[p.name]):
                raise _bad_value(spec, p, bound[p.name])
        return spec.fn(Ctx(self, rec.app, user), **bound)

    def login(self, app: str, username: str, password: str) -> dict[str, str]:
        """Checks the supervisor's credentials for `app` and issues a token (used by each app's `login`)."""
        prof = self.db["supervisor"]["profile"][0]
        accounts = {a["account_name"]: a["password"] for a in self.db["supervisor"]["account_passwords"]}
        if username != prof["email"] or accounts.get(app) != password:
            raise ApiError(401, "Invalid credentials: wrong username or password.")
        n = len(self.tokens) + 1
        token = f"{app[:3]}-{n:03d}-" + hashlib.sha1(f"{app}/{n}/{username}".encode()).hexdigest()[:12]
        self.tokens[token] = (app, username)
        return {"access_token": token, "token_type": "Bearer"}

    def snapshot(self) -> dict[str, dict[str, list[dict]]]:
        return copy.deepcopy(self.db)


def diff(
    before: Mapping[str, Mapping[str, list[dict]]], after: Mapping[str, Mapping[str, list[dict]]]
) -> dict[str, dict[str, list[Any]]]:
    """Record-level changes per "app.table": {"added": [rec], "removed": [rec], "changed": [(old, new)]}."""
    out: dict[str, dict[str, list[Any]]] = {}
    for app in sorted(set(before) | set(after)):
        b_app, a_app = before.get(app, {}), after.get(app, {})
        for table in sorted(set(b_app) | set(a_app)):
            b = {r["id"]: r for r in b_app.get(table, [])}
            a = {r["id"]: r for r in a_app.get(table, [])}
            d = {
                "added": [a[i] for i in a if i not in b],
                "removed": [b[i] for i in b if i not in a],
                "changed": [(b[i], a[i]) for i in a if i in b and a[i] != b[i]],
            }
            if any(d.values()):
                out[f"{app}.{table}"] = d
    return out
