"""How many tokens a sequence drafts this step: as many as pay for their rows.

Per sequence, draft tokens are modelled as accepted one after another with a constant
probability p (a draft token is only kept if every one before it was): the i-th token of a
draft is kept with probability p**i. Each draft token costs ``cost`` of a token's worth of
step time (engine/spec/cost.py: the rows' share of a step of this many sequences; 0 until
the engine has timed some steps). So the i-th token is worth drafting when p**i > cost,
and the draft length is the largest such i (at most the room the sequence has):
floor(log(cost) / log(p)). p is estimated from the sequence's own drafts: kept tokens over
kept tokens plus drafts that ended on a rejection, both exponentially weighted so a text
that turns repetitive (or stops being so) is followed within a few drafts. Before its first
draft a sequence assumes p = PRIOR_P, worth one draft: where rows are nearly free its first
draft takes the whole room, where they cost PRIOR_P of a step or more it waits for a probe
(a batch of sequences that each opened with a full draft would pay for rows the first
rejection shows were not worth it).

A draft pays when the tokens it kept exceed what its rows cost (kept > cost * drafted) and
the estimate still beats the cost (one lucky draft does not end a backoff). After m drafts
in a row that did not pay, or when p falls to the cost, the sequence sits out its next
``2**min(m, MAX_BACKOFF) - 1`` chances to draft (1, 3, 7, ... 63), then probes with one
token (the whole room while rows are free).

Probes are also paid from a waste budget: every chance to draft earns WASTE_RATE tokens of
credit (at most CREDIT_CAP, which is also the credit a sequence starts with), every
rejected draft token spends ``cost``, and a probe needs credit >= cost. So on text with
nothing to look up a sequence wastes at most about WASTE_RATE of its steps' tokens on
probes whatever the batch size (where a row costs most of a step, as in a large batch on a
compute-bound host, probes become rare), and one that repeats itself drafts every step.
Decisions depend only on the sequence's own history and the measured cost: they never
change what is generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_BACKOFF = 6
DECAY = 0.8  # weight of the past per verified draft in the acceptance estimate
PRIOR_P = 0.8  # p assumed before the first draft, with the weight of one draft
WASTE_RATE = 0.01  # probe credit earned per chance to draft, in tokens
CREDIT_CAP = 1.0  # the most credit a sequence holds (and starts with); -CAP the least


@dataclass(slots=True)
class DraftPolicy:
    kept: float = PRIOR_P  # weighted count of draft tokens kept
    rejected: float = 1.0 - PRIOR_P  # weighted count of drafts that ended on a rejection
    misses: int = 0  # consecutive drafts that did not pay
    skip: int = 0  # drafting chances still to sit out
    credit: float = CREDIT_CAP  # probe budget, in tokens (module docstring)

    @property
    def accept_prob(self) -> float:
        """p: the chance a draft token is kept, given every one before it was."""
        return self.kept / (self.kept + self.rejected)

    def best_length(self, cost: float, room: int) -> int:
        """The largest i <= room with p**i > cost (0: not even one token pays)."""
        p = self.accept_prob
        if cost <= 0 or p >= 1:
            return room
        if p <= cost:
            return 0
        return max(1, min(room, math.floor(math.log(cost) / math.log(p))))

    def length(self, cost: float, room: int) -> int:
        """Tokens to draft now, asked once per step the sequence could draft (room >= 1);
        0 while backing off (using up one skipped chance)."""
        self.credit = min(CREDIT_CAP, self.credit + WASTE_RATE)
        if self.skip:
            self.skip -= 1
            return 0
        k = self.best_length(cost, room)
        if k:
            return k
        if self.misses:  # a probe after sitting out: one token where rows cost anything
            if cost <= 0:
                return room
            return 1 if self.credit >= cost else 0
        self._miss()  # the estimate fell to the cost: start backing off
        return 0

    def record(self, num_accepted: int, num_drafted: int, cost: float = 0.0) -> None:
        """A verified draft of ``num_drafted`` tokens kept its first ``num_accepted``."""
        self.kept = DECAY * self.kept + num_accepted
        self.rejected = DECAY * self.rejected + (num_accepted < num_drafted)
        self.credit = max(-CREDIT_CAP, self.credit - cost * (num_drafted - num_accepted))
        if num_accepted > cost * num_drafted and self.accept_prob > cost:
            self.misses = 0
        else:
            self._miss()

    def _miss(self) -> None:
        self.misses += 1
        self.skip = 2 ** min(self.misses, MAX_BACKOFF) - 1
