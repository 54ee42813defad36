"""OpenAI's stored chat completions: ``POST /v1/chat/completions`` with ``store: true``
keeps the answer (streamed or not: the whole completion the stream adds up to) with the
request's ``metadata`` and messages, and these routes list, read, retag and forget them.

They live in a response store (service/store/responses.py) of their own, with the budget
of ``--responses-store-mib``: in this process's memory, per API key, least recently used
first (``0``: ``store: true`` is a 400)."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from service import rejections
from service.backend import ServingState
from service.deps import (
    PAGING,
    StateDep,
    refuse_other_query,
    refuse_repeated_query,
    require_api_key,
    store_tenant,
)
from service.errors import APIError
from service.openapi import errors, ok
from service.paging import page_items
from service.schemas import ChatCompletionRequest, ChatMessage, MetadataUpdate
from service.store.responses import ResponseStore, StoredResponse, json_bytes

router = APIRouter(dependencies=[Depends(require_api_key)])

_NOT_FOUND = ("no stored chat completion has this id for this API key: never stored "
              "(store true), deleted, or evicted (--responses-store-mib)")
_errors = partial(errors, not_found=_NOT_FOUND)


def check_store(state: ServingState, body: ChatCompletionRequest) -> bool:
    """Whether the answer is kept: ``store: true`` on a server that keeps them; metadata
    goes only with a kept answer (OpenAI's rule: it would be dropped)."""
    if body.metadata and not body.store:
        raise APIError(400, "metadata: is kept only with the answer, and this request "
                       "stores none: send store: true, or leave metadata out", "metadata")
    if body.store and state.chat_completions is None:
        raise APIError(400, "store: true, but this server stores no chat completions "
                       "(--responses-store-mib 0); accepted: false or null", "store")
    return bool(body.store)


def _message(completion_id: str, k: int, m: ChatMessage) -> dict[str, Any]:
    data = m.model_dump(mode="json", exclude_none=True)
    parts = data.get("content") if isinstance(data.get("content"), list) else None
    return {"id": f"{completion_id}-{k}", **data,
            "content": None if parts is not None else data.get("content"),
            "content_parts": parts}


def keep(state: ServingState, request: Request, body: ChatCompletionRequest,
         completion: dict[str, Any]) -> None:
    """Store the answer with the request's metadata and messages."""
    kept = {**completion, "metadata": body.metadata or {}}
    messages = [_message(completion["id"], k, m) for k, m in enumerate(body.messages)]
    state.chat_completions.put(store_tenant(request), kept, (),
                               sum(json_bytes(m) for m in messages), messages)


def _store(state: ServingState) -> ResponseStore:
    if state.chat_completions is None:
        raise APIError(404, "this server stores no chat completions "
                       "(--responses-store-mib 0)", "completion_id")
    return state.chat_completions


def _find(state: ServingState, request: Request, completion_id: str) -> StoredResponse:
    found = _store(state).get(store_tenant(request), completion_id)
    if found is None:
        raise APIError(404, f"Chat completion with id {completion_id!r} not found.",
                       "completion_id")
    return found


def _lookup(state: ServingState, request: Request, completion_id: str) -> StoredResponse:
    """The stored completion, for a route that takes no query parameter (any is a 400:
    it would be ignored)."""
    refuse_other_query(request, {}, "this route takes no query parameter")
    return _find(state, request, completion_id)


@router.get("/v1/chat/completions", response_model=None, responses={
    **ok("ChatCompletionList", description="the stored chat completions, in the order "
         "they were made"), **_errors(400, 401, rules=rejections.STORED_CHAT)})
async def list_completions(request: Request, state: StateDep,
                           limit: int = Query(20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "asc",
                           after: str | None = None, model: str | None = None
                           ) -> dict[str, Any]:
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata[") and name.endswith("]"):
            wanted[name[9:-1]] = value
        elif name not in ("limit", "order", "after", "model"):
            raise APIError(400, f"{name}: is not a filter of this list (limit, order, "
                           "after, model, metadata[KEY])", name, query=True)
    refuse_repeated_query(request)
    def keep(entry: dict[str, Any]) -> bool:
        return ((model is None or entry["model"] == model)
                and all(entry["metadata"].get(k) == v for k, v in wanted.items()))

    entries = [e.response for e in _store(state).listing(store_tenant(request))]
    return page_items(entries, limit, order, after, "stored chat completion", keep)


@router.get("/v1/chat/completions/{completion_id}", response_model=None, responses={
    **ok("ChatCompletion", description="the stored chat completion, with its metadata"),
    **_errors(400, 401, 404, rules=rejections.NO_QUERY)})
async def retrieve_completion(completion_id: str, request: Request, state: StateDep
                              ) -> dict[str, Any]:
    return _lookup(state, request, completion_id).response


@router.post("/v1/chat/completions/{completion_id}", response_model=None, responses={
    **ok("ChatCompletion", description="the stored chat completion, its metadata "
         "replaced"), **_errors(400, 401, 404, rules=rejections.NO_QUERY)})
async def update_completion(completion_id: str, body: MetadataUpdate, request: Request,
                            state: StateDep) -> dict[str, Any]:
    found = _lookup(state, request, completion_id)
    new = {**found.response, "metadata": body.metadata or {}}
    _store(state).replace(store_tenant(request), new)
    return new


@router.delete("/v1/chat/completions/{completion_id}", response_model=None, responses={
    **ok("ChatCompletionDeleted"), **_errors(400, 401, 404, rules=rejections.NO_QUERY)})
async def delete_completion(completion_id: str, request: Request, state: StateDep
                            ) -> dict[str, Any]:
    _lookup(state, request, completion_id)
    _store(state).delete(store_tenant(request), completion_id)
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}


@router.get("/v1/chat/completions/{completion_id}/messages", response_model=None,
            responses={**ok("ResponseItemList", description="the request's messages, each "
                            "with an id"), **_errors(400, 401, 404,
                                                     rules=rejections.STORED_CHAT)})
async def list_messages(completion_id: str, request: Request, state: StateDep,
                        limit: int = Query(20, ge=1, le=100),
                        order: Literal["asc", "desc"] = "asc",
                        after: str | None = None) -> dict[str, Any]:
    refuse_other_query(request, PAGING, "a stored completion's messages page with limit, "
                       "order and after")
    found = _find(state, request, completion_id)
    return page_items(list(found.input_items), limit, order, after,
                 f"message of chat completion {completion_id!r}")
