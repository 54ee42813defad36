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
WINDOW = 32  # occurrences looked at on each side of the last alignment


class PredictionIndex:
    """A prediction's tokens and where each pair of tokens occurs in them, shared by the
    sequences of one request (its n choices). Memory and lookups stay linear in the
    prediction however repetitive it is: one list of ends per distinct pair, and a lookup
    compares at most 2 * WINDOW occurrences, N_MAX tokens each."""

    def __init__(self, prediction: tuple[int, ...]) -> None:
        self.pred = prediction
        self._ends: dict[tuple[int, int], list[int]] | None = None  # built on demand

    def find(self, tail: Sequence[int], anchor: int) -> tuple[int | None, int]:
        """(where the prediction continues after ``tail``, the length of the suffix of
        ``tail`` found there); (None, 0) when no N_MIN-token suffix occurs. The longest
        suffix wins; among equals, the first occurrence at or after ``anchor``, else the
        last before it; only the WINDOW occurrences on each side of ``anchor`` are
        compared."""
        if len(tail) < N_MIN:
            return None, 0
        if self._ends is None:
            p, self._ends = self.pred, {}
            for e in range(N_MIN, len(p)):  # ends with a token after them
                self._ends.setdefault((p[e - 2], p[e - 1]), []).append(e)
        ends = self._ends.get((tail[-2], tail[-1]))
        if not ends:
            return None, 0
        i = bisect_left(ends, anchor)
        best, best_n = None, 0
        for e in [*ends[i:i + WINDOW], *reversed(ends[max(0, i - WINDOW):i])]:
            n = N_MIN
            while n < min(N_MAX, len(tail), e) and self.pred[e - n - 1] == tail[-n - 1]:
                n += 1
            if n > best_n:  # the first seen of each length: forward of anchor first
                best, best_n = e, n
        return best, best_n


class PredictionTracker:
    """One sequence's position in its prediction (module docstring)."""

    def __init__(self, prediction: Sequence[int] | PredictionIndex) -> None:
        self.index = (prediction if isinstance(prediction, PredictionIndex)
                      else PredictionIndex(tuple(prediction)))
        self.pred = self.index.pred
        self.pos: int | None = 0  # index of the prediction token the output continues at
        self.anchor = 0  # the last position the output was aligned at
        self.run = N_MIN  # output tokens that followed the prediction since pos was found
        self.seen = 0  # output tokens the position accounts for

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
            pos, run = self.index.find(tail, anchor)
            if pos is not None:
                anchor = pos
        return pos, anchor, run

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
    sequence that came with a prediction (``DraftInput.prediction``); sequences with equal
    predictions (a request's n choices) share one index."""

    def __init__(self) -> None:
        self._trackers: dict[int, PredictionTracker] = {}
        self._indexes: dict[tuple[int, ...], tuple[PredictionIndex, int]] = {}  # + users

    def propose(self, seqs: Sequence[DraftInput]) -> list[tuple[int, ...]]:
        return [self._one(s) for s in seqs]

    def _one(self, s: DraftInput) -> tuple[int, ...]:
        if not s.prediction:
            return ()
        t = self._trackers.get(s.seq_id)
        if t is None:
            key = tuple(s.prediction)
            index, users = self._indexes.get(key, (None, 0))
            if index is None:
                index = PredictionIndex(key)
            self._indexes[key] = (index, users + 1)
            t = self._trackers[s.seq_id] = PredictionTracker(index)
        return t.propose(s.output_ids, s.max_tokens, s.prefix)

    def release(self, seq_id: int) -> None:
        t = self._trackers.pop(seq_id, None)
        if t is None:
            return
        index, users = self._indexes[t.pred]
        if users > 1:
            self._indexes[t.pred] = (index, users - 1)
        else:
            del self._indexes[t.pred]
