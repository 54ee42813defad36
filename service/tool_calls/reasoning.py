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
from typing import Any

from service.tool_calls.deltas import Reasoning
from service.tool_calls.pieces import Piece
from service.tool_calls.tags import TagSplitter
from service.tool_calls.vocab import TokenVocab, special_id

Item = Piece | Reasoning
# each parser's (start, end) markers; "think-open" starts inside (the prompt opened it)
# "mistral-open" is no startup choice: the reading of a prompt that left a [THINK] section
# open (a prefilled assistant message), chosen per request (parser_for_prompt)
REASONING_TAGS = {"mistral": ("[THINK]", "[/THINK]"), "think": ("<think>", "</think>"),
                  "think-open": ("<think>", "</think>"),
                  "mistral-open": ("[THINK]", "[/THINK]")}
STARTS_INSIDE = frozenset({"think-open", "mistral-open"})
# each parser's two readings: (the answer starts outside a section, inside one)
OPENINGS = {p: pair for pair in (("mistral", "mistral-open"), ("think", "think-open"))
            for p in pair}


class MistralReasoningParser:
    def __init__(self, vocab: TokenVocab, starts_inside: bool = False) -> None:
        self.begin = special_id(vocab, "[THINK]")
        self.end = special_id(vocab, "[/THINK]")
        self.structural = frozenset((self.begin, self.end))
        self._inside = starts_inside

    @property
    def inside(self) -> bool:
        """Whether what was read so far ends inside a section."""
        return self._inside

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
    """``<think>`` / ``</think>`` read in the text; where the tokenizer makes one a special
    token (which decodes to no text), that token is structural and read by its id, as the
    grammar (engine/structured/reasoning.py) and the thinking budget write and count it."""

    def __init__(self, vocab: object = None, starts_inside: bool = False) -> None:
        self._tags = TagSplitter("<think>", "</think>", inside=starts_inside)
        self.begin, self.end = (_special_tag(vocab, t) for t in REASONING_TAGS["think"])
        self.structural = frozenset(t for t in (self.begin, self.end) if t is not None)

    @property
    def inside(self) -> bool:
        """Whether what was read so far ends inside a section (a close tag held back in
        part has not closed it)."""
        return self._tags.inside

    def feed(self, pieces: Sequence[Piece]) -> list[Item]:
        out: list[Item] = []
        for p in pieces:
            if isinstance(p, str):
                out += _items(self._tags.feed(p))
                continue
            out += _items(self._tags.finish())  # a special token ends held-back text
            if p == self.begin or p == self.end:
                self._tags.inside = p == self.begin  # as MistralReasoningParser reads
            else:
                out.append(p)
        return out

    def finish(self) -> list[Item]:
        return _items(self._tags.finish())


def _special_tag(vocab: object, text: str) -> int | None:
    """The id of ``text`` where it is a special token of ``vocab``, else None."""
    lookup = getattr(vocab, "token_to_id", None)
    is_special = getattr(vocab, "is_special", None)
    tid = lookup(text) if lookup is not None else None
    return tid if tid is not None and is_special is not None and is_special(tid) else None


def _items(parts: list[tuple[str, str]]) -> list[Item]:
    return [Reasoning(t) if where == "in" else t for where, t in parts if where != "close"]


def _special_markers(tok: Any, parser: str) -> tuple[int, int] | None:
    """The ids of ``parser``'s two markers where both are special tokens of ``tok``
    (message text never encodes to those: only a template's own markup writes them)."""
    begin, end = (_special_tag(tok, m) for m in REASONING_TAGS[parser])
    return None if begin is None or end is None else (begin, end)


def opens_section(begin: str, end: str, text: str) -> bool:
    """``text`` ends inside a section: its last ``begin`` comes after its last ``end``."""
    return text.rfind(begin) > text.rfind(end)


def prompt_opens_section(tok: Any, parser: str, prompt: Sequence[int],
                         prefill: str | None = None) -> bool:
    """Whether the answer to ``prompt`` (ids of tokenizer ``tok``) starts inside a
    reasoning section of ``parser``:

    * markers that are special tokens (``[THINK]``): the prompt's last marker is the begin
      one, read by id (a template that opens the section for the answer);
    * text markers (``<think>``, which a message's text may spell too): ``prefill``, the
      prefilled assistant message's text (continue_final_message), ends inside a section;
      without one, the template's generation prompt opens it (``think-open``, as told at
      startup)."""
    special = _special_markers(tok, parser)
    if special is not None:
        tail = list(reversed(prompt))  # list.index scans in C: ~1 ms at 130k ids
        first = [tail.index(t) if t in tail else len(tail) for t in special]
        return first[0] < first[1]
    if prefill is not None:
        return opens_section(*REASONING_TAGS[parser], prefill)
    return parser in STARTS_INSIDE


def parser_for_prompt(tok: Any, parser: str | None, prompt: Sequence[int],
                      prefill: str | None = None) -> str | None:
    """The reasoning parser that reads the answer to ``prompt``: the reading of the
    server's parser that starts inside a section where the prompt left one open
    (``think-open``, ``mistral-open``; prompt_opens_section), else the one that starts
    outside (``think``, ``mistral``); None as it is."""
    if parser is None:
        return None
    return OPENINGS[parser][prompt_opens_section(tok, parser, prompt, prefill)]
