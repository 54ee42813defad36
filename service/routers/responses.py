"""OpenAI's Responses API: ``POST /v1/responses`` translated onto the chat run
(service/translate/responses.py), and the stored responses (service/store/responses.py):
``previous_response_id`` continues one, ``GET`` / ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items`` read and forget them. ``background: true`` runs a
response past its request (service/store/background.py): ``GET`` polls it or, for one
created with ``stream``, follows its events (``?stream=true&starting_after=N``), and
``POST .../cancel`` stops it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from engine.request import InvalidRequestError
from service import rejections
from service.backend import ServingState
from service.chat_run import chat_prompt, start_chat
from service.collect import threaded_json
from service.deps import (
    PAGING,
    ReadyStateDep,
    StateDep,
    refuse_other_query,
    require_api_key,
    store_tenant,
)
from service.errors import APIError
from service.logprob_format import chat_logprobs
from service.openapi import errors, ok, ok_events
from service.paging import page_items
from service.routers import conversations
from service.routers.openai import SSE_HEADERS, token_bytes, token_text
from service.sse import NamedStream, stream_named
from service.store.background import BackgroundJob
from service.store.conversations import Conversation, ConversationTooLarge
from service.store.responses import StoredResponse, json_bytes
from service.translate.refusals import check_function_outputs, check_item_ids, in_responses
from service.translate.responses import (
    items_json,
    output_items,
    own_items,
    seals,
    to_chat,
    with_ids,
)
from service.translate.responses_stream import ResponseStream
from service.translate.schemas import ResponsesInputTokensRequest, ResponsesRequest
from service.translate.truncation import fit

log = logging.getLogger(__name__)
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
            "max_tool_calls": body.max_tool_calls,
            "text": {"format": (body.text.format.model_dump(by_alias=True, exclude_none=True)
                                if body.text and body.text.format else {"type": "text"})},
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                          "summary": None},
            "store": store, "background": bool(body.background),
            "truncation": body.truncation or "disabled",
            "previous_response_id": body.previous_response_id,
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
    if state.jobs.get(tenant, rid) is not None:
        raise APIError(400, f"Previous response with id {rid!r} is still running (a "
                       "background response): continue it once it has finished.",
                       "previous_response_id")
    found = state.responses.get(tenant, rid) if state.responses is not None else None
    if found is None:
        why = ("" if state.responses is not None else
               " (this server stores no responses: --responses-store-mib 0)")
        raise APIError(400, f"Previous response with id {rid!r} not found{why}.",
                       "previous_response_id", "previous_response_not_found")
    return found


async def _fits(state: ServingState, body: ResponsesRequest, items: list[Any]) -> bool:
    """Whether a prompt built from ``items`` leaves room for max_output_tokens (else one
    token) within max_model_len."""
    _, _, prompt = await chat_prompt(state, to_chat(body, state.parsers,
                                                    state.backend.tokenizer, items))
    return len(prompt) + (body.max_output_tokens or 1) <= state.settings.max_model_len


def _conversation(state: ServingState, request: Request, body: ResponsesRequest
                  ) -> Conversation | None:
    ref = body.conversation
    if ref is None:
        return None
    if body.previous_response_id is not None:
        raise APIError(400, "conversation: cannot be combined with previous_response_id "
                       "(a conversation holds the earlier turns itself)", "conversation")
    cid = ref if isinstance(ref, str) else ref.id
    found = conversations.store_of(state).get(store_tenant(request), cid)
    if found is None:
        raise APIError(400, f"conversation: Conversation with id {cid!r} not found.",
                       "conversation")
    return found


@dataclass
class Context:
    """What a request's prompt is built from: the stored response it continues or the
    conversation it extends, its own input items, and the items of the prompt (earlier
    turns, then its own; cut by truncation "auto")."""

    prev: StoredResponse | None
    conv: Conversation | None
    own: list[Any]
    items: list[Any]


async def _context(state: ServingState, request: Request, body: ResponsesRequest
                   ) -> Context:
    conv = _conversation(state, request, body)  # first: it refuses previous_response_id
    prev = _previous(state, store_tenant(request), body)
    own = with_ids(state.sealer.open_items(own_items(body)))
    earlier = ([*prev.context, *output_items(prev.response["output"])] if prev
               else list(conv.items) if conv else [])
    check_function_outputs(own, earlier)
    check_item_ids(own, (d["id"] for d in conv.listed) if conv else
                   (i.id for i in earlier if i.id is not None))
    items = [*earlier, *own]
    if body.truncation == "auto":
        items = await fit(items, lambda kept: _fits(state, body, kept))
    return Context(prev, conv, own, items)


@router.post("/v1/responses/input_tokens", response_model=None, responses={
    **ok("ResponseInputTokens"), **errors(400, 401, 404, 503, rules=rejections.RESPONSES)})
async def input_tokens(body: ResponsesInputTokensRequest, request: Request,
                       state: ReadyStateDep) -> dict[str, Any]:
    """OpenAI's input token count: the prompt /v1/responses builds for the same fields."""
    req = body.as_request()
    try:
        ctx = await _context(state, request, req)
        _, _, prompt = await chat_prompt(state, to_chat(req, state.parsers,
                                                        state.backend.tokenizer, ctx.items))
    except (APIError, InvalidRequestError) as exc:
        raise in_responses(exc) from exc
    return {"object": "response.input_tokens", "input_tokens": len(prompt)}


