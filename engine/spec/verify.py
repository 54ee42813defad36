"""Verifying draft chunks, the part of a step (engine/postprocess.py :class:`StepRunner`,
which this class is a base of) that samples the rows of chunks with draft tokens.

Speculative verification (engine/spec/): a chunk with draft tokens gives one logits row per
token. Row j is sampled exactly as a plain decode of that position would be: the same
processing over the output so far (which by then holds the kept drafts), the same
per-request generator, one draw per row. A draft token is kept when it equals the sampled
token; the first sampled token that differs (or the one after the last draft) is kept too
and ends the run. For a greedy row this is the longest matching prefix plus the bonus
token. For a sampled row it is the rejection rule for a point-mass draft: the draft token t
survives with probability p(t), and when it does not, the emitted token is distributed as p
with t removed and renormalised; drawing that token with the very draw plain decoding would
have made keeps seeded outputs identical with speculation on or off. Every kept token goes
through the same stop, length and detokenizer checks as a plain one (a stop inside the run
ends the request there), and the step's tokens leave as one output. The sequence's
``num_computed`` then covers only the kept tokens' positions; the rejected tail's K/V is
garbage that is never read (it lies past ``num_computed``) and its blocks are released at
the next schedule.

Under a grammar, row j is sampled under the mask after the first j draft tokens: for a
greedy request the K + 1 masks of a K-token draft are filled at once (the matcher advanced
over the draft and rolled back inside llguidance) and its rows take one masked argmax;
rows sampled one by one (seeded, penalties, logprobs, a thinking budget) fill their mask
from the matcher, which by row j has consumed the j kept draft tokens. Either way the
matcher only ever consumes kept tokens: a rejected draft leaves it where plain decoding
would.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import torch

from engine.request import Request
from engine.sampler import Sampler, row_argmax
from engine.stream import RequestOutput

if TYPE_CHECKING:
    from engine.postprocess import LiveRequest


class DraftVerifier:
    """The verification half of StepRunner (its attributes and helpers: spec, observer,
    sampler, mask counters, _next_output, _sample_isolated, _time_token, fail, _close,
    _emit)."""

    def _verify(self, logits: torch.Tensor,
                items: list[tuple[LiveRequest, int, tuple[int, ...]]]) -> list[Request]:
        """Verify draft chunks (module docstring). items: (request, its first logits row,
        its draft tokens). Row j of every request still going is sampled in one batch."""
        finished: list[Request] = []
        active = [(lv, first, drafts, lv.req.num_computed) for lv, first, drafts in items]
        pieces: dict[int, list[RequestOutput]] = {id(lv): [] for lv, _, _ in items}
        # plain greedy rows (no processing, no logprobs): the sampler's argmax of each
        # row, taken for all of a request's rows at once
        argmax = {id(lv): row_argmax(logits[first:first + 1 + len(drafts)]).tolist()
                  for lv, first, drafts in items if self._plain_greedy(lv)}
        argmax.update(self._greedy_under_grammar(logits, [
            it for it in items if it[0].matcher is not None and self._plain_greedy(it[0], True)]))
        j = 0
        while active:
            going = []
            for (lv, first, drafts, base), res in zip(active, self._row_results(
                    logits, active, j, argmax), strict=True):
                got = pieces[id(lv)]
                done, kept = True, False
                try:
                    if isinstance(res, Exception):
                        raise res
                    piece, done = self._next_output(lv, *res)
                    got.append(piece)
                    kept = not done and j < len(drafts) and res[0] == drafts[j]
                except Exception as exc:  # noqa: BLE001 - this request only
                    self._time_token(lv.req, len(got))
                    self._flush(lv, got)
                    self.fail(lv, exc, "sampling failed: " if exc is res else "")
                    finished.append(lv.req)
                    continue
                if kept:
                    going.append((lv, first, drafts, base))
                    continue
                lv.req.num_computed = base + len(got)  # the kept tokens' positions
                kind = self._grammar_kind(lv)
                if self.spec is not None:
                    acc, rej = self.spec.verified(lv.req.seq_id, len(drafts), len(got) - 1,
                                                  kind)
                    if acc or rej:
                        lv.req.num_accepted_prediction_tokens += acc
                        lv.req.num_rejected_prediction_tokens += rej
                        self.observer.on_prediction(acc, rej)
                if lv.matcher is not None:  # masks of draft positions (rows 1..)
                    self.draft_mask_fills += len(drafts) if id(lv) in argmax else len(got) - 1
                self.observer.on_spec_decode(len(drafts), len(got) - 1, kind)
                reason = got[-1].finish_reason
                self._time_token(lv.req, len(got))
                if done:  # counted before the client can see the end, as _append does
                    self._close(lv, reason)
                    finished.append(lv.req)
                self._flush(lv, got)
            active = going
            j += 1
        return finished

    def _plain_greedy(self, lv: LiveRequest, masked: bool = False) -> bool:
        """The default sampler would take the argmax of ``lv``'s raw logits at every
        position of its draft (nothing processes them and no logprobs are asked);
        ``masked``: of its logits under its grammar's masks."""
        p = lv.req.params
        return (isinstance(self.sampler, Sampler) and p.greedy and p.logprobs is None
                and not p.has_penalties and not p.logit_bias and not p.filters_tokens
                and (lv.matcher is None or masked)
                and getattr(p, "thinking", None) is None
                and len(lv.req.output_ids) >= p.min_tokens)

    def _greedy_under_grammar(self, logits: torch.Tensor,
                              items: list[tuple[LiveRequest, int, tuple[int, ...]]]
                              ) -> dict[int, list[int]]:
        """The argmax of each row of each draft chunk under its grammar's mask after the
        draft tokens before it (K + 1 masks for K drafts, filled at once with the matcher
        advanced over the draft and rolled back; the sampler's own apply_token_mask, so the
        bits are those plain decoding compares). {} when a matcher fails: those rows are
        then sampled one by one, which ends only the failing request."""
        if not items:
            return {}
        from engine.structured.matcher import fill_draft_masks
        from engine.structured.token_mask import TokenMask, apply_token_mask

        t0 = time.perf_counter()
        try:
            masks = fill_draft_masks([lv.matcher for lv, _, _ in items],
                                     [d for _, _, d in items])
        except Exception:  # noqa: BLE001 - isolated by the row-by-row path
            return {}
        self.mask_time_s += time.perf_counter() - t0
        self.mask_fills += sum(len(d) + 1 for _, _, d in items)
        out = {}
        for (lv, first, drafts), bits in zip(items, masks, strict=True):
            x = logits[first:first + 1 + len(drafts)].to(torch.float32, copy=True)
            apply_token_mask(x, TokenMask(tuple(range(len(drafts) + 1)), bits,
                                          lv.matcher.vocab_size))
            out[id(lv)] = row_argmax(x).tolist()
        return out

    @staticmethod
    def _grammar_kind(lv: LiveRequest) -> str:
        """The metrics label of what constrains ``lv``: its grammar's kind, "thinking"
        for a thinking budget alone, "none"."""
        if lv.matcher is not None:
            return lv.matcher.kind
        return "thinking" if getattr(lv.req.params, "thinking", None) is not None else "none"

    def _row_results(self, logits: torch.Tensor, active: list[Any], j: int,
                     argmax: dict[int, list[int]]) -> list[Any]:
        """Row j of each active verification: (token, logprob, top) or an error."""
        results: list[Any] = [None] * len(active)
        rest = []
        for i, (lv, first, _, _) in enumerate(active):
            if id(lv) in argmax:
                results[i] = (argmax[id(lv)][j], None, None)
            else:
                rest.append((i, lv, first + j))
        if rest:
            x = logits[[row for _, _, row in rest]]
            for (i, _, _), res in zip(rest, self._sample_isolated(x, [lv for _, lv, _ in rest]),
                                      strict=True):
                results[i] = res
        return results

    def _flush(self, lv: LiveRequest, pieces: list[RequestOutput]) -> None:
        """Emit a step's outputs of one request as one."""
        if not pieces:
            return
        one = pieces[0] if len(pieces) == 1 else dataclasses.replace(
            pieces[-1], text="".join(p.text for p in pieces),
            token_ids=tuple(t for p in pieces for t in p.token_ids),
            logprobs=tuple(lp for p in pieces for lp in p.logprobs),
            prompt_logprobs=pieces[0].prompt_logprobs)
        pieces.clear()
        self._emit(lv, one)

