"""create_app(): the FastAPI application. Its lifespan loads the model (off the event
loop) and starts the engine thread before the server reports ready, and stops it on exit.

Tests inject a backend loader: ``create_app(settings, load_backend=lambda s: fake)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from service.backend import ADMITTED_BEFORE_DRAIN, ModelBackend, ServingState
from service.backend import load_backend as default_load_backend
from service.body_text import LoneSurrogateGuard
from service.deps import KEY_REFUSAL, key_accepted
from service.errors import install_error_handlers, reply, routed
from service.openapi import install_openapi
from service.routers import anthropic, conversations, openai, ops, responses, stored_chat
from service.settings import Settings

log = logging.getLogger(__name__)

# routes open without a key: health and liveness, metrics, the API's own docs
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/docs", "/docs/oauth2-redirect",
                        "/redoc", "/openapi.json"})


class ApiKeyGate:
    """ASGI middleware: on a server with API keys, a request to any other route than
    OPEN_PATHS without a key is refused (401, in its API's error shape) before its body
    is read: a keyless client made the server read and parse up to --max-request-body-mib
    of JSON first."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            request = Request(scope)
            if not key_accepted(request):
                exc = KEY_REFUSAL
                # refused, and counted, only where a route serves the path and method
                await reply(request, exc.status, exc.message, code=exc.code,
                            headers=exc.headers, counted=not routed(scope))(
                                scope, receive, send)
                return
        await self.app(scope, receive, send)


class InFlight:
    """ASGI middleware: ``state.http_in_flight`` counts the HTTP requests being answered,
    streams until their last byte (what a drain waits for besides the engine), and
    ADMITTED_BEFORE_DRAIN marks those that began before a drain."""

    def __init__(self, app: ASGIApp, state: ServingState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.state.http_in_flight += 1
        token = ADMITTED_BEFORE_DRAIN.set(self.state.health != "draining")
        try:
            await self.app(scope, receive, send)
        finally:
            ADMITTED_BEFORE_DRAIN.reset(token)
            self.state.http_in_flight -= 1


def create_app(settings: Settings | None = None,
               load_backend: Callable[[Settings], ModelBackend] | None = None) -> FastAPI:
    settings = settings or Settings()
    state = ServingState(settings)
    loader = load_backend or default_load_backend

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        backend = await asyncio.to_thread(loader, settings)
        state.attach(backend)
        log.info("serving %s (max_num_seqs=%d, max_model_len=%d, %d KV blocks of %d)",
                 backend.model_name, settings.max_num_seqs, settings.max_model_len,
                 backend.runner.num_kv_blocks, backend.runner.block_size)
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="fp8serve", lifespan=lifespan)
    app.state.serving = state
    # inside CORS: its 400s and 413s carry CORS headers
    app.add_middleware(LoneSurrogateGuard, max_bytes=settings.max_request_body_mib * 2**20
                       if settings.max_request_body_mib else None, unread_paths=OPEN_PATHS)
    app.add_middleware(ApiKeyGate)  # before the guard reads a body; CORS preflights pass
    if settings.allowed_origins:  # CORS for browser pages on those origins (vLLM's flags)
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_credentials=settings.allow_credentials,
                           allow_methods=list(settings.allowed_methods),
                           allow_headers=list(settings.allowed_headers))
    # outermost: a request counts as in flight (and as taken before a drain) from its
    # first byte, while its body is still arriving
    app.add_middleware(InFlight, state=state)
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(ops.public)
    app.include_router(ops.private)
    app.include_router(openai.router)
    app.include_router(stored_chat.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(conversations.router)
    return app
