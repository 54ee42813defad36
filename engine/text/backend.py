"""What a tokenizer backend provides (engine/text/tokenizer.py's HfBackend, and
engine/text/tokenizer_tekken.py's TekkenBackend), and the error either raises when a
directory's tokenizer cannot be loaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class TokenizerLoadError(RuntimeError):
    """The directory has no usable tokenizer; the message names the file."""


class Backend(Protocol):
    path: Path  # the tokenizer file (tokenizer.json or tekken.json)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def encode_plain(self, text: str) -> list[int]:
        """``text`` as characters: special-token strings in it are not their ids."""
        ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...
    def id_to_token(self, token_id: int) -> str | None: ...
    def token_bytes(self, token_id: int) -> bytes: ...
    def token_to_id(self, token: str) -> int | None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def id_bound(self) -> int:
        """1 + the largest id (ids may be sparse: above vocab_size - 1)."""
        ...
    @property
    def special_ids(self) -> frozenset[int]: ...
