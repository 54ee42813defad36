"""Request bodies that JSON can carry but no text can: a string holding a lone UTF-16
surrogate (``"\\ud800"`` without its pair). Python's JSON parser accepts one, and it then
fails wherever the string meets UTF-8 (the tokenizer, a regex, a stored conversation
item rendered into a reply). :class:`LoneSurrogateGuard` answers such a request 400
naming the field before any route runs, on every route, in the API's own error shape.

The scan costs a substring search per request body: only a body holding the escape
``\\ud8``-``\\udf`` is parsed and walked (a valid surrogate pair passes).
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import body_for, count_refusal, routed, speaks_anthropic

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate_path(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The path (keys and list indices) of the first string in ``value``, a parsed JSON
    document, that holds a lone surrogate (a key counts as its own path); None if none."""
    if isinstance(value, str):
        return None if value.isascii() or _encodable(value) else path
    if isinstance(value, dict):
        for k, v in value.items():
            if not _encodable(k):
                return (*path, k.encode("utf-8", "backslashreplace").decode())
            if (got := lone_surrogate_path(v, (*path, k))) is not None:
                return got
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (got := lone_surrogate_path(v, (*path, str(i)))) is not None:
                return got
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class LoneSurrogateGuard:
    """ASGI middleware: a JSON request body with a lone surrogate in any string is a 400
    naming that string's field (``messages.0.content``); others pass through unchanged
    (the body, read here, is handed on as one message). A body over ``max_bytes`` is a
    413 before any of it is kept (by its Content-Length, else once the bytes read pass
    it): one huge request costs neither the memory nor the event loop of the others.
    The bodies of ``unread_paths`` (routes that take none: those open without a key) are
    left unread, so that a client without a key cannot make the server hold one."""

    def __init__(self, app: ASGIApp, max_bytes: int | None = None,
                 unread_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.unread_paths = unread_paths

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        mib = (self.max_bytes or 0) / 2**20
        if routed(scope):  # a path no route serves is no API request: not counted
            count_refusal(scope.get("app"), 413)
        response = JSONResponse(body_for(
            speaks_anthropic(Request(scope)), 413,
            f"request body larger than the server's limit of {mib:g} MiB "
            "(--max-request-body-mib)"), 413, headers={"connection": "close"})
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH")
                or scope["path"] in self.unread_paths):
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if limit is not None:
            declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
            if declared.isdigit() and int(declared) > limit:
                await self._too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit is not None and size > limit:
                chunks.clear()
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if _SURROGATE_ESCAPE.search(body) and (path := _bad_path(body)) is not None:
            param = ".".join(path) or None
            text = f"{param}: " if param else ""
            if routed(scope):
                count_refusal(scope.get("app"), 400)
            response = JSONResponse(body_for(
                speaks_anthropic(Request(scope)), 400,
                f"{text}the string holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is not text", param), 400)
            await response(scope, receive, send)
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body,
                                        "more_body": False}], receive), send)


def _bad_path(body: bytes) -> tuple[str, ...] | None:
    try:
        return lone_surrogate_path(json.loads(body))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit:
        return None  # the route's own parser answers it (a 400)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that returns ``messages`` first, then the client's own (disconnects)."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
