"""Server-sent events: a request's outputs as SSE chunks ending in ``[DONE]`` (OpenAI's
streams) or as named events (Anthropic's, Responses), an engine error or timeout
mid-stream as the stream's last event, and what is left aborted however the stream ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from engine.request import FinishReason
from engine.stream import RequestOutput
from service.collect import early_end_error
from service.errors import APIError, error_body
from service.generation import Choices


def _events(batch: list[tuple[int, RequestOutput]],
            chunk: Callable[[int, RequestOutput], dict[str, Any] | None],
            grammar_param: str | None = None) -> tuple[list[str], bool]:
    """SSE events of one batch of outputs, and whether an error or timeout ended it (its
    error event is the last one, as raise_for_choice would answer it)."""
    events: list[str] = []
    for i, out in batch:
        if out.finish_reason in (FinishReason.ERROR, FinishReason.TIMEOUT):
            exc = early_end_error(out, grammar_param)
            events.append(sse(error_body(exc.status, exc.message, exc.param, code=exc.code)))
            return events, True
        body = chunk(i, out)
        if body is not None:
            events.append(sse(body))
    return events, False


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


Event = tuple[str, dict[str, Any]]  # (SSE event name, data)


def named_sse(events: list[Event]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
                   for name, data in events)


@dataclass
class NamedStream:
    """What an API with named SSE events (Anthropic's, Responses) makes of a one-choice
    run: ``first`` events, ``chunk`` per output, ``error`` for an engine error or timeout
    (early_end_error's, which names chat's fields: it ends the stream), ``ping`` after
    ``idle`` s of silence."""

    first: list[Event]
    chunk: Callable[[RequestOutput], list[Event]]
    error: Callable[[APIError], list[Event]]
    ping: list[Event] = field(default_factory=list)
    idle: float | None = None


async def stream_named(sub: Choices, s: NamedStream) -> AsyncIterator[str]:
    """SSE body of named events (no ``[DONE]``); aborts what is left however it ends."""
    try:
        yield named_sse(s.first)
        async for batch in sub.batches(s.idle if s.ping else None):
            if not batch:
                yield named_sse(s.ping)
            events: list[Event] = []
            for _, out in batch:
                if out.finish_reason in (FinishReason.ERROR, FinishReason.TIMEOUT):
                    yield named_sse(events + s.error(early_end_error(out, sub.grammar_param)))
                    return
                events += s.chunk(out)
            if events:
                yield named_sse(events)
    finally:
        sub.abort_all()


async def stream_events(sub: Choices, first: list[dict[str, Any]],
                        chunk: Callable[[int, RequestOutput], dict[str, Any] | None],
                        last: Callable[[], list[dict[str, Any]]]) -> AsyncIterator[str]:
    """SSE body: ``first`` chunks, one chunk per output, ``last`` chunks, ``[DONE]``. An
    engine error or timeout mid-stream becomes an error event followed by ``[DONE]``.
    If the client goes away the generator is closed and the finally aborts the rest."""
    try:
        for c in first:
            yield sse(c)
        failed = False
        async for batch in sub.batches():
            events, failed = _events(batch, chunk, sub.grammar_param)
            if events:
                yield "".join(events)
            if failed:
                break
        if not failed:
            for c in last():
                yield sse(c)
        yield "data: [DONE]\n\n"
    finally:
        sub.abort_all()
