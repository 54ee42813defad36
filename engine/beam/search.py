"""Beam search over a model's next-token log-probabilities, as vLLM defines it (its
``beam_search``, which OpenAI-compatible clients ask for with ``use_beam_search``).

Each step extends every live beam by its ``candidates`` (2 x width) likeliest next tokens.
An extension that ends in a stop token (EOS unless ignored, or one of ``stop_token_ids``)
joins the finished beams; the others compete, and the ``width`` best by score stay live.
After ``max_tokens`` steps the ``width`` best of the finished and the live beams are the
answer, best first (ties keep the order they were made in).

    score(beam) = cumulative logprob / L ** length_penalty

with L the prompt's and the output's tokens, an ending stop token not counted (vLLM's
``get_beam_search_score``), compared in log space so that no length_penalty overflows.
Candidates come best first; one with a logprob of -inf (a token the model gives no
probability) is never taken.

The search ends early where that cannot change the answer: once ``width`` beams have
finished and the ``width``-th best of them scores above what any extension of a live beam
can reach (:meth:`BeamSearch.bound`), every later beam would rank below it. vLLM always
runs ``max_tokens`` steps; the answer is the same.

The search is a pure function of the candidates it is given, so its answer is as exact as
they are: with the batch-invariant kernels, the same under any load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# (token id, logprob), best first: one live beam's candidate next tokens
Candidates = Sequence[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Beam:
    tokens: tuple[int, ...] = ()  # output token ids (a finished beam's stop token last)
    # each token's candidates as the step offered them (the chosen token's logprob and
    # the alternatives a client may be shown)
    steps: tuple[tuple[tuple[int, float], ...], ...] = ()
    cum_logprob: float = 0.0
    stopped: bool = False  # ended by a stop token

    @property
    def logprobs(self) -> tuple[float, ...]:
        """Each output token's logprob."""
        return tuple(dict(c)[t] for t, c in zip(self.tokens, self.steps, strict=True))


Score = tuple[int, float]


def beam_score(cum_logprob: float, length: int, length_penalty: float) -> Score:
    """vLLM's cum_logprob / length ** length_penalty as a key in the same order that
    never overflows (any length_penalty): (sign class, log of the magnitude, negated for
    negative scores)."""
    if cum_logprob == 0:
        return (1, 0.0)
    magnitude = math.log(abs(cum_logprob)) - length_penalty * math.log(length)
    return (0, -magnitude) if cum_logprob < 0 else (2, magnitude)


class BeamSearch:
    """One prompt's search. ``advance`` takes the candidates of every beam in
    :attr:`live` (in that order); :attr:`done` says when to stop; :meth:`best` is the
    answer. ``max_tokens`` >= 1; ``width`` >= 1."""

    def __init__(self, prompt_len: int, width: int, max_tokens: int,
                 stop_ids: frozenset[int], length_penalty: float = 1.0) -> None:
        if width < 1 or max_tokens < 1:
            raise ValueError(f"width {width} and max_tokens {max_tokens} must be >= 1")
        self.prompt_len = prompt_len
        self.width = width
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.length_penalty = length_penalty
        self.live: list[Beam] = [Beam()]
        self.finished: list[Beam] = []
        self.steps = 0

    @property
    def candidates(self) -> int:
        """Next tokens to ask for per live beam (vLLM's 2 x width)."""
        return 2 * self.width

    def score(self, beam: Beam) -> Score:
        length = self.prompt_len + len(beam.tokens) - (1 if beam.stopped else 0)
        return beam_score(beam.cum_logprob, length, self.length_penalty)

    def bound(self, beam: Beam) -> Score:
        """The best score any extension of the live ``beam`` can reach: extending never
        raises the cumulative logprob (<= 0) and never shortens L. With length_penalty
        <= 0 a longer L cannot raise the score either, so it is the beam's own; above 0
        the longest L (every token generated) divides the least negative sum."""
        if self.length_penalty <= 0:
            return self.score(beam)
        return beam_score(beam.cum_logprob, self.prompt_len + self.max_tokens,
                          self.length_penalty)

    @property
    def done(self) -> bool:
        if self.steps >= self.max_tokens or not self.live:
            return True
        if len(self.finished) < self.width:
            return False
        kth = sorted((self.score(b) for b in self.finished), reverse=True)[self.width - 1]
        return all(self.bound(b) < kth for b in self.live)

    def advance(self, candidates: Sequence[Candidates]) -> None:
        """One step: ``candidates[i]`` are live beam i's next tokens, best first."""
        if len(candidates) != len(self.live):
            raise ValueError(f"{len(candidates)} candidate lists for {len(self.live)} beams")
        grown: list[Beam] = []
        for beam, cands in zip(self.live, candidates, strict=True):
            offered = tuple(cands)
            for token, logprob in offered:
                if logprob == -math.inf:
                    continue
                child = Beam(beam.tokens + (token,), beam.steps + (offered,),
                             beam.cum_logprob + logprob, token in self.stop_ids)
                (self.finished if child.stopped else grown).append(child)
        grown.sort(key=self.score, reverse=True)
        self.live = grown[:self.width]
        self.steps += 1

    def best(self) -> list[Beam]:
        """The answer: the ``width`` best of the finished and live beams, best first."""
        every = self.finished + (self.live if self.steps >= self.max_tokens else [])
        return sorted(every, key=self.score, reverse=True)[:self.width]
