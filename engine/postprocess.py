"""The body of one engine step after scheduling: run the batch, sample, append tokens,
detokenize, decide who finished and emit outputs. Constrained requests (params.grammar)
carry a matcher: their rows get the grammar's token mask before sampling, the matcher
consumes each sampled token, and a complete grammar ends the request (``stop``). An EOS
that ends a request is never detokenized. Failures are isolated per request: if the
batched forward pass (or sampling) raises, each chunk is retried alone and only the
requests whose own chunk fails end with an error. Re-running a chunk is safe because the
runner writes K/V for fixed positions (same inputs give the same cache contents).

Speculative verification: engine/spec/verify.py (:class:`DraftVerifier`, a base of
:class:`StepRunner`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.request import FinishReason, Request, RequestStatus
from engine.sampler import NoTokenLeft, make_generator, token_logprobs
from engine.scheduler import SchedulerOutput
from engine.spec.verify import DraftVerifier
from engine.stream import EngineObserver, OutputSink, RequestOutput, TokenLogprob
from engine.structured.matcher import GrammarDeadEnd

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LiveRequest:
    req: Request
    sink: OutputSink
    detok: Any  # IncrementalDetokenizer: push(id) -> DetokStep(new_text, stopped); flush()
    generator: torch.Generator | None
    max_tokens: int  # params.max_tokens, or what max_model_len / the KV cache leave if None
    matcher: Any = None  # engine.structured.GrammarMatcher when params.grammar is set


def _default_detokenizer() -> Callable[..., Any]:
    from engine.text.detokenizer import IncrementalDetokenizer
    return IncrementalDetokenizer


class StepRunner(DraftVerifier):
    def __init__(self, runner: Any, tokenizer: Any, max_model_len: int,
                 observer: EngineObserver, clock: Callable[[], float], *,
                 sampler: Callable[..., Any],
                 detokenizer: Callable[..., Any] | None = None,
                 spec: Any = None) -> None:
        self.runner = runner
        self.spec = spec  # engine.spec.decoder.SpecDecoder, told what each draft kept
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.observer = observer
        self.clock = clock
        self.sampler = sampler  # engine.sampler.Sampler (a stand-in in tests)
        self.make_detok = detokenizer or _default_detokenizer()
        self.eos = frozenset(tokenizer.eos_token_ids)
        # an EOS other than the tokenizer's own ends a request with stop_reason its id
        self.primary_eos = getattr(tokenizer, "primary_eos_id", None)
        self.mask_time_s = 0.0  # total time spent filling grammar masks (for benchmarks)
        self.mask_fills = 0  # grammar masks filled (one per sampled constrained row, and
        self.draft_mask_fills = 0  # K + 1 per greedy K-token draft), and of those for rows
        # past a verified draft's first (its draft positions: at most K per draft)

    def make_live(self, req: Request, sink: OutputSink, max_tokens: int) -> LiveRequest:
        p = req.params
        detok = self.make_detok(self.tokenizer, list(req.prompt_ids), p.stop,
                                p.skip_special_tokens, p.include_stop_str_in_output,
                                p.min_tokens)
        gen = None if p.seed is None else make_generator(p.seed)
        grammar = getattr(p, "grammar", None)
        matcher = None if grammar is None else grammar.new_matcher()
        return LiveRequest(req, sink, detok, gen, max_tokens, matcher)

    def run(self, out: SchedulerOutput, live: dict[str, LiveRequest]) -> list[Request]:
        """Run one scheduled batch; returns the requests that finished this step."""
        now = self.clock()
        for req in out.requests:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
                self.observer.on_admitted(now - req.arrival_time, len(req.prompt_ids))
        logits, spans = self._forward(out)  # chunk index -> (first row, rows) or error
        finished: list[Request] = []
        sampled: list[tuple[LiveRequest, int]] = []
        verify: list[tuple[LiveRequest, int, tuple[int, ...]]] = []
        for i, (req, chunk) in enumerate(zip(out.requests, out.batch.chunks, strict=True)):
            span = spans[i]
            if isinstance(span, str):
                self.end(live[req.request_id], FinishReason.ERROR, span)
                finished.append(req)
                continue
            first, n = span
            if chunk.num_draft:
                verify.append((live[req.request_id], first, chunk.token_ids[1:]))
                continue
            if chunk.logits is LogitsWanted.ALL and not self._score_prompt(
                    live[req.request_id], chunk, logits[first:first + n]):
                finished.append(req)
                continue
            req.num_computed += chunk.num_tokens
            if n and req.num_uncomputed == 0:
                sampled.append((live[req.request_id], first + n - 1))
        finished += self._sample(logits, sampled)
        finished += self._verify(logits, verify)
        self.observer.on_step(self.clock() - now, out.num_decodes, out.num_prefill_tokens)
        return finished

    def _forward(self, out: SchedulerOutput
                 ) -> tuple[torch.Tensor, list[tuple[int, int] | str]]:
        """(logits [R, V] fp32, for each chunk (its first row in logits, its number of
        rows) or an error string)."""
        try:
            return self.runner.run(out.batch), out.logit_spans()
        except Exception:  # noqa: BLE001 - isolate the failing request(s) below
            log.exception("batched forward failed; retrying each sequence alone")
        spans: list[tuple[int, int] | str] = []
        kept: list[torch.Tensor] = []
        row = 0
        for chunk in out.batch.chunks:
            try:
                logits = self.runner.run(BatchInputs((chunk,)))
            except Exception as exc:  # noqa: BLE001
                spans.append(f"forward pass failed: {type(exc).__name__}: {exc}")
                continue
            spans.append((row, chunk.num_logit_rows))
            row += chunk.num_logit_rows
            kept.append(logits)
        return (torch.cat(kept) if kept else torch.empty(0)), spans

    def _score_prompt(self, lv: LiveRequest, chunk: SeqChunk, rows: torch.Tensor) -> bool:
        """Append the prompt logprobs this chunk's logits give: rows [chunk tokens, V],
        row t predicts position chunk.start_pos + t + 1. Positions already scored (before
        a preemption) are skipped. False when scoring failed and the request was ended."""
        req = lv.req
        got = req.prompt_logprobs
        try:
            if not got:
                got.append(None)  # the first prompt token has no context
            begin = len(got)
            end = min(chunk.start_pos + chunk.num_tokens + 1, len(req.prompt_ids))
            if begin < end:
                lo = begin - 1 - chunk.start_pos
                targets = req.prompt_ids[begin:end]
                vals, tops, ranks = token_logprobs(rows[lo:lo + len(targets)], targets,
                                                   req.params.prompt_logprobs)
                got += [TokenLogprob(t, v, tuple(zip(*top, strict=True)), r)
                        for t, v, top, r in zip(targets, vals, tops, ranks, strict=True)]
        except Exception as exc:  # noqa: BLE001 - this request only
            self.end(lv, FinishReason.ERROR,
                     f"prompt logprobs failed: {type(exc).__name__}: {exc}")
            return False
        return True

    def _sample(self, logits: torch.Tensor, items: list[tuple[LiveRequest, int]]
                ) -> list[Request]:
        if not items:
            return []
        idx = [row for _, row in items]
        x = logits if idx == list(range(logits.shape[0])) else logits[idx]
        lives = [lv for lv, _ in items]
        finished = []
        for lv, res in zip(lives, self._sample_isolated(x, lives), strict=True):
            try:
                done = (self.fail(lv, res, "sampling failed: ") if isinstance(res, Exception)
                        else self._append(lv, *res))
            except Exception as exc:  # noqa: BLE001
                done = self.fail(lv, exc)
            if done:
                finished.append(lv.req)
        return finished

    def _sample_isolated(self, x: torch.Tensor, lives: list[LiveRequest]) -> list[Any]:
        """:meth:`_sample_rows`, and when the batch fails, each row alone: per row a
        (token, logprob, top) or the exception of that row."""
        try:
            return self._sample_rows(x, lives)
        except Exception:  # noqa: BLE001 - isolate the failing request(s) below
            results: list[Any] = []
            for j, lv in enumerate(lives):
                try:
                    results += self._sample_rows(x[j:j + 1], [lv])
                except Exception as exc:  # noqa: BLE001
                    results.append(exc)
            return results

    def _sample_rows(self, x: torch.Tensor, lives: list[LiveRequest]) -> list[Any]:
        """x [n, V] fp32: row j is lives[j]'s logits -> (token, logprob, top) per row."""
        reqs = [lv.req for lv in lives]
        mask = self._grammar_mask(lives)
        so = self.sampler(x, [r.params for r in reqs], [r.prompt_ids for r in reqs],
                          [r.output_ids for r in reqs], [lv.generator for lv in lives],
                          **({} if mask is None else {"mask": mask}))
        ids = so.token_ids.tolist()
        return list(zip(ids, so.chosen_logprobs, so.top_logprobs, strict=True))

    def _grammar_mask(self, lives: list[LiveRequest]) -> Any:
        """The TokenMask of the constrained rows of ``lives`` (None when there are none);
        raises GrammarMatchError when a matcher is in an error state."""
        rows = [j for j, lv in enumerate(lives) if lv.matcher is not None]
        if not rows:
            return None
        from engine.structured.matcher import fill_token_mask

        t0 = time.perf_counter()
        mask = fill_token_mask(rows, [lives[j].matcher for j in rows])
        self.mask_time_s += time.perf_counter() - t0
        self.mask_fills += len(rows)
        return mask

    def _append(self, lv: LiveRequest, token: int, logprob: float, top: Any) -> bool:
        """A plain decode's sample: record, emit, and close the request if it ended."""
        self._time_token(lv.req)
        out, done = self._next_output(lv, token, logprob, top)
        if done:  # counted before the client can see the end (metrics read after a reply)
            self._close(lv, out.finish_reason)
        self._emit(lv, out)
        return done

    def _next_output(self, lv: LiveRequest, token: int, logprob: float, top: Any
                     ) -> tuple[RequestOutput, bool]:
        """Append ``token`` to the output and decide whether the request ended; returns
        the output to emit (not emitted yet) and whether it is the last."""
        req, p = lv.req, lv.req.params
        req.output_ids.append(token)
        if lv.matcher is not None:
            lv.matcher.advance(token)  # GrammarMatchError ends this request (caller)
        n = len(req.output_ids)
        # as vLLM checks them: EOS first, then stop_token_ids (stop_reason: the id)
        eos_end = (token in self.eos and n >= p.min_tokens
                   and (not p.ignore_eos or lv.matcher is not None))
        id_end = not eos_end and token in p.stop_token_ids and n >= p.min_tokens
        # an ending EOS is never text; an ending stop token id only with
        # include_stop_str_in_output (vLLM's)
        quiet = eos_end or (id_end and not p.include_stop_str_in_output)
        step = None if quiet else lv.detok.push(token)
        other_eos = eos_end and self.primary_eos is not None and token != self.primary_eos
        reason, stop_reason = self._finish_reason(lv, step, eos_end,
                                                  token if id_end or other_eos else None)
        text = "" if step is None else step.new_text
        if reason is not None and not (step is not None and step.stopped):
            text += lv.detok.flush() or ""
            if reason is FinishReason.LENGTH and getattr(lv.detok, "stopped", False):
                # the text held back for an unfinished character held a stop string: it
                # cut the text, so the output ended on it
                reason, stop_reason = FinishReason.STOP, lv.detok.stop_str
        lps = ()
        if p.logprobs is not None:
            pairs = tuple(zip(*top, strict=True)) if top else ()
            lps = (TokenLogprob(token, logprob, pairs),)
        prompt_lps = None
        if n == 1 and p.prompt_logprobs is not None:
            prompt_lps = tuple(req.prompt_logprobs)
        return RequestOutput(req.request_id, text, (token,), lps, reason is not None, reason,
                             None, len(req.prompt_ids), n, stop_reason, prompt_lps,
                             num_cached_tokens=req.num_cached_tokens), reason is not None

    def _time_token(self, req: Request, num_tokens: int = 1) -> None:
        """``num_tokens`` new tokens of ``req`` leave now (several after a verified draft:
        one inter-token latency, as the client sees them arrive together)."""
        if num_tokens < 1:
            return
        now = self.clock()
        if req.first_token_time is None:
            req.first_token_time = now
            self.observer.on_first_token(now - req.arrival_time)
            if num_tokens > 1:
                self.observer.on_token(0.0, num_tokens - 1)
        else:
            self.observer.on_token(now - (req.last_token_time or now), num_tokens)
        req.last_token_time = now

    def _finish_reason(self, lv: LiveRequest, step: Any, eos_end: bool,
                       stop_id: int | None) -> tuple[FinishReason | None, str | int | None]:
        """(reason, stop_reason) after a token was appended: ``eos_end``, it was an EOS
        that ends the request; ``stop_id``, a stop token id (or an EOS other than the
        tokenizer's own) that does; ``step``, the
        detokenizer's step (None: the token was not text)."""
        req = lv.req
        n = len(req.output_ids)
        if eos_end:  # stop_id: an EOS other than the tokenizer's own (vLLM's stop_reason)
            return FinishReason.STOP, stop_id
        if step is not None and step.stopped:
            return FinishReason.STOP, getattr(step, "stop_str", None)
        if stop_id is not None:
            return FinishReason.STOP, stop_id
        if lv.matcher is not None and lv.matcher.is_done:
            return FinishReason.STOP, None  # the grammar is complete
        if n >= lv.max_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def fail(self, lv: LiveRequest, exc: Exception, prefix: str = "") -> bool:
        """End ``lv`` with ERROR for ``exc``; a GrammarDeadEnd or NoTokenLeft is the
        request's own input (its message goes to the client as it is)."""
        if isinstance(exc, (GrammarDeadEnd, NoTokenLeft)):
            return self.end(lv, FinishReason.ERROR, str(exc), from_request=True)
        return self.end(lv, FinishReason.ERROR, f"{prefix}{type(exc).__name__}: {exc}")

    def end(self, lv: LiveRequest, reason: FinishReason, error: str | None,
            from_request: bool = False) -> bool:
        """Finish ``lv`` early (abort, timeout, error) with a final, empty output;
        ``from_request``: the request's own input caused the error."""
        req = lv.req
        req.error = error
        self._close(lv, reason)
        self._emit(lv, RequestOutput(req.request_id, finished=True, finish_reason=reason,
                                     error=error, error_from_request=from_request,
                                     num_prompt_tokens=len(req.prompt_ids),
                                     num_output_tokens=len(req.output_ids),
                                     num_cached_tokens=req.num_cached_tokens))
        return True

    def _close(self, lv: LiveRequest, reason: FinishReason) -> None:
        req = lv.req
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self.observer.on_finished(reason, self.clock() - req.arrival_time, len(req.output_ids),
                                  req.tag)

    @staticmethod
    def _emit(lv: LiveRequest, out: RequestOutput) -> None:
        req = lv.req
        if req.prediction_ids:
            out = dataclasses.replace(
                out, num_accepted_prediction_tokens=req.num_accepted_prediction_tokens,
                num_rejected_prediction_tokens=req.num_rejected_prediction_tokens)
        try:
            lv.sink(out)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the engine
            log.exception("output sink for %s failed", lv.req.request_id)
