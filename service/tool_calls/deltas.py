"""What the parsers return, in OpenAI's chat shapes.

Parsers emit events, one per thing that happened in order: ``Content(text)``,
``Reasoning(text)``, ``CallStart(index, id, name)`` and ``CallArgs(index, text)``.
``DeltaMessage.of(events)`` folds one engine step's events into one OpenAI delta and keeps
them in order (``DeltaMessage.events``) for the APIs whose answer is a list of blocks in
output order (Anthropic's content blocks, Responses' output items);
``ParsedMessage.of(events)`` folds a whole output into the non-streaming message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    index: int
    text: str


Event = Content | Reasoning | CallStart | CallArgs


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text as generated (see arguments_valid)

    @property
    def arguments_valid(self) -> bool:
        """Whether ``arguments`` parses as a JSON object."""
        try:
            return isinstance(json.loads(self.arguments), dict)
        except ValueError:
            return False

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ParsedMessage:
    """A whole output: content, reasoning_content and tool_calls."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    @classmethod
    def of(cls, events: Iterable[Event]) -> ParsedMessage:
        msg = cls()
        for e in events:
            if isinstance(e, Content):
                msg.content += e.text
            elif isinstance(e, Reasoning):
                msg.reasoning_content += e.text
            elif isinstance(e, CallStart):
                msg.tool_calls.append(ToolCall(e.id, e.name, ""))
            else:
                msg.tool_calls[e.index].arguments += e.text
        return msg

    def to_openai(self) -> dict[str, Any]:
        """The assistant message; empty content is null, as OpenAI sends it with tool calls."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None  # set on a call's first delta only, with name
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class DeltaMessage:
    """One step's delta. A call's first delta carries id, type, name and the arguments of
    the same step ("" when none came yet); later steps carry argument fragments. A delta
    holds one entry per call index, as OpenAI's stream does (clients such as llama-index
    read only the first entry of an index)."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    # the step's events in output order, empty text left out (see ``of``)
    events: list[Event] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of(cls, events: Iterable[Event]) -> DeltaMessage:
        d = cls()
        d.events = _runs(events)
        for e in d.events:
            if isinstance(e, Content):
                d.content += e.text
            elif isinstance(e, Reasoning):
                d.reasoning_content += e.text
            elif isinstance(e, CallStart):
                d.tool_calls.append(ToolCallDelta(e.index, e.id, e.name))
            elif d.tool_calls and d.tool_calls[-1].index == e.index:
                d.tool_calls[-1].arguments += e.text
            else:
                d.tool_calls.append(ToolCallDelta(e.index, arguments=e.text))
        d.tool_calls = [t for t in d.tool_calls if t.id is not None or t.arguments]
        return d

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning_content or self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """The ``choices[i].delta`` object (fields with nothing new are left out)."""
        out: dict[str, Any] = {}
        if self.content:
            out["content"] = self.content
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [t.to_openai() for t in self.tool_calls]
        return out


def _runs(events: Iterable[Event]) -> list[Event]:
    """``events`` with empty text left out and neighbours of one kind (text, reasoning, one
    call's arguments) joined."""
    out: list[Event] = []
    for e in events:
        if not isinstance(e, CallStart) and not e.text:
            continue
        last = out[-1] if out else None
        if type(last) is type(e) and not isinstance(e, CallStart) and (
                not isinstance(e, CallArgs) or e.index == last.index):
            out[-1] = (CallArgs(e.index, last.text + e.text) if isinstance(e, CallArgs)
                       else type(e)(last.text + e.text))
        else:
            out.append(e)
    return out
