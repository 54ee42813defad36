"""The proposer interface: what the engine asks of a source of draft tokens.

Once per step the engine hands the proposer every decoding sequence allowed to draft, with
the most tokens it may draft; the proposer answers one tuple of guessed next tokens per
sequence (empty: no guess). Batched on purpose: an n-gram proposer answers each sequence on
its own, a draft model would run all of them as one forward pass. A proposer may keep state
per sequence (``seq_id`` is unique for the engine's lifetime) and drops it in ``release``.
``prefix``: draft tokens already decided (forced by the sequence's grammar,
engine/spec/constraint.py); the proposal continues after them and never holds them.
``prediction``: the tokens of the text the client predicted (OpenAI's predicted outputs),
empty for most requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class DraftInput:
    seq_id: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  # the sequence so far is prompt_ids + output_ids
    max_tokens: int  # >= 1: the proposal may be shorter, never longer
    prefix: tuple[int, ...] = ()  # the draft so far: the proposal follows output + prefix
    prediction: Sequence[int] = ()  # the request's predicted output (engine/spec/prediction.py)


class Proposer(Protocol):
    def propose(self, seqs: Sequence[DraftInput]) -> list[tuple[int, ...]]:
        """One proposal per entry of ``seqs``, each at most its ``max_tokens`` long."""
        ...

    def release(self, seq_id: int) -> None:
        """The sequence finished: forget what is kept for it."""
        ...
