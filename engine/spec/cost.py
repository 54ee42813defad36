"""What an extra token row costs in a decode step, learnt from the steps themselves.

Decode steps (no prompt tokens) are fitted as ``seconds = a + b * rows`` by exponentially
weighted least squares (newest steps weigh most; ``rows`` counts draft tokens too, so steps
with and without drafts spread the fit). ``a`` is what a step costs whatever its size
(weights read once, Python, sampling), ``b`` what each row adds. For a step of B decoding
sequences, :meth:`StepCost.row_share` = b*B / (a + b*B) is the share of the step the rows
themselves cost. A sequence that drafts k tokens adds b*k; it raises the step's tokens per
second only if its expected kept tokens exceed k * row_share(B), i.e. if its acceptance rate
beats row_share(B) (engine/spec/policy.py). On a bandwidth-bound small batch the share is
small and drafting is nearly free; at large batches or on hosts where compute dominates
it approaches 1 and only drafts that are almost always right pay.

Until the steps have spread enough in rows to fit a slope (a server that has not drafted
yet runs steps of one row per sequence), the share is a prior: a step's fixed cost taken
as PRIOR_FIXED_ROWS rows' worth, so B / (B + PRIOR_FIXED_ROWS) (0.2 for one sequence, 0.8
for sixteen). Assuming rows free instead would open every sequence of a large batch with a
full draft on a host where rows cost most of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.97  # weight of the past per observed step (an effective window of ~33 steps)
MIN_SPREAD = 0.25  # rows variance below which the slope is not refitted
PRIOR_FIXED_ROWS = 4.0  # before a fit: a step's fixed cost in rows' worth


@dataclass(slots=True)
class StepCost:
    a: float = 0.0  # seconds per step
    b: float = 0.0  # seconds per row (fitted once the rows have spread)
    fitted: bool = False
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        """One decode step of ``rows`` token rows took ``seconds``."""
        if rows < 1 or not seconds > 0:
            return
        d = DECAY
        self._w = d * self._w + 1
        self._x = d * self._x + rows
        self._y = d * self._y + seconds
        self._xx = d * self._xx + rows * rows
        self._xy = d * self._xy + rows * seconds
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var >= MIN_SPREAD:
            self.b = max(0.0, (self._xy / self._w - mx * my) / var)
            self.fitted = True
        self.a = max(0.0, my - self.b * mx)

    def row_share(self, num_seqs: int) -> float:
        """b*B / (a + b*B) for a step of ``num_seqs`` decoding sequences (the prior before
        a fit)."""
        if not self.fitted:
            n = max(1, num_seqs)
            return n / (n + PRIOR_FIXED_ROWS)
        rows = self.b * max(1, num_seqs)
        total = self.a + rows
        return rows / total if total > 0 else 0.0
