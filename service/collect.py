"""Whole (non-streaming) answers: each choice's outputs gathered into a :class:`Choice`
while a client disconnect aborts them all, a choice the engine ended early (error,
timeout) as its HTTP error (408, 400 for the request's own input, 500), the same whole or
streamed, and the answer built and serialized off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from engine.request import FinishReason
from engine.stream import RequestOutput, TokenLogprob
from service.errors import APIError
from service.generation import Choices

DISCONNECT_POLL_S = 0.25


@dataclass
class Choice:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    error_from_request: bool = False  # the request's own input caused the error
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # of those, served from the prefix cache
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # when asked
    # predicted outputs: draft tokens from the prediction accepted / rejected so far
    num_accepted_prediction_tokens: int = 0
    num_rejected_prediction_tokens: int = 0

    def add(self, out: RequestOutput) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.text.append(out.text)
        self.token_ids += out.token_ids
        self.logprobs += out.logprobs
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.num_accepted_prediction_tokens = out.num_accepted_prediction_tokens
        self.num_rejected_prediction_tokens = out.num_rejected_prediction_tokens
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
            self.error, self.error_from_request = out.error, out.error_from_request


async def collect(sub: Choices, request: Request) -> list[Choice]:
    """Wait for every choice; a client disconnect aborts them all."""
    choices = [Choice() for _ in sub.ids]
    watcher = asyncio.create_task(_watch_disconnect(sub, request))
    try:
        async for i, out in sub:
            choices[i].add(out)
    finally:
        watcher.cancel()
        sub.abort_all()
    for c in choices:
        raise_for_choice(c, sub.grammar_param)
    return choices


def end_status(out: RequestOutput | Choice) -> int:
    """The HTTP status of a request the engine ended early: 408 on its deadline, 400 when
    its own input caused the error (a grammar no output completes), else 500."""
    if out.finish_reason is FinishReason.TIMEOUT:
        return 408
    return 400 if out.error_from_request else 500


def end_code(status: int) -> str | None:
    """The error ``code`` of an early end with ``status`` (end_status), the same whole or
    streamed: "timeout", "engine_error", or None for the request's own input (a 400)."""
    return {408: "timeout", 500: "engine_error"}.get(status)


def early_end_error(out: Choice | RequestOutput, grammar_param: str | None = None
                    ) -> APIError:
    """The error of a choice the engine ended early (an error or a timeout), the same whole
    or streamed; its own input's (a grammar no output completes) names ``grammar_param``,
    the field that built the grammar."""
    status = end_status(out)
    param = grammar_param if out.error_from_request else None
    message = out.error or ("request timed out" if status == 408 else "generation failed")
    return APIError(status, f"{param}: {message}" if param else message, param,
                    code=end_code(status), counted=True)


def raise_for_choice(c: Choice, grammar_param: str | None = None) -> None:
    if c.finish_reason in (FinishReason.TIMEOUT, FinishReason.ERROR):
        raise early_end_error(c, grammar_param)


async def _watch_disconnect(sub: Choices, request: Request) -> None:
    while True:
        if await request.is_disconnected():
            sub.abort_all()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


async def threaded_json(build: Callable[[], Any]) -> JSONResponse:
    """A whole answer built and serialized on a worker thread: formatting and encoding a
    large one (n=16 with top_logprobs 20: 24 MB) held the event loop, /health and every
    stream with it, for seconds."""
    return await run_in_threadpool(lambda: JSONResponse(build()))
