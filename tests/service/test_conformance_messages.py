"""The conformance matrix, Anthropic Messages through the anthropic SDK (tests/service/
conformance.py: one server per checkpoint). Each request: HTTP 200, a result valid for
its schema, and the SDK's stream accumulator (``messages.stream``) ends with the message
the non-streamed request gave (greedy). The agent loop sends the returned blocks back as
the SDK serializes them (``model_dump()``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.service.conformance import (
    ANSWER,
    ASK,
    CHAT_TOOLS,
    MESSAGES_NO_THINKING,
    RESULT,
    VISION,
    check_args,
    ok,
    png_data_url,
)

TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in CHAT_TOOLS]
USER = [{"role": "user", "content": ASK}]
GREEDY = {"temperature": 0}  # the SDK takes it as an extra field; the server reads it


def _blocks(m):
    """A message's content, ids aside (the stream and the body draw their own)."""
    return [b.model_dump(exclude={"id"}) for b in m.content]


def _both(s, **kw):
    """(non-streamed, streamed) messages of one greedy request; they must agree."""
    kw = {"messages": USER, "max_tokens": 12, "extra_body": GREEDY, **kw}
    whole = ok(s.anthropic.messages.with_raw_response.create(model=s.model, **kw))
    with s.anthropic.messages.stream(model=s.model, **kw) as stream:
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(whole)
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason,
                                                              whole.usage.output_tokens)
    return whole


def _calls(m):
    return [b for b in m.content if b.type == "tool_use"]


def test_plain_text(matrix):
    m = _both(matrix, system="Answer briefly.")
    assert [b.type for b in m.content] in (["text"], [])
    assert m.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("choice", ["any", "named"])
def test_forced_call(matrix, choice):
    tool_choice = ({"type": "any", "disable_parallel_tool_use": True} if choice == "any"
                   else {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True})
    m = _both(matrix, tools=TOOLS, tool_choice=tool_choice, max_tokens=60,
              **MESSAGES_NO_THINKING)
    calls = _calls(m)
    assert m.stop_reason == "tool_use" and len(calls) == 1, m
    check_args(calls[0].name, calls[0].input)
    assert choice == "any" or calls[0].name == "get_time"


def test_agent_loop(matrix):
    first = ok(matrix.anthropic.messages.with_raw_response.create(
        model=matrix.model, messages=USER, tools=TOOLS, max_tokens=60, extra_body=GREEDY,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **MESSAGES_NO_THINKING))
    assert _calls(first)
    history = [*USER, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": c.id, "content": RESULT}
                   for c in _calls(first)]}]
    m = _both(matrix, messages=history, tools=TOOLS, max_tokens=24, **MESSAGES_NO_THINKING)
    for call in _calls(m):  # a second call, or an answer
        check_args(call.name, call.input)
    assert _calls(m) or m.stop_reason in ("end_turn", "max_tokens")


# Block order is output order in both modes: on the demo model max_tokens can cut a
# hermes call after a complete one, and the cut markup is a text block after the calls.
def test_parallel_calls(matrix):
    m = _both(matrix, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=60,
              **MESSAGES_NO_THINKING)
    calls = _calls(m)
    assert calls and m.stop_reason in ("tool_use", "max_tokens")
    for c in calls if m.stop_reason == "tool_use" else calls[:-1]:
        check_args(c.name, c.input)
    assert len({c.id for c in calls}) == len(calls)
    turn = [{"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather",
             "input": {"city": city, "unit": "celsius"}}
            for i, city in enumerate(("Paris", "Rome"))]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": RESULT}
               for i in range(2)]
    _both(matrix, messages=[*USER, {"role": "assistant", "content": turn},
                            {"role": "user", "content": results}],
          tools=TOOLS, tool_choice={"type": "none"}, max_tokens=8)


def test_json_schema(matrix):
    m = _both(matrix, max_tokens=60, **MESSAGES_NO_THINKING, output_config={"format": {
        "type": "json_schema", "schema": ANSWER}})
    assert m.stop_reason == "end_turn", m
    jsonschema.validate(json.loads(m.content[0].text), ANSWER)


def prompt_tokens(usage) -> int:
    return (usage.input_tokens + (usage.cache_read_input_tokens or 0)
            + (usage.cache_creation_input_tokens or 0))


