"""POST /v1/responses: OpenAI's Responses API, stateless (nothing is stored: ``store``
true and ``previous_response_id`` are 400s), translated onto the chat run
(service/translate/responses.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from engine.request import InvalidRequestError
from service import rejections
from service.chat_run import start_chat
from service.deps import ReadyStateDep, require_api_key
from service.errors import APIError
from service.generation import NamedStream, stream_named
from service.openai_format import chat_logprobs
from service.openapi import errors, ok_events
from service.routers.openai import SSE_HEADERS, token_bytes, token_text
from service.translate.refusals import check_function_outputs, in_responses
from service.translate.responses import to_chat
from service.translate.responses_stream import ResponseStream
from service.translate.schemas import ResponsesRequest

router = APIRouter(dependencies=[Depends(require_api_key)])


def _head(model: str, body: ResponsesRequest) -> dict[str, Any]:
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
            "store": False, "metadata": {}, "top_logprobs": body.top_logprobs}


@router.post("/v1/responses", response_model=None, responses={
    **ok_events("Response", "the response; with stream: the Responses API's typed events"),
    **errors(400, 401, 404, 408, 429, 503, rules=rejections.RESPONSES)})
async def responses(body: ResponsesRequest, request: Request, state: ReadyStateDep):
    try:
        if not isinstance(body.input, str):
            check_function_outputs(body.input)
        chat = to_chat(body, state.parsers, state.backend.tokenizer)
        run = await start_chat(state, chat, "resp")
    except (APIError, InvalidRequestError) as exc:
        raise in_responses(exc) from exc
    entries = None
    if chat.logprobs:
        text_of, bytes_of = token_text(state), token_bytes(state)

        def entries(lps):
            return chat_logprobs(lps, text_of, bytes_of)["content"]
    enc = ResponseStream(run.sub.id.replace("-", "_", 1), _head(run.model, body),
                         run.readers[0], len(run.prompt), run.reasoning, entries)
    if not body.stream:
        choice = (await run.collect(request))[0]
        return enc.whole(choice.finish_reason, len(choice.token_ids), choice.num_cached_tokens,
                         choice.logprobs)
    events = NamedStream(enc.first(), enc.chunk, enc.error)
    return StreamingResponse(stream_named(run.sub, events),
                             media_type="text/event-stream", headers=SSE_HEADERS)
