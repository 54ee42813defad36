"""Per-request grammar state (an llguidance matcher) and the batched mask fill.

The engine thread owns every GrammarMatcher: each step it fills the masks of the
constrained rows (:func:`fill_token_mask`, in parallel through llguidance's executor, which
releases the GIL), the sampler applies them, then each matcher consumes its row's sampled
token (:meth:`GrammarMatcher.advance`). A matcher that has consumed the request's output
tokens stays consistent across preemption: recompute re-runs the same tokens through the
model, never through the matcher.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from engine.structured.token_mask import TokenMask


class GrammarMatchError(RuntimeError):
    """A matcher rejected a token or is in an error state (ends that request only)."""


class GrammarMatcher:
    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m = matcher  # llguidance.LLMatcher
        self.vocab_size = vocab_size

    @property
    def is_done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow (or EOS was consumed)."""
        return self._m.is_stopped() and not self._m.is_error()

    def check(self) -> None:
        if self._m.is_error():
            reason = (self._m.get_error().strip().splitlines() or ["unknown error"])[0]
            raise GrammarMatchError(f"grammar matcher: {reason}")

    def advance(self, token: int) -> None:
        """Consume the sampled token; GrammarMatchError if the grammar rejects it."""
        if not self._m.consume_token(token):
            self.check()
            raise GrammarMatchError(f"grammar matcher rejected token {token}")

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
