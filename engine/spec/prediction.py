"""Predicted outputs (OpenAI's ``prediction``): drafts taken from a text the client expects
the answer to copy, such as the file an edit rewrites.

A :class:`PredictionTracker` follows where a sequence's output stands in its prediction's
tokens. While the output copies the prediction the position moves one token per output
token and the draft is the prediction's next tokens. When the output departs from it (an
edit, a preamble), the position is lost until the output's last tokens occur in the
prediction again: the longest suffix of ``N_MIN`` to ``N_MAX`` tokens found there re-anchors
it, at the first occurrence at or after the last place the output was aligned (an edit moves
forward through the text) or, when there is none, the last occurrence before it. A
prediction's draft is verified like any other (engine/spec/verify.py), so it only changes
how many tokens a step yields, never which.

Drafts grow with the evidence (a slow start): a draft is at most as long as the run of
output tokens that have followed the prediction since the position was last found (the
re-anchoring n-gram counts; the output's start counts as N_MIN). A short n-gram that also
occurs in other places (", and the") can anchor in the wrong one; it then costs a draft of
N_MIN tokens, not a full one, and a run that holds doubles the length each step (2, 5, 11,
...).

The prediction is tokenized on its own, so its first token (and a token that straddles an
edit) may split differently from the same text inside the answer; the re-anchoring covers
that as it covers an edit.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from engine.spec.proposer import DraftInput

N_MIN = 2  # the shortest output suffix that re-anchors a lost position
N_MAX = 8  # the longest one looked up (longer suffixes are more likely unique)


class PredictionTracker:
    """One sequence's position in its prediction (module docstring)."""

    def __init__(self, prediction: Sequence[int]) -> None:
        self.pred = tuple(prediction)
        self.pos: int | None = 0  # index of the prediction token the output continues at
        self.anchor = 0  # the last position the output was aligned at
        self.run = N_MIN  # output tokens that followed the prediction since pos was found
        self.seen = 0  # output tokens the position accounts for
        self._ends: list[dict[tuple[int, ...], list[int]]] | None = None  # built on demand

    def _index(self) -> list[dict[tuple[int, ...], list[int]]]:
        """For n = N_MIN..N_MAX: n-gram -> the ends (exclusive, ascending) of its
        occurrences in the prediction that have a token after them."""
        if self._ends is None:
            p = self.pred
            self._ends = [{} for _ in range(N_MIN, N_MAX + 1)]
            for n, ends in zip(range(N_MIN, N_MAX + 1), self._ends, strict=True):
                for e in range(n, len(p)):
                    ends.setdefault(p[e - n:e], []).append(e)
        return self._ends

    def _walk(self, pos: int | None, anchor: int, run: int, tokens: Sequence[int],
              tail: Sequence[int]) -> tuple[int | None, int, int]:
        """(pos, anchor, run) after ``tokens``; ``tail``: the output's last tokens
        after them (for re-anchoring when they leave the prediction)."""
        for t in tokens:
            if pos is not None and pos < len(self.pred) and self.pred[pos] == t:
                pos, anchor, run = pos + 1, pos + 1, run + 1
            else:
                pos = None
        if pos is None and tokens:
            pos, run = self._resync(tail, anchor)
            if pos is not None:
                anchor = pos
        return pos, anchor, run

    def _resync(self, tail: Sequence[int], anchor: int) -> tuple[int | None, int]:
        """(where the prediction continues after ``tail``, the n-gram length that found
        it); (None, 0) when no suffix of ``tail`` occurs in the prediction."""
        index = self._index()
        for n in range(min(N_MAX, len(tail)), N_MIN - 1, -1):
            ends = index[n - N_MIN].get(tuple(tail[len(tail) - n:]))
            if ends:
                i = bisect_left(ends, anchor)
                return (ends[i] if i < len(ends) else ends[-1]), n
        return None, 0

    def follow(self, output_ids: Sequence[int]) -> None:
        """Account for the output tokens that arrived since the last call."""
        self.pos, self.anchor, self.run = self._walk(
            self.pos, self.anchor, self.run, output_ids[self.seen:], output_ids[-N_MAX:])
        self.seen = len(output_ids)

    def propose(self, output_ids: Sequence[int], k: int, prefix: Sequence[int] = ()
                ) -> tuple[int, ...]:
        """Up to ``k`` prediction tokens after ``output_ids`` + ``prefix`` (the prefix:
        draft tokens already decided, looked through without moving the position), at
        most as many as the current run (module docstring)."""
        self.follow(output_ids)
        tail = (list(output_ids[-N_MAX:]) + list(prefix))[-N_MAX:]
        pos, _, run = self._walk(self.pos, self.anchor, self.run, prefix, tail)
        if pos is None:
            return ()
        return self.pred[pos:pos + min(k, run)]


class PredictionProposer:
    """The :class:`engine.spec.proposer.Proposer` of predicted outputs: one tracker per
    sequence that came with a prediction (``DraftInput.prediction``)."""

    def __init__(self) -> None:
        self._trackers: dict[int, PredictionTracker] = {}

    def propose(self, seqs: Sequence[DraftInput]) -> list[tuple[int, ...]]:
        return [self._one(s) for s in seqs]

    def _one(self, s: DraftInput) -> tuple[int, ...]:
        if not s.prediction:
            return ()
        t = self._trackers.get(s.seq_id)
        if t is None:
            t = self._trackers[s.seq_id] = PredictionTracker(s.prediction)
        return t.propose(s.output_ids, s.max_tokens, s.prefix)

    def release(self, seq_id: int) -> None:
        self._trackers.pop(seq_id, None)
