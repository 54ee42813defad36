"""What a constrained sequence may draft: the tokens its grammar (engine/structured) and its
thinking budget (SamplingParams.thinking) leave possible, read ahead without changing them.

While a step's drafts are built, a :class:`DraftConstraint` moves the sequence's grammar
matcher tentatively over the draft so far (:meth:`DraftConstraint.admit`,
:meth:`DraftConstraint.forced`) and :meth:`DraftConstraint.release` rolls it back, so the
matcher leaves drafting exactly where it entered. Two uses:

- cut: a proposal is cut before the first token the grammar would reject (llguidance
  validates a sequence without consuming it) or that a spent thinking budget forbids
  (anything but the section's end token), so no row verifies a token that cannot be kept;
- fill: where the grammar forces the next tokens (a literal key, ``[ARGS]``, a closing
  quote) or the budget forces the end token, those are drafted without a lookup.

Drafts are still verified like any other (a forced token in llguidance's tokenization may
lose to another tokenization of the same bytes): cutting and filling change how many rows
a step verifies, never which token is sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from engine.sampler import thinking_state
from engine.sampling_params import ThinkingBudget


class Matcher(Protocol):
    """engine.structured.GrammarMatcher, as far as drafting uses it."""

    def validate(self, tokens: Sequence[int]) -> int: ...

    def forced(self) -> list[int]: ...

    def tentative(self, tokens: Sequence[int]) -> None: ...

    def rollback(self, num_tokens: int) -> None: ...


class DraftConstraint:
    """One sequence's constraints for one step of drafting; ``output_ids`` its output so
    far (the thinking budget counts reasoning tokens on it)."""

    def __init__(self, matcher: Matcher | None, thinking: ThinkingBudget | None,
                 output_ids: Sequence[int]) -> None:
        self.matcher = matcher
        self.thinking = thinking
        self._consumed = 0  # tokens the matcher holds tentatively
        self._inside, self._count = (thinking_state(thinking, output_ids)
                                     if thinking is not None else (False, 0))

    def _must_end(self) -> bool:
        """The thinking budget forces the section's end token next."""
        tb = self.thinking
        return tb is not None and self._inside and self._count >= tb.budget

    def _think(self, token: int) -> None:
        """The budget's state after ``token`` (engine.sampler.thinking_state, one step)."""
        tb = self.thinking
        if tb is None:
            return
        if not self._inside:
            self._inside = token == tb.start_token_id
        elif token == tb.end_token_id:
            self._inside = False
        elif token != tb.start_token_id:
            self._count += 1

    def admit(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """The longest prefix of ``tokens`` both constraints allow after what was admitted
        so far; it is admitted (the matcher moves over it, tentatively)."""
        n = len(tokens) if self.matcher is None else self.matcher.validate(tokens)
        kept: list[int] = []
        for t in tokens[:n]:
            if self._must_end() and t != self.thinking.end_token_id:
                # the sampler leaves a row whose grammar forbids the end token as it is
                end = [*kept, self.thinking.end_token_id]
                if self.matcher is None or self.matcher.validate(end) == len(end):
                    break
            kept.append(t)
            self._think(t)
        if self.matcher is not None and kept:
            self.matcher.tentative(kept)
            self._consumed += len(kept)
        return tuple(kept)

    def forced(self, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` tokens forced from here (admitted like :meth:`admit`'s)."""
        if limit < 1:
            return ()
        if self._must_end():
            return self.admit((self.thinking.end_token_id,))
        if self.matcher is None:
            return ()
        return self.admit(self.matcher.forced()[:limit])

    def release(self) -> None:
        """Roll the matcher back to where drafting found it."""
        n, self._consumed = self._consumed, 0
        if self.matcher is not None and n:
            self.matcher.rollback(n)


def draft_constraint(matcher: Any, thinking: ThinkingBudget | None,
                     output_ids: Sequence[int]) -> DraftConstraint | None:
    """The sequence's DraftConstraint, None when nothing constrains it."""
    if matcher is None and thinking is None:
        return None
    return DraftConstraint(matcher, thinking, output_ids)
