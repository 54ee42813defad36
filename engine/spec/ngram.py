"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens, n from ``prompt_lookup_max`` down to ``prompt_lookup_min``.

Each sequence keeps an :class:`NgramIndex` that is extended as tokens arrive, so a lookup
costs O(N - M + 1) dictionary probes however long the prompt is, and indexing costs the
same per token (once).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.spec.proposer import DraftInput


class NgramIndex:
    """The latest occurrence of every n-gram (``n_min <= n <= n_max``) of a growing token
    sequence that has a token after it. ``_last[n - n_min][gram]`` = e, the end (exclusive)
    of that occurrence, so ``tokens[e]`` followed it. The suffix of the whole sequence has
    no following token yet and is not indexed: a lookup of it finds an earlier occurrence."""

    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes must satisfy 1 <= {n_min} <= {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_min, n_max + 1)]
        self._indexed = 0  # every end e < _indexed is in the maps

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def _catch_up(self) -> None:
        t, end = self.tokens, len(self.tokens)  # ends up to end - 1 have a follower
        for n, last in zip(range(self.n_min, self.n_max + 1), self._last, strict=True):
            for e in range(max(self._indexed, n), end):
                last[tuple(t[e - n:e])] = e
        self._indexed = max(self._indexed, end)

    def propose(self, k: int, extra: Sequence[int] = ()) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix found (shorter when that occurrence is near the end); () when none.
        ``extra``: tokens after the indexed ones (not indexed): the suffix looked up is
        that of tokens + extra."""
        self._catch_up()
        t = self.tokens
        tail = t[-self.n_max:] + list(extra) if extra else t[-self.n_max:]
        for n in range(min(self.n_max, len(t) + len(extra) - 1), self.n_min - 1, -1):
            e = self._last[n - self.n_min].get(tuple(tail[len(tail) - n:]))
            if e is not None:
                got = t[e:e + k]
                return tuple(got + list(extra[:k - len(got)]) if len(got) < k else got)
        return ()


class NgramProposer:
    """The n-gram :class:`engine.spec.proposer.Proposer`: one index per sequence."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[int, NgramIndex] = {}

    def propose(self, seqs: Sequence[DraftInput]) -> list[tuple[int, ...]]:
        return [self._one(s) for s in seqs]

    def _one(self, s: DraftInput) -> tuple[int, ...]:
        idx = self._index.get(s.seq_id)
        if idx is None:
            idx = self._index[s.seq_id] = NgramIndex(self.n_min, self.n_max)
            idx.extend(s.prompt_ids)
        seen = len(idx.tokens) - len(s.prompt_ids)
        if seen < len(s.output_ids):
            idx.extend(s.output_ids[seen:])
        return idx.propose(s.max_tokens, s.prefix)

    def release(self, seq_id: int) -> None:
        self._index.pop(seq_id, None)
