"""Dependencies shared by the routers: the serving state and API-key checking."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Request

from service.backend import ServingState
from service.errors import APIError
from service.store.responses import tenant_of


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


KEY_REFUSAL = APIError(401, "invalid or missing API key (Authorization: Bearer <key>, "
                       "or x-api-key: <key>)", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


def key_accepted(request: Request) -> bool:
    """Whether the request may pass: the server takes no keys, or it presents one of them."""
    keys = request.app.state.serving.settings.api_keys
    return not keys or accepted_key(request, keys) is not None


def accepted_key(request: Request, keys: tuple[str, ...]) -> str | None:
    """The first key the request presents that is one of ``keys`` (every pair compared,
    in constant time), else None."""
    found = None
    for given in presented_keys(request):
        ok = False
        for key in keys:
            ok |= hmac.compare_digest(given.encode(), key.encode())
        found = found or (given if ok else None)
    return found


def require_api_key(request: Request) -> None:
    """Key check: ``Authorization: Bearer <key>`` (OpenAI's clients) or ``x-api-key:
    <key>`` (Anthropic's). The ApiKeyGate middleware (service/app.py) refuses a request
    without one before its body is read; the routes check again."""
    if not key_accepted(request):
        raise KEY_REFUSAL


def presented_keys(request: Request) -> tuple[str, ...]:
    """The keys the request presents: ``Authorization: Bearer <key>``, then ``x-api-key``.
    Either may be this server's: a client may send both, one of them with a token meant
    for another service (Claude Code with ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN both
    set)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = (token.strip() if scheme.lower() == "bearer" else "",
             request.headers.get("x-api-key", "").strip())
    return tuple(k for k in given if k)


def store_tenant(request: Request) -> str:
    """The response store's namespace of an authenticated request: its API key's, or the
    one namespace of a server that takes no keys."""
    keys = request.app.state.serving.settings.api_keys
    return tenant_of(accepted_key(request, keys) if keys else None)


def served_names(state: ServingState) -> tuple[str, ...]:
    """The ids the model answers to: the backend's (the first of --served-model-name, or
    the directory's name), then the other names given (vLLM's aliases)."""
    return (state.backend.model_name, *state.settings.served_model_name[1:])


def check_model(state: ServingState, model: str | None) -> str:
    """The model id an answer reports: the one the request names (any served name), else
    the first; 404 when the request names another model."""
    names = served_names(state)
    if model is None:
        return names[0]
    if model not in names:
        served = " or ".join(repr(n) for n in names)
        raise APIError(404, f"model {model!r} not found; this server serves {served}",
                       "model", "model_not_found")
    return model


# the paging parameters of OpenAI's lists (validated by the route)
PAGING: dict[str, tuple[str, ...] | None] = {"limit": None, "order": None, "after": None}


def refuse_repeated_query(request: Request) -> None:
    """A 400 naming a query parameter given twice (all but one were ignored); ``name[]``
    is a list, each of its values one of it."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen and not name.endswith("[]"):
            raise APIError(400, f"{name}: is given twice; give a query parameter once",
                           name, query=True)
        seen.add(name)


def refuse_other_query(request: Request, served: Mapping[str, tuple[str, ...] | None],
                       why: str) -> None:
    """A 400 naming the first query parameter outside ``served``, or with a value its
    entry does not list (None: any value, the route checks it): never one ignored.
    ``name[]``, how the SDKs send a list, is ``name``; ``why`` ends the message."""
    for name, value in request.query_params.multi_items():
        base = name[:-2] if name.endswith("[]") else name
        if base not in served or (served[base] is not None and value not in served[base]):
            raise APIError(400, f"{base}: {value!r} is not supported here: {why}", base,
                           query=True)
    refuse_repeated_query(request)
