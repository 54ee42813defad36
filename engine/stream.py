"""What the engine thread hands back per request, and how it crosses to asyncio.

The engine thread calls ``sink(output)`` for every new piece of a request; an
:class:`AsyncStream` turns those calls into an async iterator on the event loop through
``loop.call_soon_threadsafe`` (the only thread-safe way into an asyncio.Queue).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.request import FinishReason


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One increment of a request. ``text`` and ``token_ids`` are the *new* pieces."""

    request_id: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token when requested
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None  # set when finish_reason is ERROR or TIMEOUT
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # cumulative
    stop_reason: int | str | None = None


OutputSink = Callable[[RequestOutput], None]


@dataclass
class AsyncStream:
    """Async iterator over one request's outputs; ``put`` may be called from any thread."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    _queue: asyncio.Queue[RequestOutput] = field(default_factory=asyncio.Queue)

    def put(self, out: RequestOutput) -> None:
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, out)
        except RuntimeError:  # loop closed: nobody is listening any more
            pass

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while True:
            out = await self._queue.get()
            yield out
            if out.finished:
                return


class EngineObserver:
    """Hooks the engine thread calls on request events (metrics subclass this). All
    times are in seconds; every hook must be cheap and thread-safe."""

    def on_rejected(self, reason: str) -> None: ...

    def on_admitted(self, queue_time: float, num_prompt_tokens: int) -> None: ...

    def on_first_token(self, ttft: float) -> None: ...

    def on_token(self, inter_token_latency: float) -> None: ...

    def on_finished(self, reason: FinishReason, e2e: float, num_output_tokens: int) -> None:
        ...
