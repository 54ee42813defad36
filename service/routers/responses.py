"""OpenAI's Responses API: ``POST /v1/responses`` translated onto the chat run
(service/translate/responses.py), and the stored responses (service/store/responses.py):
``previous_response_id`` continues one, ``GET`` / ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items`` read and forget them. ``POST .../cancel`` is for
background responses, which are not served: a 400 for a stored one."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from engine.request import InvalidRequestError
from service import rejections
from service.backend import ServingState
from service.chat_run import start_chat
from service.deps import ReadyStateDep, StateDep, require_api_key, store_tenant
from service.errors import APIError
from service.generation import NamedStream, stream_named
from service.openai_format import chat_logprobs
from service.openapi import errors, ok, ok_events
from service.routers.openai import SSE_HEADERS, token_bytes, token_text
from service.store.responses import StoredResponse, json_bytes
from service.translate.refusals import check_function_outputs, in_responses
from service.translate.responses import items_json, output_items, own_items, to_chat
from service.translate.responses_stream import ResponseStream
from service.translate.schemas import ResponsesRequest

router = APIRouter(dependencies=[Depends(require_api_key)])


def _head(model: str, body: ResponsesRequest, store: bool) -> dict[str, Any]:
    """The request fields a response echoes."""
    tc = body.tool_choice
    return {"model": model, "instructions": body.instructions,
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "tool_choice": (tc.model_dump() if tc is not None and not isinstance(tc, str)
                            else tc or "auto"),
            "parallel_tool_calls": body.parallel_tool_calls,
            "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "text": {"format": (body.text.format.model_dump(by_alias=True, exclude_none=True)
                                if body.text and body.text.format else {"type": "text"})},
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                          "summary": None},
            "store": store, "previous_response_id": body.previous_response_id,
            "metadata": body.metadata or {}, "top_logprobs": body.top_logprobs}


def _stores(state: ServingState, body: ResponsesRequest) -> bool:
    """Whether this response is kept: ``store`` true, or left out (OpenAI's default) on a
    server that keeps responses."""
    if body.store and state.responses is None:
        raise APIError(400, "store: true, but this server stores no responses "
                       "(--responses-store-mib 0); accepted: false or null", "store")
    return state.responses is not None and body.store is not False


def _previous(state: ServingState, tenant: str, body: ResponsesRequest
              ) -> StoredResponse | None:
    rid = body.previous_response_id
    if rid is None:
        return None
    found = state.responses.get(tenant, rid) if state.responses is not None else None
    if found is None:
        why = ("" if state.responses is not None else
               " (this server stores no responses: --responses-store-mib 0)")
        raise APIError(400, f"Previous response with id {rid!r} not found{why}.",
                       "previous_response_id", "previous_response_not_found")
    return found


@router.post("/v1/responses", response_model=None, responses={
    **ok_events("Response", "the response; with stream: the Responses API's typed events"),
    **errors(400, 401, 404, 408, 429, 503, rules=rejections.RESPONSES)})
async def responses(body: ResponsesRequest, request: Request, state: ReadyStateDep):
    tenant = store_tenant(request)
    try:
        store = _stores(state, body)
        prev = _previous(state, tenant, body)
        own = own_items(body)
        earlier = [*prev.context, *output_items(prev.response["output"])] if prev else []
        check_function_outputs(own, earlier)
        context = [*earlier, *own]
        chat = to_chat(body, state.parsers, state.backend.tokenizer, context)
        run = await start_chat(state, chat, "resp")
    except (APIError, InvalidRequestError) as exc:
        raise in_responses(exc) from exc
    entries = on_done = None
    if chat.logprobs:
        text_of, bytes_of = token_text(state), token_bytes(state)

        def entries(lps):
            return chat_logprobs(lps, text_of, bytes_of)["content"]
    if store:
        listed = items_json(own)
        context_bytes = (prev.nbytes if prev else 0) + json_bytes(listed)

        def on_done(response: dict[str, Any]) -> None:
            state.responses.put(tenant, response, context, context_bytes, listed)
    enc = ResponseStream(run.sub.id.replace("-", "_", 1), _head(run.model, body, store),
                         run.readers[0], len(run.prompt), run.reasoning, entries, on_done)
    if not body.stream:
        choice = (await run.collect(request))[0]
        return enc.whole(choice.finish_reason, len(choice.token_ids), choice.num_cached_tokens,
                         choice.logprobs)
    events = NamedStream(enc.first(), enc.chunk, enc.error)
    return StreamingResponse(stream_named(run.sub, events),
                             media_type="text/event-stream", headers=SSE_HEADERS)


_STORED = {404: "no stored response has this id (for this API key): never stored, "
                "deleted, or evicted (--responses-store-mib)"}


def _stored_errors(*statuses: int, rules: tuple[rejections.Rule, ...] = ()
                   ) -> dict[int | str, dict[str, Any]]:
    out = errors(*statuses, rules=rules)
    out[404] = {**out[404], "description": _STORED[404]}
    return out


def _no_query(request: Request, allowed: dict[str, tuple[str, ...]]) -> None:
    """Query parameters of OpenAI's retrieval routes this server does not serve: a 400
    naming the parameter unless its value is one ``allowed`` lists (what happens here)."""
    for name, value in request.query_params.multi_items():
        if name in allowed and value in allowed[name]:
            continue
        if name in ("limit", "order", "after"):
            continue  # declared, validated by the route
        raise APIError(400, f"{name}: {value!r} is not supported here: stored responses "
                       "are returned whole, with what their request included", name)


def _lookup(state: ServingState, request: Request, response_id: str) -> StoredResponse:
    found = (state.responses.get(store_tenant(request), response_id)
             if state.responses is not None else None)
    if found is None:
        raise APIError(404, f"Response with id {response_id!r} not found.", "response_id")
    return found


_RETRIEVE_QUERY = {"stream": ("false",), "include_obfuscation": ("true", "false")}


@router.get("/v1/responses/{response_id}", response_model=None, responses={
    **ok("Response", description="the stored response, as it was answered"),
    **_stored_errors(400, 401, 404, rules=rejections.STORED_QUERY)})
async def get_response(response_id: str, request: Request, state: StateDep) -> dict[str, Any]:
    _no_query(request, _RETRIEVE_QUERY)
    return _lookup(state, request, response_id).response


@router.delete("/v1/responses/{response_id}", response_model=None, responses={
    **ok("ResponseDeleted", description="the response is forgotten"),
    **_stored_errors(401, 404)})
async def delete_response(response_id: str, request: Request, state: StateDep
                          ) -> dict[str, Any]:
    _lookup(state, request, response_id)
    state.responses.delete(store_tenant(request), response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel", response_model=None, responses={
    **_stored_errors(400, 401, 404, rules=rejections.CANCEL)})
async def cancel_response(response_id: str, request: Request, state: StateDep) -> None:
    _lookup(state, request, response_id)
    raise APIError(400, "response_id: only background responses can be cancelled, and "
                   "background is not served here: this response is complete",
                   "response_id")


@router.get("/v1/responses/{response_id}/input_items", response_model=None, responses={
    **ok("ResponseItemList", description="the request's own input items, each with an id "
         "(a string input is one user message; instructions are not an item)"),
    **_stored_errors(400, 401, 404, rules=rejections.INPUT_ITEMS)})
async def input_items(response_id: str, request: Request, state: StateDep,
                      limit: int = Query(20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc",
                      after: str | None = None) -> dict[str, Any]:
    _no_query(request, {})
    items = list(_lookup(state, request, response_id).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise APIError(400, f"after: {after!r} is no input item of response "
                           f"{response_id!r}", "after")
        items = items[at + 1:]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
