"""Consecutive messages of one role as one turn: Anthropic combines consecutive user (or
assistant) messages, and a Responses input's items are the turns of one conversation. The
published Ministral-3 template refuses two user turns in a row (its roles must
alternate), and mistral-common joins them into one; joined here, every file set reads
them alike. Used by the Messages and Responses translations; chat messages are passed as
the client sent them, as vLLM passes them."""

from __future__ import annotations

from typing import Any


def one_turn_each(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user (or assistant) messages as one turn of their parts in order, as
    Anthropic combines them (a template that wants roles to alternate refused them)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        prev = out[-1] if out else None
        if prev is None or prev["role"] != msg["role"] or msg["role"] not in ("user",
                                                                              "assistant"):
            out.append(msg)
            continue
        parts = _as_parts(prev["content"]) + _as_parts(msg["content"])
        joined = {**prev, "content": parts or None}
        calls = prev.get("tool_calls", []) + msg.get("tool_calls", [])
        out[-1] = {**joined, "tool_calls": calls} if calls else joined
    return out


def _as_parts(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
