"""Background responses (the Responses API's ``background: true``): the run goes on after
the request that started it returns, and clients poll ``GET /v1/responses/{id}``, follow
its events (``?stream=true&starting_after=N``) or ``POST .../cancel`` it.

A job runs one response's engine requests on the event loop as a task, feeding every
output through the response's ResponseStream (service/translate/responses_stream.py), so
it answers with the same items, in the same order, as a foreground run of the request.
Its status goes ``queued`` (nothing generated yet), ``in_progress``, then one of
``completed``, ``incomplete`` (max_output_tokens), ``failed`` (an engine error or the
request timeout) or ``cancelled``. A client that leaves a background stream leaves the
run going; only cancel (or DELETE, or the server's shutdown) stops it.

While it runs, a job is in the running jobs (service/store/jobs.py, per API key, as the
store is); when
it ends, the finished response goes to the response store (service/store/responses.py)
with its events when it was created with ``stream: true`` (they count in the store's
budget), and the job is dropped.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from engine.request import FinishReason
from service.collect import early_end_error, end_code
from service.generation import Submission
from service.sse import Event, named_sse
from service.translate.refusals import in_responses
from service.translate.responses_stream import ResponseStream

log = logging.getLogger(__name__)

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


class BackgroundJob:
    """One background response: ``enc`` encodes it, ``sub`` holds its engine request;
    ``on_end(job)`` is called once with the final response (every terminal status);
    ``input_items``: the request's own items, each with its id."""

    def __init__(self, tenant: str, enc: ResponseStream, sub: Submission, keep_events: bool,
                 on_end: Callable[[BackgroundJob], None],
                 input_items: Sequence[dict[str, Any]] = ()) -> None:
        self.tenant, self.enc, self.sub = tenant, enc, sub
        self.keep_events = keep_events
        # the request's own input items as listed (each with its id), as the store keeps
        # them once the run ends: GET .../input_items reads them while it runs
        self.input_items = tuple(input_items)
        self.on_end = on_end
        enc.response["status"] = "queued"
        snap = {**enc.response, "output": []}
        # each event as its SSE frame, written when it happens: frames[i] is the event
        # whose sequence_number is i; kept for a response created with stream only (no
        # other is streamed again)
        self.frames: list[str] = []
        self.emitted = 0  # events emitted: the next one's sequence_number
        self._changed = asyncio.Event()
        self._emit([enc.ev("response.created", response=snap),
                    enc.ev("response.queued", response=snap)])
        self.task: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self.enc.response["id"]

    @property
    def status(self) -> str:
        return self.enc.response["status"]

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def snapshot(self) -> dict[str, Any]:
        """The response as it stands (a copy: the run goes on changing it)."""
        return copy.deepcopy(self.enc.response)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def _emit(self, events: list[Event]) -> None:
        self.emitted += len(events)
        if self.keep_events:
            self.frames += [named_sse([e]) for e in events]
        self._changed.set()

    async def _run(self) -> None:
        events: list[Event] = []  # the batch's events, numbered, not yet emitted
        try:
            async for batch in self.sub.batches():
                events = []
                if batch and self.status == "queued":
                    self.enc.response["status"] = "in_progress"
                    events.append(self.enc.ev("response.in_progress", response={
                        **self.enc.response, "output": []}))
                for _, out in batch:
                    if out.finish_reason in (FinishReason.ERROR, FinishReason.TIMEOUT):
                        exc = in_responses(early_end_error(out, self.sub.grammar_param))
                        self._emit(events)
                        self._fail(exc.message, exc.code)
                        return
                    events += self.enc.chunk(out)
                self._emit(events)
                events = []
                if self.done:  # completed or incomplete
                    self.on_end(self)
                    return
            self._fail("generation ended without a final output", end_code(500))
        except asyncio.CancelledError:
            self.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the job must end, and say why
            log.exception("background response %s failed", self.id)
            # the batch's events so far go out before the failure, and numbers a call
            # took before it raised are given back: sequence numbers stay gapless, so
            # frames[i] is still event i (starting_after replays from the right place)
            self._emit(events)
            self.enc.seq = self.emitted
            self._fail(f"{type(exc).__name__}: {exc}", end_code(500))
        finally:
            self.sub.abort_all()

    def _fail(self, message: str, code: str | None) -> None:
        """End ``failed``; ``error.code`` is the code a foreground answer's error has for
        the same end (collect.end_code: ``engine_error``, ``timeout``; null for the
        request's own input, a grammar no output completes, whose message names the
        field), not the error's type."""
        if self.done:
            return
        self.enc.interrupt()
        r = self.enc.response
        r["status"], r["error"] = "failed", {"code": code, "message": message}
        self._end([self.enc.ev("response.failed", response=r)])

    def cancel(self) -> bool:
        """Stop the run; False when it had already ended."""
        if self.done:
            return False
        self.sub.abort_all()
        self.enc.interrupt()
        self.enc.response["status"] = "cancelled"
        self._end([self.enc.ev("response.cancelled", response=self.enc.response)])
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        return True

    def _end(self, events: list[Event]) -> None:
        self._emit(events)
        self.on_end(self)

    async def follow(self, after: int = -1) -> AsyncIterator[str]:
        """SSE frames of the events with a sequence_number above ``after``, as they come,
        until the last."""
        at = after + 1
        while True:
            self._changed.clear()
            if at < len(self.frames):
                chunk, at = "".join(self.frames[at:]), len(self.frames)
                yield chunk
            elif self.done:
                return
            else:
                await self._changed.wait()
