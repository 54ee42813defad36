"""One HTTP request's engine requests (prompts x n), merged into one async stream: the
:class:`Choices` routes read, the :class:`Submission` that queues them (seeds per choice,
a prompt scored once for its n choices, the stream interval) and the checks that refuse a
request before any of it is queued (priority, more choices than fit). Whatever way the
HTTP side ends, the reader aborts every unfinished engine request (service/collect.py,
service/sse.py), so its slot and KV blocks are freed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from engine.sampling_params import SamplingParams
from engine.stream import LoopDispatcher, RequestOutput, TokenLogprob
from service.backend import ADMITTED_BEFORE_DRAIN, ServingState
from service.errors import APIError

# request id prefix -> the API label of its metrics (service/metrics.py)
API_OF_PREFIX = {"cmpl": "completions", "chatcmpl": "chat", "msg": "messages",
                 "resp": "responses"}


class Choices:
    """What routes read a request's choices from: ``ids`` (one per choice), ``batches``
    of (choice index, output), ``abort_all``. A Submission, or a beam search
    (service/beam_search.py) that answers the same way."""

    id: str
    ids: list[str]
    # the request field that built the choices' grammar (tools, response_format,
    # structured_outputs, ...): what a grammar dead end met while generating names
    grammar_param: str | None = None

    def batches(self, idle: float | None = None
                ) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
        raise NotImplementedError

    def abort_all(self) -> None:
        raise NotImplementedError

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        async for batch in self.batches():
            for item in batch:
                yield item


class Submission(Choices):
    def __init__(self, state: ServingState, prefix: str) -> None:
        self.engine = state.engine
        self.timeout = state.settings.request_timeout
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.api = API_OF_PREFIX.get(prefix, "")
        self.loop = asyncio.get_running_loop()
        shared = state.dispatcher
        self.dispatcher = (shared if shared is not None and shared.loop is self.loop
                           else LoopDispatcher(self.loop))
        self.queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self.ids: list[str] = []
        self.open: set[int] = set()
        # vLLM's stream_interval: a choice's outputs go out with its first token, then
        # once this many tokens have gathered, and when it ends (merged in between)
        self.interval = state.settings.stream_interval
        # taken while the engine drains: the HTTP request began before the drain
        self.drain_ok = ADMITTED_BEFORE_DRAIN.get()
        self._held: dict[int, RequestOutput] = {}
        self._sent: set[int] = set()
        # a prompt is scored once for its n choices (prompt logprobs): a choice -> its
        # prompt's first choice, whose first output carries them; the choice's outputs
        # wait for them, and its first takes them
        self.scored_by: dict[int, int] = {}
        self._scored: dict[int, tuple[TokenLogprob | None, ...] | None] = {}
        self._waiting: dict[int, RequestOutput] = {}

    def add(self, prompt_ids: list[int], params: SamplingParams,
            cache_salt: str | None = None, images: tuple[Any, ...] = (),
            prediction: tuple[int, ...] = (), priority: int = 0,
            count_refusal: bool = True) -> None:
        index = len(self.ids)
        rid = f"{self.id}-{index}"

        def sink(out: RequestOutput) -> None:
            self.dispatcher.put(self.queue, (index, out))

        kw: dict[str, Any] = {"images": images} if images else {}  # fake engines lack them
        if prediction:
            kw["prediction"] = prediction
        if priority:
            kw["priority"] = priority
        if not count_refusal:
            kw["count_refusal"] = False
        if self.drain_ok:
            kw["drain_ok"] = True
        self.engine.add_request(rid, prompt_ids, params, sink, timeout=self.timeout,
                                cache_salt=cache_salt, tag=self.api, **kw)
        self.ids.append(rid)
        self.open.add(index)

    def abort_all(self) -> None:
        for i in sorted(self.open):
            self.engine.abort(self.ids[i])

    async def batches(self, idle: float | None = None
                      ) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
        """Outputs in arrival order, grouped: everything already queued when the consumer
        comes back is one batch (a consumer that fell behind catches up in one write).
        With ``idle``, an empty batch after each ``idle`` seconds without output."""
        while self.open:
            try:
                batch = [await asyncio.wait_for(self.queue.get(), idle)]
            except TimeoutError:
                yield []
                continue
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            for index, out in batch:
                if out.finished:
                    self.open.discard(index)
            if self.scored_by:
                batch = self._shared(batch)
            if self.interval > 1:
                batch = self._paced(batch)
                if not batch:
                    continue
            yield batch

    def _shared(self, batch: list[tuple[int, RequestOutput]]
                ) -> list[tuple[int, RequestOutput]]:
        """``batch`` with the prompt logprobs of each choice that shares its prompt's
        first choice's on its first output (held back until that choice's first came)."""
        for index, o in batch:
            if index not in self.scored_by:
                self._scored.setdefault(index, o.prompt_logprobs)
        out = []
        for index, o in batch:
            if index in self.scored_by:
                held = self._waiting.pop(index, None)
                self._waiting[index] = o if held is None else merge_outputs(held, o)
            else:
                out.append((index, o))
        for index in [i for i in self._waiting if self.scored_by[i] in self._scored]:
            lps = self._scored[self.scored_by.pop(index)]
            out.append((index, replace(self._waiting.pop(index), prompt_logprobs=lps)))
        return out

    def _paced(self, batch: list[tuple[int, RequestOutput]]
               ) -> list[tuple[int, RequestOutput]]:
        """``batch`` under the stream interval: outputs held back merge into the next."""
        out = []
        for index, o in batch:
            held = self._held.pop(index, None)
            merged = o if held is None else merge_outputs(held, o)
            first = index not in self._sent and merged.token_ids
            gathered = len(merged.token_ids) >= self.interval
            if o.finished or first or gathered:
                self._sent.add(index)
                out.append((index, merged))
            else:
                self._held[index] = merged
        return out


def merge_outputs(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two consecutive increments of one request as one (``b`` the later): new pieces
    joined, cumulative counts and the ending from ``b``, the prompt's from the first."""
    return replace(b, text=a.text + b.text, token_ids=a.token_ids + b.token_ids,
                   logprobs=a.logprobs + b.logprobs,
                   prompt_logprobs=(a.prompt_logprobs if a.prompt_logprobs is not None
                                    else b.prompt_logprobs),
                   num_cached_tokens=max(a.num_cached_tokens, b.num_cached_tokens))


