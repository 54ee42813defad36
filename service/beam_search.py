"""vLLM's ``use_beam_search`` on /v1/completions and /v1/chat/completions: ``n`` beams per
prompt (the width), searched by engine.beam.BeamSearch on the engine's next-token
logprobs, returned as the ``n`` choices, best first.

As vLLM does it, each step is one engine request per live beam: its prompt is the
request's prompt and the beam's tokens, one token long, asking for the 2 x width likeliest
next tokens (greedy, no penalties: the model's own log-probabilities). The prefix cache
holds what earlier steps computed, so a step prefills the last block's tokens only. Every
prompt's search runs at once, its steps batched with the rest of the server's work.

:class:`BeamSubmission` answers as service.generation.Submission does (one output per
choice, finished), so every route, stream and formatter takes it unchanged: a beam's text
is final only when the search ends, so a stream carries each choice whole in one chunk.

A request field beam search cannot honour is a 400 naming it (:func:`check_beam_fields`):
it ranks beams by the model's log-probabilities, so every field that changes them, stop
strings, constraints and prompt logprobs are refused; ``seed`` changes nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine.beam import Beam, BeamSearch
from engine.request import EngineError, FinishReason, QueueFullError
from engine.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.stream import RequestOutput, TokenLogprob
from engine.text.detokenizer import IncrementalDetokenizer
from service.backend import ServingState
from service.best_of import check_ranked_by_logprobs
from service.errors import APIError
from service.generation import Choices, Submission, check_priority

MAX_WIDTH = MAX_LOGPROBS // 2  # 2 x width candidates are asked for per beam
BEAM_STEP_API = "beam_search"  # the api label of the step requests' metrics
QUEUE_RETRY_S = 0.05  # first wait before a step refused by a full queue is tried again

# fields beam search cannot honour, and the values it can (what it does anyway)
_FIXED: dict[str, tuple[Any, ...]] = {
    "temperature": (0, 1),  # the model's logprobs are those at temperature 1
    "top_p": (1,), "top_k": (-1, 0), "min_p": (0,),
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,),
    "logit_bias": (None, {}), "allowed_token_ids": (None,), "bad_words": (None, []),
    "min_tokens": (0,), "stop": (None, []), "prompt_logprobs": (None,),
    "prediction": (None,), "thinking_token_budget": (None, -1),
}
_WHY = {"temperature": "beams are ranked by the model's own log-probabilities, those at "
                       "temperature 1: 0 and 1 are taken",
        "stop": "beams end on stop tokens only (EOS, stop_token_ids), not on stop strings",
        "prompt_logprobs": "it returns the beams' own logprobs only",
        "prediction": "drafts are for sampled decoding",
        "thinking_token_budget": "a cap on reasoning needs one sampled output"}


@dataclass(frozen=True)
class BeamRequest:
    """What a request asks of beam search: ``width`` beams (n) of at most ``max_tokens``
    (None: up to max_model_len), ``shown`` top logprobs per token (None: none shown).
    A beam ends on one of ``eos_ids`` (empty with ignore_eos) or ``stop_token_ids``."""

    width: int
    max_tokens: int | None
    length_penalty: float
    eos_ids: frozenset[int]
    stop_token_ids: frozenset[int]
    shown: int | None
    skip_special_tokens: bool
    include_stop: bool = False  # an ending stop token id's text (include_stop_str_in_output)
    default_max_tokens: int | None = None  # SamplingParams': the model's, when max_tokens None

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.eos_ids | self.stop_token_ids


def check_beam_fields(body: Any, refused: str | None = None,
                      best_of: int | None = None) -> None:
    """A 400 naming the first field of ``body`` (a completion or chat request with
    use_beam_search) that beam search cannot honour. ``refused``: the field that put a
    grammar on the output or a cap on reasoning, if one did."""
    if body.n > MAX_WIDTH:
        raise APIError(400, f"n: use_beam_search keeps at most {MAX_WIDTH} beams (it asks "
                       f"for 2 x n of the likeliest next tokens, at most {MAX_LOGPROBS})",
                       "n")
    if best_of is not None and best_of != body.n:
        raise APIError(400, "best_of: with use_beam_search n is the beam width and every "
                       "beam is returned; leave best_of out or send n", "best_of")
    for name, allowed in _FIXED.items():
        value = getattr(body, name, None)
        if value not in allowed:
            why = _WHY.get(name, "beams are ranked by the model's own log-probabilities")
            raise APIError(400, f"{name}: {value!r} is not for use_beam_search ({why}); "
                           f"leave it out", name)
    if refused is not None:
        raise APIError(400, f"{refused}: not with use_beam_search (a constrained output "
                       "or a cap on reasoning needs one sampled output)", refused)


def beam_request(state: ServingState, body: Any, params: SamplingParams,
                 shown: int | None) -> BeamRequest:
    """``params``: the request's (its output limits)."""
    eos = frozenset() if body.ignore_eos else frozenset(state.backend.tokenizer.eos_token_ids)
    return BeamRequest(body.n, params.max_tokens, body.length_penalty, eos,
                       frozenset(body.stop_token_ids or ()), shown, body.skip_special_tokens,
                       bool(body.include_stop_str_in_output), params.default_max_tokens)


