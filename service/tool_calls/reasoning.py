"""Reasoning parsers: split reasoning_content from the rest of the output.

``MistralReasoningParser``: ``[THINK] ... [/THINK]`` special tokens (looked up by name).
``ThinkTagReasoningParser``: ``<think> ... </think>`` in text; ``starts_inside=True`` for
templates that open ``<think>`` in the prompt (the output then starts as reasoning).

Both take pieces and return Reasoning events for reasoning text and pass every other
piece on, in order, to the tool-call parser. A block that is never closed (``</s>`` or
the end comes first) is all reasoning, as vLLM reports it; no part of a tag is ever
returned as text.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.tool_calls.deltas import Reasoning
from service.tool_calls.pieces import Piece
from service.tool_calls.tags import TagSplitter
from service.tool_calls.vocab import TokenVocab, special_id

Item = Piece | Reasoning
# each parser's (start, end) markers; "think-open" starts inside (the prompt opened it)
REASONING_TAGS = {"mistral": ("[THINK]", "[/THINK]"), "think": ("<think>", "</think>"),
                  "think-open": ("<think>", "</think>")}
STARTS_INSIDE = frozenset({"think-open"})


class MistralReasoningParser:
    def __init__(self, vocab: TokenVocab) -> None:
        self.begin = special_id(vocab, "[THINK]")
        self.end = special_id(vocab, "[/THINK]")
        self.structural = frozenset((self.begin, self.end))
        self._inside = False

    def feed(self, pieces: Sequence[Piece]) -> list[Item]:
        out: list[Item] = []
        for p in pieces:
            if p == self.begin or p == self.end:
                self._inside = p == self.begin
            elif isinstance(p, str) and self._inside:
                out.append(Reasoning(p))
            else:
                out.append(p)
        return out

    def finish(self) -> list[Item]:
        return []


class ThinkTagReasoningParser:
    structural: frozenset[int] = frozenset()

    def __init__(self, vocab: object = None, starts_inside: bool = False) -> None:
        self._tags = TagSplitter("<think>", "</think>", inside=starts_inside)

    def feed(self, pieces: Sequence[Piece]) -> list[Item]:
        out: list[Item] = []
        for p in pieces:
            if isinstance(p, str):
                out += _items(self._tags.feed(p))
            else:
                out += _items(self._tags.finish())  # a special token ends held-back text
                out.append(p)
        return out

    def finish(self) -> list[Item]:
        return _items(self._tags.finish())


def _items(parts: list[tuple[str, str]]) -> list[Item]:
    return [Reasoning(t) if where == "in" else t for where, t in parts if where != "close"]
