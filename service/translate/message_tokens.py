"""Which generated tokens a message's text is made of, when parsers split an output into
reasoning, text and calls (the Responses API's message logprobs,
service/translate/responses_stream.py).

    tokens = MessageTokens(tokenizer.is_special, reader.text_markers)
    tokens.add(ids, entries)        # each step's token ids and their logprob entries
    tokens.take(event)              # per parser event, in output order: the entries of
                                    # the tokens under a text event's bytes ([] else)

An entry is chat's logprob entry (service/logprob_format.chat_logprobs): a dict with the
token's own ``bytes`` (a list of ints).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from service.tool_calls.deltas import CallStart, Content
from service.tool_calls.deltas import Event as OutputEvent


def _bytes_of(text: str) -> re.Pattern[bytes]:
    """The bytes a decoded text came from: its UTF-8, where each U+FFFD may also stand for
    the incomplete sequence it replaced (text cut inside a character)."""
    return re.compile(b"(?:\\xef\\xbf\\xbd|[\\x80-\\xff]{1,3})".join(
        re.escape(part.encode()) for part in text.split("\ufffd")))


class MessageTokens:
    """Which generated tokens a message's text is made of, when parsers split the output
    into reasoning, text and calls. Every token's entry has its own bytes, and the bytes
    of the tokens the text can show (not special tokens, which decode to nothing) joined
    are the output as generated, markers included; each event's text is found there in
    output order, and the tokens under a text event's bytes are the message's. The
    others (reasoning, calls, their markers, special tokens, the end token) carry no
    entry, as OpenAI's reasoning and function_call items have no logprobs."""

    def __init__(self, silent: Callable[[int], bool], markers: Sequence[str] = ()) -> None:
        self.silent = silent  # a token whose text the output never shows
        self.markers = tuple(m.encode() for m in markers if m)  # parsers' text markers
        self.raw = bytearray()
        self.ends: list[int] = []  # token i's bytes are raw[ends[i - 1]:ends[i]]
        self.entries: list[dict[str, Any] | None] = []  # None: a silent token's
        self.cursor = 0  # bytes before it are read by earlier events
        self.given = 0  # tokens before it are placed (given to a message or passed over)

    def _find(self, text: str) -> tuple[int, int] | None:
        """The span of ``text``'s bytes from the cursor on, outside the parsers' text
        markers (a short text can sit inside one: "k" in </think>)."""
        pattern, pos = _bytes_of(text), self.cursor
        while (m := pattern.search(self.raw, pos)) is not None:
            if not any(self._marker_over(marker, *m.span()) for marker in self.markers):
                return m.span()
            pos = m.start() + 1
        return None

    def _marker_over(self, marker: bytes, start: int, end: int) -> bool:
        at = self.raw.find(marker, max(0, start - len(marker) + 1), end + len(marker) - 1)
        return at >= 0 and at < end

    def add(self, ids: Sequence[int], entries: Sequence[dict[str, Any]]) -> None:
        for i, e in zip(ids, entries, strict=True):
            shown = not self.silent(i)
            if shown:
                self.raw += bytes(e["bytes"])
            self.ends.append(len(self.raw))
            self.entries.append(e if shown else None)

    def take(self, event: OutputEvent) -> list[dict[str, Any]]:
        """The entries a text event's delta carries ([] for the other events, and for a
        text not found as generated: the parser wrote it)."""
        text = event.name if isinstance(event, CallStart) else event.text
        found = self._find(text) if text else None
        if found is None:
            return []
        at, self.cursor = found
        if not isinstance(event, Content):
            return []
        first = max(self.given, bisect_right(self.ends, at))
        self.given = max(self.given, bisect_left(self.ends, self.cursor) + 1)
        return [e for e in self.entries[first:self.given] if e is not None]
