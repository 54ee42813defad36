"""When a sequence drafts: per-sequence backoff after drafts that did not pay.

A draft pays when the share of its tokens kept beats what its rows cost the step
(``cost``, engine/spec/cost.py: 0 until the engine has timed some steps, then the rows'
share of a step of this size). Each sequence keeps an average of its drafts' kept shares;
while that average does not beat the cost, the sequence is missing: after m misses in a
row it sits out the next ``2**min(m, MAX_BACKOFF) - 1`` steps where it could draft (1, 3,
7, ... 63), then drafts once more to see whether its text has turned repetitive. So a
workload with nothing to look up pays for about one draft per 64 steps, and one that
repeats itself drafts every step. Decisions depend only on the sequence's own history and
the measured cost, never on outputs: speculation never changes what is generated.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF = 6
SMOOTHING = 0.5  # weight of the newest draft in the kept-share average


@dataclass(slots=True)
class DraftBackoff:
    misses: int = 0  # consecutive drafts whose kept-share average did not beat the cost
    skip: int = 0  # drafting chances still to sit out
    kept: float = 1.0  # average share of draft tokens kept (optimistic before any draft)

    def may_draft(self, cost: float = 0.0) -> bool:
        """Asked once per step the sequence could draft; False uses up one skipped step.
        A sequence whose average falls to ``cost`` (the cost rose) starts backing off
        without drafting."""
        if self.skip:
            self.skip -= 1
            return False
        if not self.misses and self.kept <= cost:
            self._miss()
            return False
        return True

    def record(self, num_accepted: int, num_drafted: int = 1, cost: float = 0.0) -> None:
        """A verified draft of ``num_drafted`` tokens kept ``num_accepted``."""
        share = num_accepted / max(1, num_drafted)
        self.kept = (1 - SMOOTHING) * self.kept + SMOOTHING * share
        if num_accepted and self.kept > cost:
            self.misses = 0
            return
        self._miss()

    def _miss(self) -> None:
        self.misses += 1
        self.skip = 2 ** min(self.misses, MAX_BACKOFF) - 1
