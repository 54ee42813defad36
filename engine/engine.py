"""The engine: a thread that loops schedule -> runner.run -> sample -> postprocess.

Other threads talk to it only through :meth:`Engine.add_request` and :meth:`Engine.abort`,
which put work in a lock-protected inbox and wake the loop. Outputs leave through each
request's sink (see engine/stream.py). A failure inside one request (its chunk of the
forward pass, its sampling, its detokenization) ends that request with an error and leaves
the others running; an error outside that isolation kills the loop and flips ``state`` to
"dead" (the service's /health reports it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.kv.block_allocator import BlockAllocator
from engine.kv.prefix_cache import PrefixCache
from engine.postprocess import LiveRequest, StepRunner
from engine.request import (
    EngineUnavailableError,
    FinishReason,
    InvalidRequestError,
    QueueFullError,
    Request,
)
from engine.sampler import Sampler
from engine.scheduler import KvCapacityError, Scheduler
from engine.spec.constraint import draft_constraint
from engine.spec.decoder import DraftLimits, SpecDecoder
from engine.stream import EngineObserver, OutputSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineStats:
    state: str  # "ready" | "draining" | "dead"
    num_running: int
    num_waiting: int  # queued or preempted, including not yet picked up from the inbox
    kv_cache_usage: float  # 0.0 .. 1.0


class Engine:
    def __init__(self, runner: Any, tokenizer: Any, config: EngineConfig, *,
                 max_queue: int | None = None, observer: EngineObserver | None = None,
                 sampler: Callable[..., Any] | None = None,
                 detokenizer: Callable[..., Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.max_queue = max_queue
        self.clock = clock
        self.observer = observer or EngineObserver()
        allocator = BlockAllocator(runner.num_kv_blocks, runner.block_size)
        cache = (PrefixCache(allocator, getattr(runner, "kv_dtype", "bfloat16"),
                             by_role=getattr(runner, "rows_by_role", False))
                 if config.enable_prefix_caching else None)
        # drafts: --speculative-config's for every request, predicted outputs' for those
        # that bring one (engine/spec/decoder.py)
        self.spec = SpecDecoder(config.speculative_config, config.max_model_len)
        self.scheduler = Scheduler(allocator, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_prefill_tokens_with_decodes or None, cache,
                                   drafter=self._drafts, policy=config.scheduling_policy)
        if config.speculative_config is not None:
            log.info("speculative decoding: %s", config.speculative_config.to_json())
        log.info("prefix caching %s (%d KV blocks of %d tokens)",
                 "on" if cache is not None else "off", allocator.num_blocks,
                 allocator.block_size)
        if (capacity := allocator.num_blocks * allocator.block_size) < config.max_model_len:
            log.warning("the KV cache holds %d tokens, fewer than max_model_len %d: a "
                        "request needing more is a 400 (raise --kv-cache-gib, or lower "
                        "--max-model-len)", capacity, config.max_model_len)
        self.steps = StepRunner(runner, tokenizer, config.max_model_len, self.observer, clock,
                                sampler=sampler or Sampler(tokenizer.eos_token_ids,
                                                           config.logprobs_mode),
                                detokenizer=detokenizer, spec=self.spec)
        self._live: dict[str, LiveRequest] = {}  # engine thread only
        self._lock = threading.Condition()
        self._inbox: list[LiveRequest] = []
        self._aborts: list[str] = []
        self._end_all: str | None = None  # end_all's message, until the engine thread acts
        self._resets: list[Future[int]] = []  # reset_prefix_cache calls to answer
        self._stats = EngineStats("ready", 0, 0, 0.0)
        self._stop = False
        self._next_seq = 0
        self._thread: threading.Thread | None = None
        self.death: str | None = None

    # ---- any thread -------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: Any,
                    sink: OutputSink, timeout: float | None = None,
                    cache_salt: str | None = None, images: tuple[Any, ...] = (),
                    tag: str = "", prediction: tuple[int, ...] = (),
                    priority: int = 0, count_refusal: bool = True,
                    drain_ok: bool = False) -> None:
        """Queue a request. Raises InvalidRequestError, QueueFullError or
        EngineUnavailableError (and the observer counts the rejection). Requests with
        different ``cache_salt`` never share prefix-cache blocks. ``images``: encoded
        engine.vision.prompt_image.PromptImage in prompt order (features [T, H] bf16).
        ``tag`` comes back to the observer's on_finished (a metrics label).
        ``prediction``: token ids of the output the client expects (predicted outputs:
        drafts, engine/spec/prediction.py); it never changes what is generated.
        ``priority``: lower runs first under priority scheduling; it must be 0 under FCFS
        (InvalidRequestError naming ``priority``). ``count_refusal`` False: a refusal is
        not counted (a caller's own submission that no client sees refused, such as a
        beam search's next step, which waits out a full queue). ``drain_ok``: taken while
        the engine drains (a request the server admitted before the drain began: one still
        being prepared, or a beam search's next step), refused only once it is dead."""
        try:
            if priority and not self.scheduler.by_priority:
                raise InvalidRequestError(
                    f"priority {priority} needs priority scheduling, and this server "
                    "schedules first come, first served (--scheduling-policy priority)",
                    "priority")
            live = self._validate(request_id, prompt_ids, params, sink, timeout, cache_salt,
                                  images, tag, drain_ok)
            live.req.prediction_ids = tuple(prediction)
            live.req.priority = priority
            with self._lock:
                self._check_queue()
                self._inbox.append(live)
                self._lock.notify()
        except Exception as exc:
            if count_refusal:
                self.observer.on_rejected(type(exc).__name__)
            raise

    def _check_queue(self, count: int = 1) -> None:
        """Caller holds the lock. Only requests that will find no free slot count as
        queued: pending - free slots must stay below max_queue (with ``count`` more)."""
        if self.max_queue is None:
            return
        s = self._stats
        free = max(0, self.config.max_num_seqs - s.num_running)
        if len(self._inbox) + s.num_waiting - free + count - 1 >= self.max_queue:
            raise QueueFullError(f"{self.max_queue} requests already waiting")

    def check_room(self, count: int) -> None:
        """QueueFullError (counted as one refusal) unless ``count`` requests fit now: what
        a request of several choices checks before it adds the first, so it is refused
        whole instead of part-queued and rolled back."""
        try:
            with self._lock:
                self._check_queue(count)
        except QueueFullError:
            self.observer.on_rejected(QueueFullError.__name__)
            raise

    def _validate(self, request_id: str, prompt_ids: list[int], params: Any,
                  sink: OutputSink, timeout: float | None,
                  cache_salt: str | None = None, images: tuple[Any, ...] = (),
                  tag: str = "", drain_ok: bool = False) -> LiveRequest:
        state = self.stats().state
        if state != "ready" and not (state == "draining" and drain_ok):
            raise EngineUnavailableError(f"engine is {state}", state)
        max_tokens = self.output_budget(len(prompt_ids), params.max_tokens,
                                        default=params.default_max_tokens)
        if params.min_tokens > max_tokens:  # no max_tokens: what max_model_len leaves
            raise InvalidRequestError(f"min_tokens: {params.min_tokens} exceeds max_tokens "
                                      f"{max_tokens} (none sent: the model's default or the "
                                      f"room the prompt of {len(prompt_ids)} tokens leaves)",
                                      "min_tokens")
        now = self.clock()
        req = Request(request_id, tuple(prompt_ids), params, arrival_time=now,
                      deadline=None if timeout is None else now + timeout,
                      cache_salt=cache_salt, images=tuple(images), tag=tag)
        if images:
            from engine.vision.prompt_image import check_layout

            try:
                check_layout(req.images, req.prompt_ids, None)
            except ValueError as exc:
                raise InvalidRequestError(str(exc), "messages") from exc
        return self.steps.make_live(req, sink, max_tokens)

    def output_budget(self, num_prompt: int, asked: int | None, count: bool = False,
                      default: int | None = None) -> int:
        """The output budget of a request with a prompt of ``num_prompt`` tokens; raises
        InvalidRequestError naming the parameter. ``asked`` None means as many as
        max_model_len and the KV cache allow, and at most ``default`` (the model's limit,
        SamplingParams.default_max_tokens). ``count``: a refusal counts as one (a caller
        that checks before its own submissions: add counts its own)."""
        try:
            budget = self._output_budget(num_prompt, asked)
            return budget if asked is not None or default is None else min(budget, default)
        except InvalidRequestError as exc:
            if count:
                self.observer.on_rejected(type(exc).__name__)
            raise

    def _output_budget(self, num_prompt: int, asked: int | None) -> int:
        limit = self.config.max_model_len
        cap = self.scheduler.allocator.num_blocks * self.scheduler.allocator.block_size
        # a prompt that alone leaves no room for one token is the prompt's fault, whatever
        # max_tokens says (a client that lowers max_tokens on its param would retry in vain)
        if num_prompt == 0:  # no token to attend to, nothing to predict from
            raise InvalidRequestError("prompt: the prompt is empty (0 tokens): give at least "
                                      "one token (this tokenizer adds no BOS token)", "prompt")
        if num_prompt >= limit:
            raise InvalidRequestError(f"prompt ({num_prompt} tokens) leaves no room to "
                                      f"generate within max_model_len {limit}", "prompt")
        if num_prompt >= cap:
            raise InvalidRequestError(f"prompt ({num_prompt} tokens) leaves no room to "
                                      f"generate within the KV cache capacity of {cap} "
                                      "tokens", "prompt")
        if asked is None:
            asked = min(limit, cap) - num_prompt
        if num_prompt + asked > limit:
            raise InvalidRequestError(
                f"prompt ({num_prompt} tokens) + max_tokens ({asked}) exceeds "
                f"max_model_len {limit}", "max_tokens")
        try:
            self.scheduler.check_fits(num_prompt, asked)
        except KvCapacityError as exc:
            raise InvalidRequestError(str(exc), "max_tokens") from exc
        return asked

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
            self._lock.notify()

    def end_all(self, message: str) -> None:
        """End every request in flight (running, waiting, or just added) with an error of
        ``message``: what a stream then sends is its error event, a whole answer its
        error. A drain that ran out of time calls this; new requests are refused already."""
        with self._lock:
            self._end_all = message
            self._lock.notify()

    def reset_prefix_cache(self, timeout: float = 10.0) -> int:
        """Drop every cached KV block (blocks running requests hold stay theirs); blocks
        until the engine thread has done it and returns how many were dropped. Raises
        EngineUnavailableError when the engine is dead or does not answer in time."""
        if self.stats().state == "dead":
            raise EngineUnavailableError("engine is dead", "dead")
        done: Future[int] = Future()
        with self._lock:
            self._resets.append(done)
            self._lock.notify()
        try:
            return done.result(timeout)
        except FutureTimeout as exc:
            raise EngineUnavailableError("engine did not answer in time",
                                         self.stats().state) from exc

    def stats(self) -> EngineStats:
        with self._lock:
            s = self._stats
            return EngineStats(s.state, s.num_running, s.num_waiting + len(self._inbox),
                               s.kv_cache_usage)

    @property
    def num_unfinished(self) -> int:
        s = self.stats()
        return s.num_running + s.num_waiting

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fp8serve-engine", daemon=True)
        self._thread.start()

    def begin_drain(self) -> None:
        """Refuse new requests from now on; in-flight ones keep running."""
        with self._lock:
            if self._stats.state == "ready":
                self._set_stats(state="draining")

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- engine thread ----------------------------------------------------------------

    def step(self) -> int:
        """One engine iteration; returns the number of sequences that ran."""
        self._take_inbox()
        self._expire()
        out = self.scheduler.schedule()
        if out is not None and out.cache_queries:
            self.observer.on_prefix_cache(out.cache_queries, out.cache_hits)
        if out is not None and out.preempted:
            self.observer.on_preempted(len(out.preempted))
        if out is not None:
            t0 = time.perf_counter()
            for req in self.steps.run(out, self._live):
                self._finish(req)
            if out.num_decodes and not out.num_prefill_tokens:
                self.spec.step_timed(out.batch.num_tokens, time.perf_counter() - t0)
        self._publish_stats()
        return 0 if out is None else len(out.requests)

    def _loop(self) -> None:
        try:
            if self.config.seed is not None:  # unseeded requests draw from torch's state
                import torch

                torch.manual_seed(self.config.seed % 2**64)
            while True:
                with self._lock:
                    while not (self._stop or self._inbox or self._aborts or self._resets
                               or self._live or self._end_all):
                        self._lock.wait()
                    if self._stop:
                        break
                self.step()
        except BaseException as exc:  # noqa: BLE001 - any escape kills the engine
            log.exception("engine loop died")
            self._die(f"{type(exc).__name__}: {exc}")

    def _take_inbox(self) -> None:
        with self._lock:  # queue and stats change together, so _check_queue sees both
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            resets, self._resets = self._resets, []
            end_all, self._end_all = self._end_all, None
            for live in new:
                live.req.seq_id = self._next_seq
                self._next_seq += 1
                self._live[live.req.request_id] = live
                self.scheduler.add(live.req)
            self._set_stats()
        for rid in aborts:
            live = self._live.get(rid)
            if live is not None:
                self.steps.end(live, FinishReason.ABORT, None)
                self._finish(live.req)
        for done in resets:
            done.set_result(self.scheduler.reset_prefix_cache())
        if end_all is not None:
            for live in list(self._live.values()):
                self.steps.end(live, FinishReason.ERROR, end_all)
                self._finish(live.req)

    def _expire(self) -> None:
        now = self.clock()
        for live in list(self._live.values()):
            deadline = live.req.deadline
            if deadline is not None and now >= deadline:
                self.steps.end(live, FinishReason.TIMEOUT, "request timed out")
                self._finish(live.req)

    def _finish(self, req: Request) -> None:
        self.scheduler.remove(req)
        self._live.pop(req.request_id, None)
        self.spec.release(req.seq_id)

    def _drafts(self, reqs: list[Request]) -> list[tuple[int, ...]]:
        """The scheduler's drafter: a proposal for each of this step's decodes."""
        may = [self.spec.may_draft(bool(r.prediction_ids)) for r in reqs]
        if not any(may):
            return [() for _ in reqs]
        limits = []
        for req, ok in zip(reqs, may, strict=True):
            lv = self._live[req.request_id]
            c = None if not ok else draft_constraint(
                lv.matcher, getattr(req.params, "thinking", None), req.output_ids)
            limits.append(DraftLimits(req.seq_id, req.prompt_ids, req.output_ids,
                                      lv.max_tokens if ok else 0, c, req.prediction_ids))
        return self.spec.drafts(limits, len(self.scheduler.running))

    def _publish_stats(self) -> None:
        with self._lock:
            self._set_stats()

    def _set_stats(self, state: str | None = None) -> None:
        """Caller holds the lock."""
        self._stats = EngineStats(
            state or self._stats.state, len(self.scheduler.running),
            len(self.scheduler.waiting), self.scheduler.allocator.usage)

    def _die(self, reason: str) -> None:
        self.death = reason
        for live in list(self._live.values()):
            self.steps.end(live, FinishReason.ERROR, f"engine died: {reason}")
        self._live.clear()
        with self._lock:
            self._set_stats(state="dead")
            stranded, self._inbox = self._inbox, []
        for live in stranded:
            self.steps.end(live, FinishReason.ERROR, f"engine died: {reason}")
