"""A call written as JSON (``{"name": ..., "arguments": {...}}``: the v3-v7 Mistral list
elements and Hermes ``<tool_call>`` blocks) -> events, or None when it is not a call."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic_core import from_json

from service.tool_calls.call_ids import AnswerIds
from service.tool_calls.deltas import CallArgs, CallStart, Event

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's function-name rule, plus "."


def valid_name(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def arguments_text(args: Any) -> str:
    """Arguments as a JSON string: a string is kept as given, anything else is dumped."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def complete_members(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object: a call cut by max_tokens keeps its complete
    members (a cut string is left out, as the anthropic SDK's stream accumulator parses
    the same text); text that is no object at all is ``{}``."""
    try:
        value = from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _object_so_far(text: str) -> bool:
    """Whether ``text`` reads as a JSON object, whole or cut (as ``complete_members``
    and the anthropic SDK's stream accumulator read it)."""
    try:
        return isinstance(from_json(text, allow_partial=True), dict)
    except ValueError:
        return False


def object_prefix(sent: str, held: str) -> tuple[str, str]:
    """(ready, held): how much of ``held``, a call's arguments text after ``sent`` (text
    already sent, empty or an object so far), may follow it so that the whole still reads
    as a JSON object (``_object_so_far``), and the rest, held back. A client that parses
    every fragment's accumulated text (the anthropic SDK's ``input_json_delta``) raises on
    text that does not: whitespace alone (held until the object starts), arguments that
    are no JSON (the longest prefix that reads as an object goes, the rest never can)."""
    if _object_so_far(sent + held):
        return held, ""
    lo = 0  # the fewest characters of held that can make sent + held[:lo] an object
    if not sent.strip():
        start = len(held) - len(held.lstrip())
        if start == len(held) or held[start] != "{":
            return "", held
        lo = start + 1
    if not _object_so_far(sent + held[:lo]):
        return "", held
    hi = len(held)  # sent + held[:hi] is no object; its prefixes that are, are one run
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _object_so_far(sent + held[:mid]) else (lo, mid)
    return held[:lo], held[lo:]


def call_events(raw: str, index: int, new_id: AnswerIds) -> list[Event] | None:
    """[CallStart, CallArgs] for a JSON object with a valid "name"; None otherwise."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if not valid_name(obj["name"]):
        return None
    call_id = new_id(obj.get("id"))  # the model's own, when it is one
    args = arguments_text(obj.get("arguments", obj.get("parameters", {})))
    return [CallStart(index, call_id, obj["name"]), CallArgs(index, args)]


_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def cut_call_events(raw: str, index: int, new_id: AnswerIds) -> list[Event] | None:
    """[CallStart, CallArgs] for a call whose JSON the end of the output cut: a whole
    valid "name" written before the arguments, which are the text as cut ("" when none
    was written); None otherwise."""
    try:
        obj = from_json(raw, allow_partial=True)
    except ValueError:
        return None
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not valid_name(name):
        return None
    at = raw.find(json.dumps(name))  # the name's own text (ASCII: valid_name)
    found = _ARGUMENTS.search(raw, at + len(name) + 2) if at >= 0 else None
    if found is None and _ARGUMENTS.search(raw) is not None:
        return None  # arguments written before the name: not read as cut
    args = _value_text(raw, found.end()) if found is not None else ""
    return [CallStart(index, new_id(), name), CallArgs(index, args)]


def _json_chars(text: str, start: int = 0) -> Iterator[tuple[int, str, bool]]:
    """(index, character, inside a JSON string after it) from ``start`` on: quotes toggle
    a string, a backslash inside one escapes the next character."""
    inside = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
        yield i, ch, inside


def outside_json_string(text: str) -> bool:
    """Whether ``text`` (a block's JSON so far) ends outside every JSON string."""
    last = (0, "", False)
    for last in _json_chars(text):  # noqa: B007 (the state after the last character)
        pass
    return not last[2]


def _value_text(raw: str, start: int) -> str:
    """The JSON object or array starting at ``raw[start]``: up to its closing bracket when
    it closed, else to the end (cut)."""
    depth = 0
    for i, ch, inside in _json_chars(raw, start):
        if inside or ch not in "{}[]":
            continue
        depth += 1 if ch in "{[" else -1
        if depth == 0:
            return raw[start:i + 1]
    return raw[start:]
