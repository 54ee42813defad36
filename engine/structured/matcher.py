"""Per-request grammar state (an llguidance matcher) and the batched mask fill.

The engine thread owns every GrammarMatcher: each step it fills the masks of the
constrained rows (:func:`fill_token_mask`, in parallel through llguidance's executor, which
releases the GIL), the sampler applies them, then each matcher consumes its row's sampled
token (:meth:`GrammarMatcher.advance`). A matcher that has consumed the request's output
tokens stays consistent across preemption: recompute re-runs the same tokens through the
model, never through the matcher.

Speculative decoding (engine/spec/) reads ahead without moving a matcher for good:
:meth:`GrammarMatcher.validate` counts the draft tokens the grammar accepts (nothing
consumed), :meth:`GrammarMatcher.forced` lists the tokens the grammar forces next,
:meth:`GrammarMatcher.tentative` / :meth:`GrammarMatcher.rollback` move it over a draft and
back, and :func:`fill_draft_masks` fills the masks of every position of a draft (the
matcher advanced over it and rolled back inside llguidance).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from engine.structured.token_mask import TokenMask


class GrammarMatchError(RuntimeError):
    """A matcher rejected a token or is in an error state (ends that request only)."""


class GrammarDeadEnd(GrammarMatchError):
    """The grammar admits no token after the output so far: a schema or grammar that no
    output completes (required properties that recurse without end), or one past the
    parser's limits. The request's own input, not the server's failure (a 400)."""


class GrammarMatcher:
    def __init__(self, matcher: Any, vocab_size: int, kind: str = "grammar") -> None:
        self._m = matcher  # llguidance.LLMatcher
        self.vocab_size = vocab_size
        self.kind = kind  # engine.structured.spec.KINDS: the grammar's metrics label

    @property
    def is_done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow (or EOS was consumed)."""
        return self._m.is_stopped() and not self._m.is_error()

    def check(self) -> None:
        """GrammarDeadEnd when the matcher is in an error state: only llguidance's own
        parsing puts it there (a token outside its mask fails in :meth:`advance`)."""
        if self._m.is_error():
            reason = (self._m.get_error().strip().splitlines() or ["unknown error"])[0]
            raise GrammarDeadEnd(f"the {self.kind} constraint admits no token after the "
                                 f"output so far ({reason}): no output satisfies it")

    def advance(self, token: int) -> None:
        """Consume the sampled token; GrammarMatchError if the grammar rejects it,
        GrammarDeadEnd if the mask it was sampled under found no way on (llguidance then
        allows EOS alone and takes it: the answer would end as if the grammar were done)."""
        if not self._m.consume_token(token):
            self.check()
            raise GrammarMatchError(f"grammar matcher rejected token {token}")
        self.check()

    def validate(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, in order from the current state, the grammar accepts
        (nothing is consumed)."""
        return self._m.validate_tokens(list(tokens)) if tokens else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces from the current state (llguidance's fast-forward
        tokens: its forced bytes, tokenized; [] when the next token is a choice)."""
        return self._m.compute_ff_tokens()

    def tentative(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens``, all of which :meth:`validate` accepted, to be rolled back."""
        if tokens and not self._m.consume_tokens(list(tokens)):
            self.check()
            raise GrammarMatchError(f"grammar matcher rejected draft tokens {list(tokens)}")

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` consumed tokens."""
        if num_tokens and not self._m.rollback(num_tokens):
            self.check()
            raise GrammarMatchError(f"grammar matcher cannot roll back {num_tokens} tokens")

    def fill(self, row: torch.Tensor) -> None:
        """row [W] int32 contiguous: this matcher's next-token bitmask."""
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    @property
    def llg(self) -> Any:
        return self._m


_executor: Any = None
_executor_lock = threading.Lock()


def _shared_executor() -> Any:
    global _executor
    with _executor_lock:
        if _executor is None:
            import llguidance as llg

            _executor = llg.LLExecutor()
        return _executor


def fill_token_mask(rows: Sequence[int], matchers: Sequence[GrammarMatcher]) -> TokenMask:
    """The masks of ``matchers`` for batch ``rows`` (same order); GrammarMatchError when a
    matcher is in an error state."""
    if len(rows) != len(matchers):
        raise ValueError(f"{len(rows)} rows but {len(matchers)} matchers")
    for m in matchers:
        m.check()
    vocab = matchers[0].vocab_size if matchers else 0
    if any(m.vocab_size != vocab for m in matchers):
        raise ValueError("matchers of one batch must share a vocabulary")
    bits = torch.empty(len(rows), (vocab + 31) // 32, dtype=torch.int32)
    if len(matchers) == 1:
        matchers[0].fill(bits[0])
    elif matchers:
        pairs = [(m.llg, j) for j, m in enumerate(matchers)]
        _shared_executor().unsafe_compute_mask_ptr(pairs, bits.data_ptr(),
                                                   bits.shape[1] * 4, len(matchers))
    return TokenMask(tuple(rows), bits, vocab)


def fill_draft_masks(matchers: Sequence[GrammarMatcher],
                     drafts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """For each matcher and its draft of K tokens (each accepted by ``validate``), the
    masks of the K + 1 positions a verify chunk samples: [K + 1, W] int32, row j the mask
    after the first j draft tokens (row 0: the mask plain decoding fills now). K + 1 fills
    per matcher, in parallel across matchers; every matcher is left where it was."""
    if len(matchers) != len(drafts):
        raise ValueError(f"{len(matchers)} matchers but {len(drafts)} drafts")
    for m in matchers:
        m.check()
    if not matchers:
        return []
    vocab = matchers[0].vocab_size
    if any(m.vocab_size != vocab for m in matchers):
        raise ValueError("matchers of one batch must share a vocabulary")
    w = (vocab + 31) // 32
    sizes = [len(d) + 1 for d in drafts]
    bits = torch.zeros(sum(sizes), w, dtype=torch.int32)  # a position never reached: 0
    jobs, row = [], 0
    for m, d, n in zip(matchers, drafts, sizes, strict=True):
        jobs.append((m.llg, row, list(d)))
        row += n
    _shared_executor().unsafe_compute_mask_ptr_with_draft_token(jobs, bits.data_ptr(), w * 4,
                                                                bits.shape[0])
    return list(bits.split(sizes))