@router.post("/v1/responses", response_model=None, responses={
    **ok_events("Response", "the response; with stream: the Responses API's typed events"),
    **errors(400, 401, 404, 408, 429, 503, rules=rejections.RESPONSES)})
async def responses(body: ResponsesRequest, request: Request, state: ReadyStateDep):
    tenant = store_tenant(request)
    try:
        store = _stores(state, body)
        if body.background and not store:
            raise APIError(400, "background: true needs the response stored (store true "
                           "or left out, on a server that keeps responses)", "background")
        ctx = await _context(state, request, body)
        prev, conv, own, context = ctx.prev, ctx.conv, ctx.own, ctx.items
        chat = to_chat(body, state.parsers, state.backend.tokenizer, context)
        run = await start_chat(state, chat, "resp")
    except (APIError, InvalidRequestError) as exc:
        raise in_responses(exc) from exc
    entries = None
    if chat.logprobs:
        text_of, bytes_of = token_text(state), token_bytes(state)

        def entries(lps):
            return chat_logprobs(lps, text_of, bytes_of)["content"]
    listed = items_json(own)
    context_bytes = ((prev.context_bytes if prev else conv.nbytes if conv else 0)
                     + json_bytes(listed))

    def on_done(response: dict[str, Any], frames: Sequence[str] = ()) -> None:
        """A finished response (completed or incomplete) is stored, and its input and
        output join the conversation."""
        if store:
            state.responses.put(tenant, response, context, context_bytes, listed, frames)
        if conv is not None and response["status"] in ("completed", "incomplete"):
            outputs = [dict(o) for o in response["output"]]
            try:
                # again: a call this input answers may have been deleted from the
                # conversation while the response ran (every output answers a call before
                # it, or every later turn on the conversation is a 400), and items added
                # meanwhile may hold an id of this input
                check_function_outputs(own, conv.items)
                check_item_ids(own, (d["id"] for d in conv.listed))
                state.conversations.append(tenant, conv, [*own, *output_items(outputs)],
                                           [*items_json(own, status=True), *outputs])
            except (ConversationTooLarge, APIError) as exc:  # the answer went out; the turn
                log.warning("response %s not added to conversation %s: %s",  # is not kept
                            response["id"], conv.id, getattr(exc, "message", exc))
    head = {**_head(run.model, body, store),
            "conversation": {"id": conv.id} if conv is not None else None}
    enc = ResponseStream(run.sub.id.replace("-", "_", 1), head, run.readers[0],
                         len(run.prompt), run.reasoning, entries,
                         None if body.background else on_done,
                         getattr(state.backend.tokenizer, "is_special", lambda _: False),
                         state.sealer.seal if seals(body) else None)
    if body.background:
        def on_end(job: BackgroundJob) -> None:
            state.jobs.drop(job)
            on_done(job.enc.response, job.frames if job.keep_events else ())

        job = BackgroundJob(tenant, enc, run.sub, body.stream, on_end, listed)
        state.jobs.add(job)
        job.start()
        if not body.stream:
            return job.snapshot()
        return StreamingResponse(job.follow(), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    if not body.stream:
        try:
            choice = (await run.collect(request))[0]
        except APIError as exc:  # a grammar's dead end names chat's field
            raise in_responses(exc) from exc
        whole = enc.whole(choice.finish_reason, len(choice.token_ids),
                          choice.num_cached_tokens, choice.logprobs)  # stores it: the loop's
        return await threaded_json(lambda: whole)
    events = NamedStream(enc.first(), enc.chunk, enc.error)
    return StreamingResponse(stream_named(run.sub, events),
                             media_type="text/event-stream", headers=SSE_HEADERS)


_STORED = ("no stored response has this id (for this API key): never stored, deleted, or "
           "evicted (--responses-store-mib)")
_errors = partial(errors, not_found=_STORED)


def _no_query(request: Request, allowed: dict[str, tuple[str, ...] | None]) -> None:
    """Query parameters of OpenAI's retrieval routes this server does not serve: a 400
    naming the parameter unless ``allowed`` lists it and its value."""
    refuse_other_query(request, allowed, "stored responses are returned whole, with what "
                       "their request included")


def _lookup(state: ServingState, request: Request, response_id: str) -> StoredResponse:
    found = (state.responses.get(store_tenant(request), response_id)
             if state.responses is not None else None)
    if found is None:
        raise APIError(404, f"Response with id {response_id!r} not found.", "response_id")
    return found


_RETRIEVE_QUERY = {"stream": ("true", "false"), "include_obfuscation": ("true", "false"),
                   "starting_after": None}


def _starting_after(request: Request) -> int:
    """``starting_after``: replay events whose sequence_number is above it (-1: all)."""
    raw = request.query_params.get("starting_after")
    if raw is None:
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise APIError(400, f"starting_after: {raw!r} is not an event sequence number "
                       "(an integer, 0 or more)", "starting_after")
    return value


def _check_after(after: int, sent: int, running: bool) -> None:
    """A 400 naming starting_after when it is past the last of the ``sent`` events (no
    event has that sequence number, as OpenAI refuses one): it was an empty 200."""
    if after >= sent:
        last = f"sequence number {sent - 1}" + (" so far" if running else "")
        raise APIError(400, f"starting_after: {after} is past the last event of this "
                       f"response ({last})", "starting_after")


async def _replay(frames: tuple[str, ...], after: int) -> AsyncIterator[str]:
    yield "".join(frames[after + 1:])


@router.get("/v1/responses/{response_id}", response_model=None, responses={
    **ok_events("Response", "the response: as it was answered, or as it stands while a "
                "background response runs; with stream=true (a background response "
                "created with stream), its events after starting_after"),
    **_errors(400, 401, 404, rules=rejections.STORED_QUERY)})
async def get_response(response_id: str, request: Request, state: StateDep):
    _no_query(request, _RETRIEVE_QUERY)
    stream = request.query_params.get("stream") == "true"
    after = _starting_after(request)
    if after >= 0 and not stream:
        raise APIError(400, "starting_after: takes effect with stream=true",
                       "starting_after")
    job = state.jobs.get(store_tenant(request), response_id)
    if job is None:
        found = _lookup(state, request, response_id)
        if not stream:
            return found.response
        if not found.frames:
            raise APIError(400, "stream: only a background response created with stream "
                           "is streamed again (stream=false returns it whole)", "stream")
        _check_after(after, len(found.frames), running=False)
        events = _replay(found.frames, after)
    elif not stream:
        return job.snapshot()
    elif not job.keep_events:
        raise APIError(400, "stream: only a background response created with stream is "
                       "streamed again (stream=false returns it as it stands)", "stream")
    else:
        _check_after(after, len(job.frames), running=True)
        events = job.follow(after)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


@router.delete("/v1/responses/{response_id}", response_model=None, responses={
    **ok("ResponseDeleted", description="the response is forgotten (a running background "
         "response is cancelled first)"),
    **_errors(400, 401, 404, rules=rejections.NO_QUERY)})
async def delete_response(response_id: str, request: Request, state: StateDep
                          ) -> dict[str, Any]:
    refuse_other_query(request, {}, "this route takes no query parameter")
    tenant = store_tenant(request)
    job = state.jobs.get(tenant, response_id)
    if job is not None:
        # the cancelled run is stored as it ends, unless it is over the store's budget:
        # either way this key had it, and it is gone now (was a 404 when not stored)
        job.cancel()
        if state.responses is not None:
            state.responses.delete(tenant, response_id)
        return {"id": response_id, "object": "response", "deleted": True}
    _lookup(state, request, response_id)
    state.responses.delete(tenant, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel", response_model=None, responses={
    **ok("Response", description="the background response, cancelled (again: as it is)"),
    **_errors(400, 401, 404, rules=rejections.CANCEL)})
