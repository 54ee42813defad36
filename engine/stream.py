"""What the engine thread hands back per request, and how it crosses to asyncio.

The engine thread calls ``sink(output)`` for every new piece of a request; an
:class:`AsyncStream` turns those calls into an async iterator on the event loop. Crossing
goes through a :class:`LoopDispatcher`: items put from the engine thread are buffered and
handed to the loop by one ``loop.call_soon_threadsafe`` per burst (one engine step emits a
burst: one output per running request), not one wake-up of the loop per token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.request import FinishReason


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first
    rank: int | None = None  # 1 + how many ids were likelier (prompt logprobs only)


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
    # with the first token, when asked: one per prompt token, entry 0 None (no context)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # predicted outputs, cumulative: draft tokens taken from the request's prediction that
    # verification accepted / rejected (OpenAI's completion_tokens_details names)
    num_accepted_prediction_tokens: int = 0
    num_rejected_prediction_tokens: int = 0
    # the request's own input caused the ERROR (a grammar no output completes): the
    # server answers it as a bad request, not as its own failure
    error_from_request: bool = False


OutputSink = Callable[[RequestOutput], None]


class LoopDispatcher:
    """Hands items from any thread to asyncio queues of one event loop, batched: the
    first ``put`` after a drain schedules one drain callback on the loop; puts made before
    it runs ride along. Order is kept per queue (and globally)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, object]] = []

    def put(self, queue: asyncio.Queue, item: object) -> None:
        """Any thread. Dropped silently once the loop is closed (nobody listens)."""
        with self._lock:
            self._pending.append((queue, item))
            if len(self._pending) > 1:  # a drain is already scheduled
                return
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed
            with self._lock:
                self._pending.clear()

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for queue, item in batch:
            queue.put_nowait(item)


@dataclass
class AsyncStream:
    """Async iterator over one request's outputs; ``put`` may be called from any thread."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    _queue: asyncio.Queue[RequestOutput] = field(default_factory=asyncio.Queue)
    dispatcher: LoopDispatcher | None = None  # None: a private one on ``loop``

    def __post_init__(self) -> None:
        if self.dispatcher is None:
            self.dispatcher = LoopDispatcher(self.loop)

    def put(self, out: RequestOutput) -> None:
        self.dispatcher.put(self._queue, out)

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

    def on_token(self, inter_token_latency: float, num_tokens: int = 1) -> None:
        """``num_tokens`` more output tokens arrived together (more than one after a
        verified speculative draft), ``inter_token_latency`` after the previous ones."""

    def on_spec_decode(self, num_draft_tokens: int, num_accepted_tokens: int,
                       grammar: str = "none") -> None:
        """A speculative draft was verified: its length and how many of its tokens were
        kept (they are the first ``num_accepted_tokens``). ``grammar``: what constrained
        the sequence ("none", "thinking", or engine.structured.spec.KINDS)."""

    def on_prediction(self, num_accepted: int, num_rejected: int) -> None:
        """Of a verified draft's tokens taken from the request's predicted output,
        ``num_accepted`` were kept and ``num_rejected`` were not."""

    def on_finished(self, reason: FinishReason, e2e: float, num_output_tokens: int,
                    tag: str = "") -> None:
        """``tag``: the request's (Engine.add_request), e.g. the API it came through."""

    def on_preempted(self, num_requests: int) -> None:
        """Running requests lost their KV blocks to make room (they recompute later)."""

    def on_prefix_cache(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        """Admitted requests looked up the prefix cache: their tokens, and how many of
        those were found computed."""

    def on_step(self, seconds: float, num_decode_rows: int, num_prefill_tokens: int) -> None:
        """One engine step ran (model forward, sampling and outputs): its wall time, its
        one-token decode rows and its prompt (prefill or recompute) tokens."""