@pytest.mark.parametrize("matrix", VISION, indirect=True)  # the demo model has no tower
def test_image_block(matrix):
    data = png_data_url().split(",", 1)[1]
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": data}},
               {"type": "text", "text": "What is in the picture?"}]
    m = _both(matrix, messages=[{"role": "user", "content": content}], max_tokens=6)
    text_only = ok(matrix.anthropic.messages.with_raw_response.create(
        model=matrix.model, messages=[{"role": "user", "content": content[1:]}],
        max_tokens=1, extra_body=GREEDY))
    # the image's tokens; input_tokens leaves out what the prefix cache served
    # (cache_read_input_tokens), and the earlier identical request may have filled it
    assert prompt_tokens(m.usage) > prompt_tokens(text_only.usage)


def test_prefill_is_continued(matrix):
    """A final assistant message (Anthropic's prefill, as the SDK sends it) is continued:
    the answer is what chat's continue_final_message gives, on every file set."""
    prefill = {"role": "assistant", "content": '{"city": "'}
    m = _both(matrix, messages=[*USER, prefill])
    chat = matrix.openai.chat.completions.create(
        model=matrix.model, messages=[*USER, prefill], max_tokens=12, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert "".join(b.text for b in m.content if b.type == "text") == \
        (chat.choices[0].message.content or "")
    counted = matrix.anthropic.messages.count_tokens(model=matrix.model,
                                                    messages=[*USER, prefill])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_several_text_blocks_stay_parts(matrix):
    """A system given as blocks, a tool_result of several blocks (is_error) and an
    assistant turn of several text blocks reach the chat as text parts, joined as the
    checkpoint's template or mistral-common joins them (tekken: "\\n\\n", mistral-common's
    v13; they were joined with "" by the translation)."""
    blocks = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    call = {"type": "tool_use", "id": "call_abc123", "name": "get_weather",
            "input": {"city": "Paris"}}
    messages = [*USER,
                {"role": "assistant", "content": [{"type": "text", "text": "Let me"},
                                                  {"type": "text", "text": "check."}, call]},
                {"role": "user", "content": [{"type": "tool_result", "is_error": True,
                                              "tool_use_id": "call_abc123", "content": [
                                                  {"type": "text", "text": "no"},
                                                  {"type": "text", "text": "data"}]}]}]
    got = matrix.anthropic.messages.count_tokens(model=matrix.model, system=blocks,
                                                 messages=messages).input_tokens
    text = lambda *t: [{"type": "text", "text": x} for x in t]  # noqa: E731
    chat = [{"role": "system", "content": text("Be brief.", "Be kind.")}, *USER,
            {"role": "assistant", "content": text("Let me", "check."), "tool_calls": [
                {"id": "call_abc123", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_abc123", "content": text("Error: no",
                                                                             "data")}]
    assert got == len(matrix.tokenizer.encode_chat(chat))
    if matrix.kind == "tekken":  # mistral-common joins every role's parts with "\n\n"
        rendered = matrix.tokenizer.apply_chat_template(chat)
        assert "Be brief.\n\nBe kind." in rendered and "Error: no\n\ndata" in rendered


def test_consecutive_turns_are_one_and_a_thinking_turn_is_dropped(matrix):
    """Two user messages in a row are one turn of their blocks (as Anthropic combines
    them), and an assistant turn of thinking alone is dropped with its thinking: both are
    served on every file set (the published template wants roles to alternate, and Mistral's
    encoding refused the empty assistant turn), counted as the one-turn history."""
    thought = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Paris, then", "signature": ""}]}
    again = {"role": "user", "content": "And Rome?"}
    joined = {"role": "user", "content": [{"type": "text", "text": ASK},
                                          {"type": "text", "text": "And Rome?"}]}
    one = matrix.anthropic.messages.count_tokens(model=matrix.model, messages=[joined])
    for messages in ([*USER, again], [*USER, thought, again]):
        n = matrix.anthropic.messages.count_tokens(model=matrix.model, messages=messages)
        assert n.input_tokens == one.input_tokens
        _both(matrix, messages=messages, **MESSAGES_NO_THINKING)


def test_a_tool_result_after_text_is_a_400_naming_it(matrix):
    call = {"type": "tool_use", "id": "call_abc123", "name": "get_weather",
            "input": {"city": "Paris"}}
    messages = [*USER, {"role": "assistant", "content": [call]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Here:"},
                    {"type": "tool_result", "tool_use_id": "call_abc123", "content": RESULT}]}]
    r = matrix.client.post("/v1/messages", json={
        "model": matrix.model, "max_tokens": 8, "messages": messages, "tools": TOOLS})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("messages.2.content.1: ")