def check_priority(state: ServingState, priority: int) -> None:
    """vLLM's request priority: a 400 naming it unless the server schedules by it."""
    if priority and state.settings.scheduling_policy != "priority":
        raise APIError(400, f"priority: {priority} needs priority scheduling, and this "
                       "server schedules first come, first served "
                       "(--scheduling-policy priority)", "priority")


def check_choices(state: ServingState, total: int, field: str = "n") -> None:
    """A request of ``total`` choices (prompts x n, or best_of) fits the engine's slots and
    queue: more than --max-num-seqs + --max-queue never can (a 400 naming ``n``), and a
    queue without room for all of them now refuses the request whole (429, one refusal),
    not after queueing part of it."""
    cfg = state.settings
    if cfg.max_queue is not None and total > cfg.max_num_seqs + cfg.max_queue:
        raise APIError(400, f"{field}: {total} choices (prompts x {field}) are more than "
                       f"the server runs {cfg.max_num_seqs} and queues {cfg.max_queue} "
                       "(--max-num-seqs, --max-queue)", field)
    if total > 1:
        state.engine.check_room(total)


def submit(state: ServingState, prefix: str, prompts: list[list[int]],
           params: SamplingParams, n: int, cache_salt: str | None = None,
           images: tuple[Any, ...] = (), prediction: tuple[int, ...] = (),
           priority: int = 0, stream_interval: int | None = None,
           field: str = "n") -> Submission:
    """Queue n choices per prompt (choice index = prompt_index * n + j); seeded choices
    use seed + j so they differ. ``prediction``: every choice's predicted output (token
    ids). ``priority``: vLLM's, lower first; a 400 naming it unless the server schedules
    by priority. ``stream_interval``: the request's (vLLM's), else the server's. ``field``:
    what a request of more choices than ever fit names (n, best_of). On any refusal, what
    was queued is aborted."""
    check_priority(state, priority)
    check_choices(state, len(prompts) * n, field)
    sub = Submission(state, prefix)
    if stream_interval is not None:
        sub.interval = stream_interval
    try:
        for ids in prompts:
            first = len(sub.ids)
            for j in range(n):
                p = params if params.seed is None else replace(params, seed=params.seed + j)
                if j and p.prompt_logprobs is not None:  # the first choice scores the prompt
                    p = replace(p, prompt_logprobs=None)
                    sub.scored_by[len(sub.ids)] = first
                sub.add(ids, p, cache_salt, images, prediction, priority)
    except BaseException:
        sub.abort_all()
        raise
    return sub
