"""Tool-call ids in the form Mistral's tokenizers validate: 9 ASCII letters or digits.

``new_call_id()`` draws a fresh random id. ``CallIdMap`` maps the ids a client sends back in
its history (OpenAI's ``call_abc123...``, or anything else) to 9-character ids, the same id
each time within one conversation, and never the same 9-character id for two different
originals: an id that already is 9 alphanumerics is kept; otherwise the last 9
alphanumerics are taken (vLLM's rule), and when those collide with another original's
mapped id (or there are fewer than 9), a deterministic hash of the original is used instead,
re-hashed until it is free. ``AnswerIds``: the ids of one answer's calls, unique within it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from collections.abc import Callable

ALPHABET = string.ascii_letters + string.digits
CALL_ID_LEN = 9
_VALID = re.compile(r"[a-zA-Z0-9]{9}")


def new_call_id() -> str:
    """A random 9-character alphanumeric id."""
    return "".join(secrets.choice(ALPHABET) for _ in range(CALL_ID_LEN))


def is_call_id(text: str) -> bool:
    return _VALID.fullmatch(text) is not None


class AnswerIds:
    """One answer's call ids: ``ids(given)`` is the model's own id (``given``, 9
    alphanumerics) unless an earlier call of the answer has it, else a fresh one
    (``new_id``), never one the answer gave already: two calls of one answer never share
    an id (a client matches each call's result to it by id)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new = new_id
        self._taken: set[str] = set()

    def __call__(self, given: object = None) -> str:
        ok = isinstance(given, str) and is_call_id(given) and given not in self._taken
        out = given if ok else self._new()
        while out in self._taken:
            out = self._new()
        self._taken.add(out)
        return out


def _hashed(original: str, attempt: int) -> str:
    digest = hashlib.sha256(f"{attempt}:{original}".encode()).digest()
    return "".join(ALPHABET[b % len(ALPHABET)] for b in digest[:CALL_ID_LEN])


class CallIdMap:
    """One conversation's original id -> 9-character id (stable, collision-free)."""

    def __init__(self) -> None:
        self._to_short: dict[str, str] = {}
        self._taken: dict[str, str] = {}  # short -> original

    def __call__(self, original: str) -> str:
        if original in self._to_short:
            return self._to_short[original]
        alnum = "".join(c for c in original if c in ALPHABET)
        short = original if is_call_id(original) else alnum[-CALL_ID_LEN:]
        attempt = 0
        while len(short) != CALL_ID_LEN or short in self._taken:
            short, attempt = _hashed(original, attempt), attempt + 1
        self._to_short[original] = short
        self._taken[short] = original
        return short

    def original(self, short: str) -> str | None:
        """The id the client used for ``short`` (None when unknown)."""
        return self._taken.get(short)
