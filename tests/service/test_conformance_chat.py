"""The conformance matrix, Chat Completions through the openai SDK (tests/service/
conformance.py: one server per checkpoint). Each request: HTTP 200, a result valid for its
schema, and the same request streamed reassembles to the non-streamed answer (greedy).
The agent loop sends the SDK's own ``model_dump()`` of the returned message back, with
its ``"content": null``, as clients do."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.service.conformance import (
    ANSWER,
    ASK,
    CHAT_NO_REASONING,
    CHAT_TOOLS,
    RESULT,
    VISION,
    chat_answer,
    chat_stream,
    check_args,
    ok,
    png_data_url,
)

USER = [{"role": "user", "content": ASK}]


def _both(s, **kw):
    """(non-streamed, streamed) answers of one greedy request; they must agree."""
    kw = {"messages": USER, "temperature": 0, "max_tokens": 12, **kw}
    whole = ok(s.openai.chat.completions.with_raw_response.create(model=s.model, **kw))
    answer = chat_answer(whole)
    assert chat_stream(s, **kw) == answer
    return whole, answer


def test_plain_text_and_its_logprob_bytes(matrix):
    whole, answer = _both(matrix, logprobs=True, top_logprobs=2)
    assert answer["calls"] == [] and answer["finish_reason"] in ("stop", "length")
    entries = whole.choices[0].logprobs.content
    assert len(entries) == answer["tokens"]
    tok = matrix.tokenizer
    # the tokens' own bytes join into the text (special tokens are not in the content)
    raw = b"".join(bytes(e.bytes) for e in entries if not tok.is_special(
        tok.token_to_id(e.token) if tok.token_to_id(e.token) is not None else -1))
    assert raw.decode("utf-8", "replace") == (answer["content"] or "")


@pytest.mark.parametrize("choice", ["required", "named", "allowed"])
def test_forced_call(matrix, choice):
    named = {"type": "function", "function": {"name": "get_time"}}
    tool_choice = {"required": "required", "named": named,
                   "allowed": {"type": "allowed_tools", "allowed_tools": {
                       "mode": "required", "tools": [named]}}}[choice]
    _, answer = _both(matrix, tools=CHAT_TOOLS, tool_choice=tool_choice,
                      parallel_tool_calls=False, max_tokens=60, **CHAT_NO_REASONING)
    # a named function's call ends with "stop", as OpenAI's and vLLM's
    want = "stop" if choice == "named" else "tool_calls"
    assert answer["finish_reason"] == want and len(answer["calls"]) == 1, answer
    call = answer["calls"][0]
    check_args(call["name"], call["arguments"])
    assert choice == "required" or call["name"] == "get_time"


def test_agent_loop(matrix):
    first = ok(matrix.openai.chat.completions.with_raw_response.create(
        model=matrix.model, messages=USER, tools=CHAT_TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=60,
        **CHAT_NO_REASONING)).choices[0].message
    assert first.tool_calls and first.content is None
    history = [*USER, first.model_dump()] + [
        {"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in first.tool_calls]
    assert history[1]["content"] is None  # what the SDK sends back
    _, answer = _both(matrix, messages=history, tools=CHAT_TOOLS, max_tokens=24,
                      **CHAT_NO_REASONING)
    for call in answer["calls"]:  # a second call, or an answer
        check_args(call["name"], call["arguments"])
    assert answer["calls"] or answer["finish_reason"] in ("stop", "length")


def test_parallel_calls(matrix):
    whole, answer = _both(matrix, tools=CHAT_TOOLS, tool_choice="required", max_tokens=60,
                          **CHAT_NO_REASONING)
    calls = whole.choices[0].message.tool_calls
    assert calls and answer["finish_reason"] in ("tool_calls", "length")
    done = calls if answer["finish_reason"] == "tool_calls" else calls[:-1]
    for c in done:
        check_args(c.function.name, c.function.arguments)
    assert len({c.id for c in calls}) == len(calls)
    # two calls in one turn and their two results: the history a parallel loop sends
    turn = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}
        for i, city in enumerate(("Paris", "Rome"))]}
    history = [*USER, turn] + [{"role": "tool", "tool_call_id": f"call_{i}", "content": RESULT}
                               for i in range(2)]
    _both(matrix, messages=history, tools=CHAT_TOOLS, tool_choice="none", max_tokens=8)


def test_json_schema(matrix):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER,
                                                  "strict": True}}
    _, answer = _both(matrix, response_format=fmt, max_tokens=60, **CHAT_NO_REASONING)
    assert answer["finish_reason"] == "stop", answer
    jsonschema.validate(json.loads(answer["content"]), ANSWER)


@pytest.mark.parametrize("matrix", VISION, indirect=True)  # the demo model has no tower
def test_image_part(matrix):
    content = [{"type": "text", "text": "What is in the picture?"},
               {"type": "image_url", "image_url": {"url": png_data_url()}}]
    whole, _ = _both(matrix, messages=[{"role": "user", "content": content}], max_tokens=6)
    text_only = ok(matrix.openai.chat.completions.with_raw_response.create(
        model=matrix.model, messages=[{"role": "user", "content": content[:1]}],
        max_tokens=1, temperature=0))
    assert whole.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's tokens


def test_structured_outputs(matrix):
    """vLLM's structured_outputs through the SDK's extra_body, streamed and not."""
    _, answer = _both(matrix, max_tokens=20, **CHAT_NO_REASONING,
                      extra_body={"structured_outputs": {"choice": ["Paris", "Rome"]}})
    assert answer["finish_reason"] == "stop" and answer["content"] in ("Paris", "Rome")


PREFILL = {"role": "assistant", "content": '{"city": "'}


def test_continue_final_message(matrix):
    """The prompt ends inside the final assistant message on every file set (the published
    template renders it and closes the turn; mistral-common takes it as a prefix)."""
    msgs = [*USER, PREFILL]
    ids = matrix.tokenizer.encode_chat(msgs, add_generation_prompt=False,
                                       continue_final_message=True)
    assert matrix.tokenizer.decode(ids, skip_special_tokens=False).endswith(
        PREFILL["content"])
    whole, answer = _both(matrix, messages=msgs, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})
    assert whole.usage.prompt_tokens == len(ids)
    plain = matrix.openai.completions.create(model=matrix.model, prompt=ids, max_tokens=12,
                                             temperature=0)
    assert answer["content"] == plain.choices[0].text
