"""Dependencies shared by the routers: the serving state and API-key checking."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from service.backend import ServingState
from service.errors import APIError


def get_state(request: Request) -> ServingState:
    return request.app.state.serving


StateDep = Annotated[ServingState, Depends(get_state)]


def get_ready_state(request: Request) -> ServingState:
    """The serving state once the model is loaded (503 before)."""
    state: ServingState = request.app.state.serving
    if state.engine is None:
        raise APIError(503, "model is still loading", code="loading")
    return state


ReadyStateDep = Annotated[ServingState, Depends(get_ready_state)]


def require_api_key(request: Request) -> None:
    """Key check, constant time against every configured key: ``Authorization: Bearer
    <key>`` (OpenAI's clients) or ``x-api-key: <key>`` (Anthropic's)."""
    keys = request.app.state.serving.settings.api_keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip().encode() if scheme.lower() == "bearer" else b""
    if not given:
        given = request.headers.get("x-api-key", "").strip().encode()
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode())
    if not ok:
        raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>, "
                       "or x-api-key: <key>)", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


def check_model(state: ServingState, model: str | None) -> str:
    """The served model name; 404 when the request names another model."""
    name = state.backend.model_name
    if model is not None and model != name:
        raise APIError(404, f"model {model!r} not found; this server serves {name!r}",
                       "model", "model_not_found")
    return name
