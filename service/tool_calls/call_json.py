"""A call written as JSON (``{"name": ..., "arguments": {...}}``: the v3-v7 Mistral list
elements and Hermes ``<tool_call>`` blocks) -> events, or None when it is not a call."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic_core import from_json

from service.tool_calls.call_ids import is_call_id
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


def call_events(raw: str, index: int, new_id: Callable[[], str]) -> list[Event] | None:
    """[CallStart, CallArgs] for a JSON object with a valid "name"; None otherwise."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if not valid_name(obj["name"]):
        return None
    given = obj.get("id")
    call_id = given if isinstance(given, str) and is_call_id(given) else new_id()
    args = arguments_text(obj.get("arguments", obj.get("parameters", {})))
    return [CallStart(index, call_id, obj["name"]), CallArgs(index, args)]
