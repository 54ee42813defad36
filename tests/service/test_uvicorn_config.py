"""The server's uvicorn config resolves to uvloop and httptools (dependencies), not the
pure-Python asyncio loop and h11 parser, and carries the settings' address."""

from __future__ import annotations

import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cli.main import build_parser
from cli.serve import settings_from_args
from cli.serve_server import END_GRACE_S, uvicorn_config


async def _app(scope, receive, send) -> None:  # pragma: no cover - never called
    raise AssertionError


def test_server_uses_uvloop_and_httptools() -> None:
    settings = settings_from_args(build_parser().parse_args(
        ["serve", "--port", "8123", "--drain-timeout", "5"]))
    config = uvicorn_config(_app, settings)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
    assert config.get_loop_factory() is uvloop.new_event_loop
    # the drain waits --drain-timeout itself; uvicorn only lets the last answers out
    assert (config.port, config.timeout_graceful_shutdown) == (8123, END_GRACE_S)
    assert config.access_log


def test_disable_uvicorn_access_log() -> None:
    settings = settings_from_args(build_parser().parse_args(
        ["serve", "--disable-uvicorn-access-log", "--disable-log-requests"]))
    assert not uvicorn_config(_app, settings).access_log
