"""OpenAI's Conversations API on the conversation store (service/store/conversations.py):
create, read, update (metadata) and delete a conversation; add, list, read and delete its
items. ``POST /v1/responses`` with ``conversation`` reads and extends one
(service/routers/responses.py)."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from service import rejections
from service.backend import ServingState
from service.deps import PAGING, StateDep, refuse_other_query, require_api_key, store_tenant
from service.errors import APIError
from service.openapi import errors, ok
from service.paging import page_items
from service.schemas import MetadataUpdate
from service.store.conversations import Conversation, ConversationStore, ConversationTooLarge
from service.translate.refusals import check_function_outputs, check_item_ids
from service.translate.responses import items_json, with_ids
from service.translate.schemas import (
    ConversationCreateRequest,
    ConversationItemsRequest,
    FunctionCallItem,
    FunctionCallOutputItem,
)

router = APIRouter(dependencies=[Depends(require_api_key)])

_NOT_FOUND = ("no conversation (or item) has this id for this API key: never created, "
              "deleted, or evicted (--conversations-store-mib)")
_errors = partial(errors, not_found=_NOT_FOUND)
_RULES = (*rejections.CONVERSATIONS, *rejections.NO_QUERY)  # the routes on a conversation


def store_of(state: ServingState) -> ConversationStore:
    if state.conversations is None:
        raise APIError(400, "conversations are not served here (--conversations-store-mib "
                       "0)", "conversation")
    return state.conversations


def lookup(state: ServingState, request: Request, conv_id: str) -> Conversation:
    found = store_of(state).get(store_tenant(request), conv_id)
    if found is None:
        raise APIError(404, f"Conversation with id {conv_id!r} not found.",
                       "conversation_id")
    return found


def _query(request: Request, paged: bool = False) -> None:
    """Items are returned whole (no ``include``); lists take the paging parameters."""
    refuse_other_query(request, PAGING if paged else {}, "items are returned whole, and "
                       "lists page with limit, order and after")


def _no_query(request: Request) -> None:
    """A route on the conversation itself: any query parameter is a 400 (not ignored)."""
    refuse_other_query(request, {}, "this route takes no query parameter")


def add_items(state: ServingState, request: Request, conv: Conversation, items: list[Any],
              name: str = "items") -> list[dict[str, Any]]:
    """Append request items (each function_call_output answering a call of the
    conversation or of ``items``; a reasoning item's encrypted_content opened); returns
    them as listed."""
    items = with_ids(state.sealer.open_items(items, name))
    check_function_outputs(items, conv.items, name)
    check_item_ids(items, (d["id"] for d in conv.listed), name)
    listed = items_json(items, status=True)
    try:
        store_of(state).append(store_tenant(request), conv, items, listed)
    except ConversationTooLarge as exc:
        raise APIError(400, f"{name}: {exc}", name) from None
    return listed


@router.post("/v1/conversations", response_model=None, responses={
    **ok("Conversation"), **_errors(400, 401, rules=_RULES)})
async def create(body: ConversationCreateRequest, request: Request, state: StateDep
                 ) -> dict[str, Any]:
    _no_query(request)
    store = store_of(state)
    conv = store.create(store_tenant(request), body.metadata or {})
    try:
        add_items(state, request, conv, list(body.items or ()))
    except APIError:
        store.delete(store_tenant(request), conv.id)
        raise
    return conv.body()


@router.get("/v1/conversations/{conversation_id}", response_model=None, responses={
    **ok("Conversation"), **_errors(400, 401, 404, rules=_RULES)})
async def retrieve(conversation_id: str, request: Request, state: StateDep
                   ) -> dict[str, Any]:
    _no_query(request)
    return lookup(state, request, conversation_id).body()


@router.post("/v1/conversations/{conversation_id}", response_model=None, responses={
    **ok("Conversation"), **_errors(400, 401, 404, rules=_RULES)})
async def update(conversation_id: str, body: MetadataUpdate, request: Request,
                 state: StateDep) -> dict[str, Any]:
    _no_query(request)
    conv = lookup(state, request, conversation_id)
    store_of(state).set_metadata(conv, body.metadata or {})
    return conv.body()


@router.delete("/v1/conversations/{conversation_id}", response_model=None, responses={
    **ok("ConversationDeleted"), **_errors(400, 401, 404, rules=_RULES)})
async def delete(conversation_id: str, request: Request, state: StateDep) -> dict[str, Any]:
    _no_query(request)
    lookup(state, request, conversation_id)
    store_of(state).delete(store_tenant(request), conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.post("/v1/conversations/{conversation_id}/items", response_model=None, responses={
    **ok("ResponseItemList", description="the items added, each with its id"),
    **_errors(400, 401, 404, rules=rejections.CONVERSATION_ITEMS)})
async def create_items(conversation_id: str, body: ConversationItemsRequest,
                       request: Request, state: StateDep) -> dict[str, Any]:
    _query(request)
    conv = lookup(state, request, conversation_id)
    listed = add_items(state, request, conv, list(body.items))
    return {"object": "list", "data": listed, "first_id": listed[0]["id"],
            "last_id": listed[-1]["id"], "has_more": False}


@router.get("/v1/conversations/{conversation_id}/items", response_model=None, responses={
    **ok("ResponseItemList", description="the conversation's items, each with its id"),
    **_errors(400, 401, 404, rules=rejections.CONVERSATION_ITEMS)})
async def list_items(conversation_id: str, request: Request, state: StateDep,
                     limit: int = Query(20, ge=1, le=100),
                     order: Literal["asc", "desc"] = "desc",
                     after: str | None = None) -> dict[str, Any]:
    _query(request, paged=True)
    conv = lookup(state, request, conversation_id)
    return page_items(list(conv.listed), limit, order, after,
                      f"item of conversation {conversation_id!r}")


def _item_at(conv: Conversation, item_id: str) -> int:
    at = conv.find(item_id)
    if at is None:
        raise APIError(404, f"Item with id {item_id!r} not found in conversation "
                       f"{conv.id!r}.", "item_id")
    return at


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", response_model=None,
            responses={**ok("ConversationItem"),
                       **_errors(400, 401, 404, rules=rejections.CONVERSATION_ITEMS)})
async def retrieve_item(conversation_id: str, item_id: str, request: Request,
                        state: StateDep) -> dict[str, Any]:
    _query(request)
    conv = lookup(state, request, conversation_id)
    return conv.listed[_item_at(conv, item_id)]


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", response_model=None,
               responses={**ok("Conversation", description="the conversation, the item "
                               "gone"), **_errors(400, 401, 404, rules=_RULES)})
async def delete_item(conversation_id: str, item_id: str, request: Request,
                      state: StateDep) -> dict[str, Any]:
    _no_query(request)
    conv = lookup(state, request, conversation_id)
    at = _item_at(conv, item_id)
    gone = conv.items[at]
    if isinstance(gone, FunctionCallItem) and any(
            isinstance(i, FunctionCallOutputItem) and i.call_id == gone.call_id
            for i in conv.items):
        # every output in a conversation answers a call before it (items added are checked)
        raise APIError(400, f"item_id: {item_id!r} is a function_call whose output is in "
                       "the conversation: delete the function_call_output first",
                       "item_id")
    store_of(state).remove_item(conv, at)
    return conv.body()