async def cancel_response(response_id: str, request: Request, state: StateDep
                          ) -> dict[str, Any]:
    refuse_other_query(request, {}, "this route takes no query parameter")
    job = state.jobs.get(store_tenant(request), response_id)
    if job is not None:
        job.cancel()
        return job.snapshot()
    response = _lookup(state, request, response_id).response
    if not response.get("background"):
        raise APIError(400, "response_id: only background responses can be cancelled",
                       "response_id")
    if response["status"] != "cancelled":
        raise APIError(400, f"response_id: the background response has already ended "
                       f"({response['status']}); only a running one can be cancelled",
                       "response_id")
    return response


@router.get("/v1/responses/{response_id}/input_items", response_model=None, responses={
    **ok("ResponseItemList", description="the request's own input items, each with an id "
         "(a string input is one user message; instructions are not an item)"),
    **_errors(400, 401, 404, rules=rejections.INPUT_ITEMS)})
async def input_items(response_id: str, request: Request, state: StateDep,
                      limit: int = Query(20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc",
                      after: str | None = None) -> dict[str, Any]:
    _no_query(request, PAGING)
    job = state.jobs.get(store_tenant(request), response_id)  # a background run's, as it runs
    items = (job.input_items if job is not None
             else _lookup(state, request, response_id).input_items)
    return page_items(list(items), limit, order, after,
                      f"input item of response {response_id!r}")
