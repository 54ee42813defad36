"""What the parsers need from a tokenizer: special-token ids by name, and decoding.
engine.text.tokenizer.Tokenizer provides both (``token_to_id``, ``decode``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TokenVocab(Protocol):
    def token_to_id(self, token: str) -> int | None: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class MissingTokenError(ValueError):
    """The tokenizer has no such special token (the parser cannot be used with it)."""


def special_id(vocab: TokenVocab, name: str, required: bool = True) -> int | None:
    """The id of special token ``name`` (e.g. "[TOOL_CALLS]"), resolved from the tokenizer."""
    tid = vocab.token_to_id(name)
    if tid is None and required:
        raise MissingTokenError(f"the tokenizer has no {name} token")
    return tid
