"""Streaming text out of generated token ids, with stop strings.

Incremental decoding uses the prefix-offset technique of vLLM/TGI: each step decodes a
short window ``ids[prefix_offset:]`` and compares it with ``ids[prefix_offset:read_offset]``;
the difference is the new text. While the window decodes to text ending in U+FFFD (a
multi-byte UTF-8 character split across tokens) nothing is released, so a stream never shows
a replacement character for a character that later completes. The window starts a few prompt
tokens back so tokenizers that strip a leading space from the first decoded token
(SentencePiece) still produce the right spacing.

Stop strings: text that could still be the start of a stop string is held back, so a stop
string is never emitted half-way. On a match the output is cut before the stop string (or
after it, with ``include_stop_str_in_output``) and the step reports ``stopped``. As in
vLLM, a stop string matches only where it ends in the text of a token past the first
``min_tokens`` (the request's own: stop strings do not end it earlier).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

INITIAL_WINDOW = 5  # prompt tokens decoded as left context
REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True, slots=True)
class DetokStep:
    new_text: str  # text safe to show now (may be "")
    stopped: bool = False  # a stop string matched; the sequence finishes with reason "stop"
    stop_str: str | None = None  # which stop string matched


def held_suffix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def find_stop(text: str, stops: Sequence[str], end: int) -> tuple[int, str] | None:
    """Earliest (index, stop string) match in ``text`` that ends after index ``end``."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, max(0, end - len(s) + 1))
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(s) > len(best[1]))):
            best = (i, s)
    return best


class IncrementalDetokenizer:
    """One sequence's output text. Not thread-safe; one instance per request.

    tokenizer: anything with ``decode(ids, skip_special_tokens)`` (engine.text.tokenizer.Tokenizer).
    prompt_ids: the prompt, used only as left context for the first tokens.
    """

    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int],
                 stop: Sequence[str] = (), skip_special_tokens: bool = True,
                 include_stop_str_in_output: bool = False, min_tokens: int = 0) -> None:
        self._tok = tokenizer
        self._min_tokens = min_tokens
        self._pushed = 0  # output tokens pushed
        self._skip = skip_special_tokens
        self._stops = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        context = list(prompt_ids[-INITIAL_WINDOW:])
        self._ids: list[int] = context
        self._prefix = 0
        self._read = len(context)
        self._text = ""  # decoded output text (cut at a stop string once stopped)
        self._emitted = 0  # chars of _text already returned
        self.stopped = False
        self.stop_str: str | None = None

    @property
    def text(self) -> str:
        """All output text decoded so far, held-back text included."""
        return self._text

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _decode_new(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        full = self._decode(self._ids[self._prefix:])
        if len(full) <= len(prefix_text) or (full.endswith(REPLACEMENT) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full[len(prefix_text):]

    def _advance(self, delta: str, final: bool) -> DetokStep:
        before = len(self._text)
        self._text += delta
        # vLLM's: a stop string that ends in the new text (text before it was searched
        # when it came, unless it came within min_tokens: then it is never a stop)
        match = (find_stop(self._text, self._stops, before)
                 if self._stops and self._pushed > self._min_tokens else None)
        if match is not None:
            idx, s = match
            self._text = self._text[: idx + len(s) if self._include_stop else idx]
            self.stopped, self.stop_str = True, s
        hold = 0 if (final or self.stopped) else held_suffix_len(self._text, self._stops)
        end = max(self._emitted, len(self._text) - hold)
        out = self._text[self._emitted:end]
        self._emitted = end
        return DetokStep(out, self.stopped, self.stop_str)

    def push(self, token_id: int) -> DetokStep:
        """Add one generated token; returns the text that may be shown now."""
        if self.stopped:
            return DetokStep("", True, self.stop_str)
        self._pushed += 1
        self._ids.append(token_id)
        return self._advance(self._decode_new(final=False), final=False)

    def flush(self) -> str:
        """The sequence ended (EOS, length): release everything still held back, including
        an incomplete UTF-8 tail (as U+FFFD). A stop string found here still truncates."""
        if self.stopped:
            return ""
        return self._advance(self._decode_new(final=True), final=True).new_text
