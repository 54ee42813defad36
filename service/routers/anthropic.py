"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API,
translated onto the chat run (service/translate/anthropic.py). Errors on these routes
are in Anthropic's shape (service/errors.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from engine.request import InvalidRequestError
from service import rejections
from service.backend import ServingState
from service.chat_run import chat_prompt, start_chat
from service.collect import threaded_json
from service.deps import ReadyStateDep, require_api_key
from service.errors import APIError
from service.openapi import errors, ok, ok_events
from service.routers.openai import SSE_HEADERS
from service.schemas import ChatCompletionRequest
from service.sse import NamedStream, stream_named
from service.translate.anthropic import to_chat
from service.translate.anthropic_stream import PING, MessageStream
from service.translate.refusals import check_tool_results, in_messages
from service.translate.schemas import CountTokensRequest, MessagesRequest

router = APIRouter(dependencies=[Depends(require_api_key)])
PING_EVERY_S = 10.0
ANTHROPIC = "AnthropicErrorResponse"


@router.post("/v1/messages", response_model=None, responses={
    **ok_events("AnthropicMessageResponse", "the message; with stream: Anthropic's events"),
    **errors(400, 401, 404, 408, 429, 503, body=ANTHROPIC, rules=rejections.MESSAGES_API)})
async def messages(body: MessagesRequest, request: Request, state: ReadyStateDep):
    if body.thread is not None:
        # the anthropic SDK's tool runner threads by default, and on these details goes
        # on with the full conversation each turn (lib/threads: thread_unsupported_request)
        raise APIError(400, "thread: this server keeps no conversation threads; send the "
                       "whole conversation without thread", "thread",
                       details={"error_code": "thread_unsupported_request", "unsupported": []})
    try:
        chat = _checked_chat(body, state)
        # max_tokens is a cap the context window may lower, as Anthropic serves it: the
        # window's end is stop_reason model_context_window_exceeded
        run = await start_chat(state, chat, "msg", fit_window=True)
    except (APIError, InvalidRequestError) as exc:
        raise in_messages(exc) from exc
    msg_id = run.sub.id.replace("-", "_", 1)
    reader = run.readers[0]
    omit = getattr(body.thinking, "display", None) == "omitted"
    enc = MessageStream(msg_id, run.model, reader, len(run.prompt), state.signer, omit,
                        body.max_tokens)
    if not body.stream:
        try:
            choice = (await run.collect(request))[0]
        except APIError as exc:  # a grammar's dead end names chat's field
            raise in_messages(exc) from exc
        return await threaded_json(lambda: enc.whole(choice))
    events = NamedStream(enc.first(), enc.chunk, enc.error, PING, PING_EVERY_S)
    return StreamingResponse(stream_named(run.sub, events),
                             media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/v1/messages/count_tokens", response_model=None, responses={
    **ok("InputTokens"),
    **errors(400, 401, 404, 503, body=ANTHROPIC, rules=rejections.COUNT_TOKENS)})
async def count_tokens(body: CountTokensRequest, state: ReadyStateDep) -> dict[str, Any]:
    try:
        _, _, prompt = await chat_prompt(state, _checked_chat(body, state))
    except APIError as exc:
        raise in_messages(exc) from exc
    return {"input_tokens": len(prompt)}


def _checked_chat(body: CountTokensRequest | MessagesRequest, state: ServingState
                  ) -> ChatCompletionRequest:
    """The chat request ``body`` means, after the rules on its history: thinking blocks'
    signatures, tool results answering earlier tool uses."""
    state.signer.check_history(body.messages)
    check_tool_results(body.messages)
    return to_chat(body, state.parsers, state.backend.tokenizer)
