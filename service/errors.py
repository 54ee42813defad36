"""Every error leaves the service in OpenAI's shape:
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``,
except on Anthropic's routes (``/v1/messages...``, and ``/v1/models...`` asked with
Anthropic's ``anthropic-version`` header), which answer in Anthropic's:
``{"type": "error", "error": {"type": str, "message": str}}`` with the same status codes.
Engine errors, request validation errors (400, never 422) and HTTP errors are all mapped
here, in one place."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from engine.request import (
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    QueueFullError,
)

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
          408: "timeout_error", 429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    """``counted``: the engine counted this request already (its refusal, said again in
    the API's words, or how it ended after it ran): the service's refusal counter skips
    it. Keep it when an error is renamed for another API."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 counted: bool = False, details: dict[str, object] | None = None,
                 query: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code, self.headers, self.counted = code, headers or {}, counted
        self.details = details  # Anthropic's error.details (its SDK acts on some)
        self.query = query  # param names a query parameter: kept as sent, not dotted

    def body(self) -> dict[str, object]:
        return error_body(self.status, self.message, self.param, self.code,
                          dot=not self.query)


_INDEX = re.compile(r"\[(\d+)\]")


def dotted(param: str | None) -> str | None:
    """A field path in the one form every ``param`` has, schema errors' and the server's
    own alike: ``messages[0].content[1]`` -> ``messages.0.content.1`` (messages keep
    brackets: they are read, not parsed)."""
    return None if param is None else _INDEX.sub(r".\1", param)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None, dot: bool = True) -> dict[str, object]:
    """OpenAI's error shape; ``dot`` False keeps ``param`` as given (a query
    parameter's name, ``tags[0]``)."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind,
                      "param": dotted(param) if dot else param, "code": code}}


# Anthropic's error types by status (its SDK raises its own exception class per status)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                    408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error"}
ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_error_body(status: int, message: str,
                         details: dict[str, object] | None = None) -> dict[str, object]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500
                                else "invalid_request_error")
    error: dict[str, object] = {"type": kind, "message": message}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error}


MODELS_PREFIX = "/v1/models"  # both APIs': Anthropic's clients send anthropic-version


def speaks_anthropic(request: Request) -> bool:
    """Whether the request is Anthropic's: a Messages route, or the model list / a model
    asked for with Anthropic's ``anthropic-version`` header."""
    path = request.url.path
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return True
    models = path == MODELS_PREFIX or path.startswith(MODELS_PREFIX + "/")
    return models and "anthropic-version" in request.headers


def body_for(anthropic: bool, status: int, message: str, param: str | None = None,
             code: str | None = None, details: dict[str, object] | None = None,
             dot: bool = True) -> dict[str, object]:
    """The error body in OpenAI's shape, or Anthropic's (which has no param: its message
    starts with it; ``details``: its error.details)."""
    if anthropic:
        if param and not message.startswith(param):
            message = f"{param}: {message}"
        return anthropic_error_body(status, message, details)
    return error_body(status, message, param, code, dot)


def routed(scope: Scope) -> bool:
    """Whether a route of the app serves this path and method: a request to none (a
    scanner's /favicon.ico) is no API request, and a refusal of it is not counted."""
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes is None:
        return True
    return any(route.matches(scope)[0] == Match.FULL for route in routes)


def count_refusal(app: Any, status: int) -> None:
    """``fp8serve_requests_rejected_total{reason="http_<status>"}`` for a request the
    service refused (4xx but 408) before the engine saw it; the engine counts its own."""
    metrics = getattr(getattr(getattr(app, "state", None), "serving", None), "metrics", None)
    if metrics is not None and 400 <= status < 500 and status != 408:
        metrics.on_rejected(f"http_{status}")


def reply(request: Request, status: int, message: str, param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None,
           counted: bool = False, details: dict[str, object] | None = None,
           dot: bool = True) -> JSONResponse:
    if not counted:
        count_refusal(request.app, status)
    return JSONResponse(body_for(speaks_anthropic(request), status, message, param, code,
                                 details, dot), status, headers=headers)


def from_engine_error(exc: EngineError) -> APIError:
    """The engine's refusal in the API's words (counted: the engine counted it)."""
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), exc.param, counted=True)
    if isinstance(exc, QueueFullError):
        return APIError(429, f"server busy: {exc}; retry later", code="queue_full",
                        headers={"Retry-After": "1"}, counted=True)
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, f"server unavailable: {exc}", code=exc.state, counted=True)
    return APIError(500, str(exc), counted=True)


# pydantic's names of a union's branches in an error's loc: a type ("str",
# "list[constrained-int]", "literal['a','b']", "list[tagged-union[TextBlock,...]]") or a
# model class ("NamedToolChoice"); after a tagged union, the tag value (a block's "type")
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|dict|list|none|[a-z-]+\[.*\]|"
                           r"constrained-\w+|[A-Z][A-Za-z0-9]*)$")


