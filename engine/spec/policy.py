"""When a sequence drafts: per-sequence backoff after drafts that keep nothing.

A draft whose first token is rejected cost a verify chunk of K+1 rows for the one token a
plain decode would have given. After m such misses in a row the sequence sits out the next
``2**min(m, MAX_BACKOFF) - 1`` steps where it could draft (1, 3, 7, ... 63), so a workload
with nothing to look up pays for about one failed draft per 64 steps; any draft that keeps
a token clears the count. Decisions depend only on the sequence's own history, so outputs
and timings of one request do not depend on what else runs.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF = 6


@dataclass(slots=True)
class DraftBackoff:
    misses: int = 0  # consecutive drafts that kept no token
    skip: int = 0  # drafting chances still to sit out

    def may_draft(self) -> bool:
        """Asked once per step the sequence could draft; False uses up one skipped step."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def record(self, num_accepted: int) -> None:
        """A verified draft kept ``num_accepted`` of its tokens."""
        if num_accepted:
            self.misses = 0
            return
        self.misses += 1
        self.skip = 2 ** min(self.misses, MAX_BACKOFF) - 1
