"""Tool-call ids in a chat history: kept as sent for templates that take any id, mapped to
9-character ids (the same one for a call and its result) for Mistral tokenizers."""

from __future__ import annotations

from service.prompts import message_dicts
from service.schemas import ChatMessage
from service.tool_calls.call_ids import CallIdMap, is_call_id

HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9f8e7d6c5b4a39281706", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "abcDEF123", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_9f8e7d6c5b4a39281706", "content": "18C"},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": [{"type": "text", "text": "25C"}]},
]


def _messages():
    return [ChatMessage.model_validate(m) for m in HISTORY]


def test_ids_are_kept_without_a_map():
    d = message_dicts(_messages())
    assert d[1]["tool_calls"][0]["id"] == "call_9f8e7d6c5b4a39281706"
    # content as sent (None, parts): the tokenizer shapes it for its template
    assert d[1]["content"] is None and d[3]["content"] == [{"type": "text", "text": "25C"}]
    assert d[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_mistral_ids_are_nine_characters_and_pair_up():
    d = message_dicts(_messages(), CallIdMap())
    first, second = (c["id"] for c in d[1]["tool_calls"])
    assert is_call_id(first) and first != "call_9f8e7d6c5b4a39281706"
    assert second == "abcDEF123"  # already valid: kept
    assert (d[2]["tool_call_id"], d[3]["tool_call_id"]) == (first, second)
    again = message_dicts(_messages(), CallIdMap())  # the next turn maps the same way
    assert again[1]["tool_calls"][0]["id"] == first