def _loc_param(loc: tuple, body: Any = None) -> str | None:
    """The request field an error's loc names, pydantic's union branches and tagged-union
    tags left out: ``messages.0.content.0.text``, not
    ``messages.0.content.list[tagged-union[...]].0.text.text``; with the request ``body``,
    also the tags pydantic puts bare (an optional tagged union's:
    ``response_format.json_schema.name``, not ``response_format.json_schema.json_schema
    .name``)."""
    parts: list[Any] = []
    tag_next = tag_after_index = False
    for p in loc:
        if p in ("body", "query", "path", "header"):
            continue
        if isinstance(p, str) and _UNION_BRANCH.match(p):
            if "tagged-union[" in p:  # its tag follows, or follows the list's index
                tag_after_index = p.startswith(("list[", "dict["))
                tag_next = not tag_after_index
            continue
        if tag_next and isinstance(p, str):
            tag_next = False
            continue
        parts.append(p)
        if tag_after_index:
            tag_after_index, tag_next = False, True
    if body is not None:
        parts = _without_tags(parts, body)
    return ".".join(map(str, parts)) or None


def _without_tags(parts: list[Any], body: Any) -> list[Any]:
    """``parts`` read against ``body``: a key or index of the value reached is a step into
    it (tried first), a part equal to that value's "type" (not the last part: a tag names
    the branch of a field that follows) is a tag, left out; the last part may name a field
    the body lacks. ``parts`` as they are when no reading fits."""
    def walk(i: int, node: Any) -> list[Any] | None:
        if i == len(parts):
            return []
        p, last = parts[i], i == len(parts) - 1
        child = _MISSING
        if isinstance(node, dict) and isinstance(p, str) and p in node:
            child = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            child = node[p]
        if child is not _MISSING and (rest := walk(i + 1, child)) is not None:
            return [p, *rest]
        if (not last and isinstance(node, dict) and isinstance(p, str)
                and node.get("type") == p and (rest := walk(i + 1, node)) is not None):
            return rest
        return [p] if last else None

    got = walk(0, body)
    return parts if got is None else got


_MISSING = object()


def _telling_error(errors: list[dict]) -> dict:
    """The error to report: for a value no branch of a union takes, the one that got
    furthest into the value (the branch it was meant for), a broken constraint before a
    wrong type among those; else the first."""
    if not errors:
        return {}
    first = errors[0]
    if not any(isinstance(p, str) and _UNION_BRANCH.match(p) for p in first.get("loc", ())):
        return first
    depth = max(len(e.get("loc", ())) for e in errors)
    deepest = [e for e in errors if len(e.get("loc", ())) == depth]
    return next((e for e in deepest if not str(e.get("type", "")).endswith("_type")),
                deepest[0])


def not_json_message(why: object, at: object) -> str:
    """The 400's message for a body that is not JSON: what the parser says, and where."""
    return f"the request body is not valid JSON: {why} at character {at}"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return reply(request, exc.status, exc.message, exc.param, exc.code, exc.headers,
                      exc.counted, exc.details, not exc.query)

    @app.exception_handler(EngineError)
    async def _engine(request: Request, exc: EngineError) -> JSONResponse:
        err = from_engine_error(exc)
        return reply(request, err.status, err.message, err.param, err.code, err.headers,
                      counted=True)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = _telling_error(list(exc.errors()))
        if first.get("type") == "json_invalid":  # loc: ("body", character offset)
            at = first.get("loc", ("body", "?"))[-1]
            why = (first.get("ctx") or {}).get("error", "JSON decode error")
            return reply(request, 400, not_json_message(why, at))
        if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
            # no body at all (curl without -d): what the parser says of an empty text,
            # not "Field required" naming nothing
            return reply(request, 400, not_json_message("Expecting value", 0))
        param = _loc_param(tuple(first.get("loc", ())), exc.body)
        msg = first.get("msg", "invalid request")
        return reply(request, 400, f"{param}: {msg}" if param else msg, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the router's own 404 / 405: a path or method no route serves (scanners,
        # /favicon.ico) is no API request, so no refusal is counted for it; any other
        # status (FastAPI's 400 for a body it cannot read: bytes that are no UTF-8) is
        # a refused API request, counted
        return reply(request, exc.status_code, str(exc.detail),
                     headers=getattr(exc, "headers", None),
                     counted=exc.status_code in (404, 405))

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # JSON the parser reads (about 1000 levels) that a walk over it cannot: a
        # request's doing, as its nesting is (service/rejections.py NESTING)
        return reply(request, 400, "the request body nests deeper than this server reads "
                     "(keep its arrays and objects within a few hundred levels)")

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return reply(request, 500, f"internal error: {type(exc).__name__}")
