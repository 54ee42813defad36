"""Hermes/Qwen-style tool calls in text: ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` blocks (the demo model's convention); text outside blocks is content.

A call is delivered when its block closes (first delta: id, name, arguments ""; then the
arguments in one fragment). Content never shows any part of a ``<tool_call>`` tag. A
``</tool_call>`` inside a JSON string of the block (an argument that quotes the tag, which
a tool grammar allows) is part of that string, not the block's end.

A block still open at the end of the output (``max_tokens`` cut its closing tag, or part
of it) whose JSON is a whole call is that call, as the end of the output closes a Mistral
call; one cut inside its JSON after a whole ``name`` is that call with the arguments as
cut (OpenAI's answer to a call ``max_tokens`` cuts). Malformed blocks: a block whose
JSON does not parse, is not an object, or has no valid ``name`` (a block cut before its
name is whole among them) become content verbatim, tags included (what the model wrote
is never lost). Special tokens are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service.tool_calls.call_ids import AnswerIds, new_call_id
from service.tool_calls.call_json import call_events, cut_call_events, outside_json_string
from service.tool_calls.deltas import Content, Event
from service.tool_calls.pieces import Piece
from service.tool_calls.tags import TagSplitter

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser:
    structural: frozenset[int] = frozenset()

    def __init__(self, vocab: object = None,
                 new_id: Callable[[], str] | AnswerIds = new_call_id,
                 strings: bool = True) -> None:
        """``strings`` False: every close tag ends its block (the rule for a block whose
        JSON never closed its string; see finish)."""
        self._new_id = new_id if isinstance(new_id, AnswerIds) else AnswerIds(new_id)
        self._tags = TagSplitter(OPEN, CLOSE, closes=outside_json_string if strings else None)
        self._block = ""
        self._count = 0

    def feed(self, pieces: Sequence[Piece]) -> list[Event]:
        out: list[Event] = []
        for p in pieces:
            if isinstance(p, str):
                self._items(self._tags.feed(p), out)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._items(self._tags.finish(), out)
        if self._tags.inside and CLOSE in self._block:
            # a string that never closed held close tags: what followed the first one is
            # read again with every close tag ending its block (malformed output only; a
            # tool grammar closes its strings), so later calls and text are not lost
            again = HermesToolParser(new_id=self._new_id, strings=False)
            again._count = self._count
            out += again.feed([OPEN + self._block]) + again.finish()
            self._count, self._block = again._count, ""
            return out
        if self._tags.inside:
            body = self._block.rstrip()
            cut = next((k for k in range(len(CLOSE), 0, -1) if body.endswith(CLOSE[:k])), 0)
            body = body[:len(body) - cut].strip()
            events = (call_events(body, self._count, self._new_id)
                      or cut_call_events(body, self._count, self._new_id))
            if events is None:
                out.append(Content(OPEN + self._block))
            else:
                out += events
                self._count += 1
            self._block = ""
        return out

    def _items(self, items: list[tuple[str, str]], out: list[Event]) -> None:
        for where, text in items:
            if where == "out":
                out.append(Content(text))
            elif where == "in":
                self._block += text
            else:
                events = call_events(self._block.strip(), self._count, self._new_id)
                if events is None:
                    out.append(Content(OPEN + self._block + CLOSE))
                else:
                    out += events
                    self._count += 1
                self._block = ""