@dataclass
class _Search:
    prompt: list[int]
    search: BeamSearch
    cached: int = 0  # the prompt's tokens the first step found in the prefix cache


class BeamSubmission(Choices):
    """Every prompt's beam search of one HTTP request; ``ids`` has ``width`` choices per
    prompt (choice index = prompt index x width + rank), answered as a Submission's."""

    def __init__(self, state: ServingState, prefix: str, prompts: list[list[int]],
                 beam: BeamRequest, cache_salt: str | None = None,
                 images: tuple[Any, ...] = (), priority: int = 0) -> None:
        check_priority(state, priority)
        check_ranked_by_logprobs(state, "use_beam_search")
        cfg = state.settings
        if cfg.max_queue is not None and beam.width > cfg.max_num_seqs + cfg.max_queue:
            raise APIError(400, f"n: use_beam_search with {beam.width} beams makes "
                           f"{beam.width} requests at once, and this server runs "
                           f"{cfg.max_num_seqs} and queues {cfg.max_queue} (--max-num-seqs, "
                           "--max-queue)", "n")
        self.state = state
        self.prefix = prefix
        self.beam = beam
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kw: dict[str, Any] = {"cache_salt": cache_salt, "images": images,
                                   "priority": priority}
        self.searches = []
        for prompt in prompts:
            budget = state.engine.output_budget(len(prompt), beam.max_tokens, count=True,
                                                default=beam.default_max_tokens)
            search = BeamSearch(len(prompt), beam.width, budget, beam.stop_ids,
                                beam.length_penalty)
            self.searches.append(_Search(prompt, search))
        self.ids = [f"{self.id}-{i}" for i in range(len(prompts) * beam.width)]
        self.open = set(range(len(self.ids)))
        self._steps: set[Submission] = set()
        self._aborted = False
        self._task: asyncio.Task[list[tuple[int, RequestOutput]]] | None = None
        self._made = 0  # steps submitted (each step's requests get their own ids)
        # --request-timeout bounds the whole search: each step gets what is left
        timeout = state.settings.request_timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        # the first step goes in now: a refusal (queue full, no room) is the request's
        self._first: list[Submission] = []
        try:
            for s in self.searches:
                self._first.append(self._submit(s))
        except BaseException:
            self.abort_all()
            raise

    def _step_params(self) -> SamplingParams:
        k = max(self.searches[0].search.candidates, self.beam.shown or 0)
        return SamplingParams(max_tokens=1, temperature=0.0, logprobs=k)

    def _submit(self, s: _Search, count_refusal: bool = True) -> Submission:
        """The search's next step, submitted; ``count_refusal`` False for a step the search
        retries on a full queue (no client sees that refusal; the first step's is the
        request's own)."""
        sub = Submission(self.state, self.prefix)
        sub.id = f"{self.id}-step{self._made}"  # the request's id, in logs too
        sub.api = BEAM_STEP_API
        self._made += 1
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise _Failed(RequestOutput(self.id, finished=True,
                                            finish_reason=FinishReason.TIMEOUT,
                                            error="request timed out"))
            sub.timeout = left
        params = self._step_params()
        try:
            for beam in s.search.live:
                sub.add(s.prompt + list(beam.tokens), params, count_refusal=count_refusal,
                        **self.kw)
        except BaseException:
            sub.abort_all()
            raise
        self._steps.add(sub)
        return sub

    async def _candidates(self, sub: Submission
                          ) -> tuple[list[tuple[tuple[int, float], ...]], int]:
        """Each live beam's candidates from one step's outputs, and the prompt tokens the
        first beam found cached; an engine error, a timeout or an abort ends the search
        (:class:`_Failed`)."""
        got: list[tuple[tuple[int, float], ...] | None] = [None] * len(sub.ids)
        first_cached: int | None = None
        try:
            async for i, out in sub:
                if out.finish_reason in _ENDS:
                    raise _Failed(out)
                if out.logprobs:
                    got[i] = out.logprobs[0].top
                if i == 0 and first_cached is None:
                    first_cached = out.num_cached_tokens
        finally:
            sub.abort_all()
            self._steps.discard(sub)
        missing = [i for i, g in enumerate(got) if g is None]
        if missing:
            raise _Failed(RequestOutput(sub.id, finished=True, finish_reason=FinishReason.ERROR,
                                        error=f"beam search: no logprobs for beam {missing[0]}"))
        return got, first_cached or 0  # type: ignore[return-value]

    async def _run_one(self, s: _Search, first: Submission) -> None:
        sub = first
        try:
            while True:
                candidates, cached = await self._candidates(sub)
                s.search.advance(candidates)
                if s.search.steps == 1:
                    s.cached = cached
                if s.search.done:
                    return
                sub = await self._next_step(s)
        except BaseException:
            self.abort_all()  # the request failed: the other prompts' searches stop too
            raise

    async def _next_step(self, s: _Search) -> Submission:
        """The search's next step, submitted; a full queue (--max-queue: the server's
        other requests) is waited out, retried until the request's deadline."""
        wait = QUEUE_RETRY_S
        while True:
            if self._aborted:
                raise _Failed(RequestOutput(self.id, finished=True,
                                            finish_reason=FinishReason.ABORT))
            try:
                return self._submit(s, count_refusal=False)
            except QueueFullError:
                await asyncio.sleep(wait)  # _submit raises TIMEOUT past the deadline
                wait = min(2 * wait, 1.0)
            except EngineError as exc:
                raise _Failed(RequestOutput(
                    self.id, finished=True, finish_reason=FinishReason.ERROR,
                    error=f"beam search step refused: {exc}")) from exc

    async def _run(self) -> list[tuple[int, RequestOutput]]:
        results = await asyncio.gather(
            *(self._run_one(s, f) for s, f in zip(self.searches, self._first, strict=True)),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            bugs = [e for e in errors if not isinstance(e, _Failed)]
            if bugs:
                raise bugs[0]
            # what ended the request: the first error or timeout, else the abort
            ends = sorted((e.out for e in errors if isinstance(e, _Failed)),
                          key=lambda o: o.finish_reason is FinishReason.ABORT)
            return [(i, RequestOutput(rid, finished=True, finish_reason=ends[0].finish_reason,
                                      error=ends[0].error)) for i, rid in enumerate(self.ids)]
        out = []
        for p, s in enumerate(self.searches):
            for rank, beam in enumerate(s.search.best()):
                out.append((p * self.beam.width + rank, self._output(s, beam)))
        # fewer beams than the width can survive (a vocabulary of stop tokens): the rest
        # of the choices end empty
        made = {i for i, _ in out}
        out += [(i, RequestOutput(rid, finished=True, finish_reason=FinishReason.STOP))
                for i, rid in enumerate(self.ids) if i not in made]
        return sorted(out, key=lambda x: x[0])

    def _output(self, s: _Search, beam: Beam) -> RequestOutput:
        """A finished beam as one output: its text as a plain generation of the same
        tokens reads (an ending EOS is never text, an ending stop token id only with
        include_stop_str_in_output), its logprobs when asked for."""
        detok = IncrementalDetokenizer(self.state.backend.tokenizer, s.prompt,
                                       skip_special_tokens=self.beam.skip_special_tokens)
        last = beam.tokens[-1] if beam.stopped else None
        # as a plain generation reads it: EOS first (stop_reason null), then a stop token id
        by_token = last in self.beam.stop_token_ids and last not in self.beam.eos_ids
        quiet_end = beam.stopped and not (by_token and self.beam.include_stop)
        text = "".join(detok.push(t).new_text
                       for t in (beam.tokens[:-1] if quiet_end else beam.tokens))
        text += detok.flush()
        lps: tuple[TokenLogprob, ...] = ()
        if self.beam.shown is not None:
            lps = tuple(TokenLogprob(t, dict(c)[t], c[:self.beam.shown])
                        for t, c in zip(beam.tokens, beam.steps, strict=True))
        stop_reason = last if by_token else None
        reason = FinishReason.STOP if beam.stopped else FinishReason.LENGTH
        return RequestOutput(self.id, text, beam.tokens, lps, True, reason, None,
                             len(s.prompt), len(beam.tokens), stop_reason,
                             num_cached_tokens=s.cached)

    def abort_all(self) -> None:
        """Stop every search: the steps in flight are aborted, and the choices end
        with finish reason abort."""
        self._aborted = True
        for sub in list(self._steps):
            sub.abort_all()

    async def batches(self, idle: float | None = None
                      ) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
        """Every choice's one output when every search has ended (an empty batch after
        each ``idle`` seconds before that, when given)."""
        if not self.open:
            return
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        while True:
            done, _ = await asyncio.wait({self._task}, timeout=idle)
            if done:
                break
            yield []
        outs = self._task.result()
        self.open.clear()
        yield outs


_ENDS = (FinishReason.ERROR, FinishReason.TIMEOUT, FinishReason.ABORT)


class _Failed(Exception):
    def __init__(self, out: RequestOutput) -> None:
        super().__init__(out.error)
        self.out = out
