"""The conformance matrix, OpenAI Responses through the openai SDK (tests/service/
conformance.py: one server per checkpoint). Each request: HTTP 200, a result valid for
its schema, and the SDK's stream accumulator (``responses.stream``) ends with the
response the non-streamed request gave (greedy). The agent loop sends the returned
output items back as the SDK serializes them (``model_dump()``), continues the stored
response by ``previous_response_id``, or goes on in a conversation; and OpenAI's Agents
SDK runs its own loop on each checkpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx2
import jsonschema
import openai
import pytest

from tests.service.conformance import (
    ANSWER,
    ASK,
    CHAT_TOOLS,
    RESPONSES_NO_REASONING,
    RESULT,
    VISION,
    check_args,
    final_response,
    ok,
    png_data_url,
    response_items,
)

TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
USER = [{"role": "user", "content": ASK}]


def _both(s, **kw):
    """(non-streamed, streamed) responses of one greedy request; they must agree."""
    kw = {"input": ASK, "max_output_tokens": 12, "temperature": 0, **kw}
    whole = ok(s.openai.responses.with_raw_response.create(model=s.model, **kw))
    with s.openai.responses.stream(model=s.model, **kw) as stream:
        final = final_response(stream)
    assert response_items(final) == response_items(whole)
    assert (final.status, final.usage.output_tokens) == (whole.status,
                                                         whole.usage.output_tokens)
    return whole


def _calls(r):
    return [o for o in r.output if o.type == "function_call"]


def test_plain_text(matrix):
    r = _both(matrix, instructions="Answer briefly.")
    assert r.status in ("completed", "incomplete") and not _calls(r)


def test_plain_text_and_its_logprob_bytes(matrix):
    """The message carries its tokens' entries, the same in the stream's final part: on
    the demo model (no reasoning parser) every generated token's; the Mistral
    checkpoints read reasoning, so there those of the message's text (not a reasoning
    section's or the end token's)."""
    kw = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    r = _both(matrix, **kw)
    part = [o for o in r.output if o.type == "message"][0].content[0]
    if matrix.kind == "demo":
        assert len(part.logprobs) == r.usage.output_tokens
    else:
        raw = b"".join(bytes(e.bytes) for e in part.logprobs)  # a cut character: U+FFFD
        assert raw.decode("utf-8", "replace") == part.text
    assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
    tok = matrix.tokenizer
    ids = [tok.token_to_id(e.token) for e in part.logprobs]
    raw = b"".join(bytes(e.bytes) for e, i in zip(part.logprobs, ids, strict=True)
                   if i is None or not tok.is_special(i))
    assert raw.decode("utf-8", "replace") == part.text


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_call(matrix, choice):
    tool_choice = choice if choice == "required" else {"type": "function", "name": "get_time"}
    r = _both(matrix, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False,
              max_output_tokens=60, **RESPONSES_NO_REASONING)
    calls = _calls(r)
    assert r.status == "completed" and len(calls) == 1, r
    check_args(calls[0].name, calls[0].arguments)
    assert choice == "required" or calls[0].name == "get_time"


def test_agent_loop(matrix):
    first = ok(matrix.openai.responses.with_raw_response.create(
        model=matrix.model, input=USER, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=60, temperature=0, **RESPONSES_NO_REASONING))
    assert _calls(first)
    history = [*USER, *(o.model_dump() for o in first.output)] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": RESULT}
        for c in _calls(first)]
    r = _both(matrix, input=history, tools=TOOLS, max_output_tokens=24, **RESPONSES_NO_REASONING)
    for call in _calls(r):  # a second call, or an answer
        check_args(call.name, call.arguments)
    # the answer's items go back too, then the user's next turn
    nxt = [*history, *(o.model_dump() for o in r.output), {"role": "user", "content": "Thanks"}]
    _both(matrix, input=nxt, tools=TOOLS, tool_choice="none", max_output_tokens=4,
          **RESPONSES_NO_REASONING)


def test_agent_loop_by_previous_response_id(matrix):
    """The same loop, each turn sending only its new items and the previous response's
    id: every turn answers exactly what the whole history sent again answers (greedy,
    the same prompt), streamed or not, and the stored response reads back unchanged."""
    sdk, kw = matrix.openai, {"model": matrix.model, "temperature": 0, "tools": TOOLS,
                       **RESPONSES_NO_REASONING}
    first = ok(sdk.responses.with_raw_response.create(
        input=USER, tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=60, **kw))
    assert _calls(first) and first.store
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": RESULT}
               for c in _calls(first)]
    history = [*USER, *(o.model_dump() for o in first.output), *outputs]
    chained = ok(sdk.responses.with_raw_response.create(
        input=outputs, previous_response_id=first.id, max_output_tokens=24, **kw))
    with sdk.responses.stream(input=outputs, previous_response_id=first.id,
                              max_output_tokens=24, **kw) as stream:
        streamed = final_response(stream)
    replayed = _both(matrix, input=history, tools=TOOLS, max_output_tokens=24,
                     **RESPONSES_NO_REASONING)
    for r in (chained, streamed):
        assert response_items(r) == response_items(replayed)
        assert (r.usage.input_tokens, r.usage.output_tokens) == (
            replayed.usage.input_tokens, replayed.usage.output_tokens)
    assert response_items(sdk.responses.retrieve(chained.id)) == response_items(chained)
    nxt = {"role": "user", "content": "Thanks"}
    third = ok(sdk.responses.with_raw_response.create(
        input=[nxt], previous_response_id=chained.id, tool_choice="none",
        max_output_tokens=4, **kw))
    again = _both(matrix, input=[*history, *(o.model_dump() for o in chained.output), nxt],
                  tools=TOOLS, tool_choice="none", max_output_tokens=4, **RESPONSES_NO_REASONING)
    assert response_items(third) == response_items(again)
    assert third.usage.input_tokens == again.usage.input_tokens


def test_agent_loop_by_conversation(matrix):
    """The same loop through a conversation (the SDK's conversations.create, then
    conversation= on each turn, which sends its new items only), the second turn in the
    background, polled: every turn answers exactly what the whole history sent again
    answers, and the conversation lists every turn's items."""
    sdk, kw = matrix.openai, {"model": matrix.model, "temperature": 0, "tools": TOOLS,
                       **RESPONSES_NO_REASONING}
    conv = sdk.conversations.create(metadata={"run": "conformance"})
    first = ok(sdk.responses.with_raw_response.create(
        input=USER, conversation=conv.id, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=60, **kw))
    assert _calls(first) and first.conversation.id == conv.id
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": RESULT}
               for c in _calls(first)]
    history = [*USER, *(o.model_dump() for o in first.output), *outputs]
    second = sdk.responses.create(input=outputs, conversation=conv.id, background=True,
                                  max_output_tokens=24, **kw)
    while second.status in ("queued", "in_progress"):
        second = sdk.responses.retrieve(second.id)
    replayed = _both(matrix, input=history, tools=TOOLS, max_output_tokens=24,
                     **RESPONSES_NO_REASONING)
    assert second.status == replayed.status
    assert response_items(second) == response_items(replayed)
    assert second.usage.input_tokens == replayed.usage.input_tokens
    nxt = {"role": "user", "content": "Thanks"}
    third = ok(sdk.responses.with_raw_response.create(
        input=[nxt], conversation=conv.id, tool_choice="none", max_output_tokens=4, **kw))
    again = _both(matrix, input=[*history, *(o.model_dump() for o in second.output), nxt],
                  tools=TOOLS, tool_choice="none", max_output_tokens=4, **RESPONSES_NO_REASONING)
    assert response_items(third) == response_items(again)
    assert third.usage.input_tokens == again.usage.input_tokens
    listed = list(sdk.conversations.items.list(conv.id, order="asc"))
    assert len(listed) == (len(USER) + len(first.output) + len(outputs)
                           + len(second.output) + 1 + len(third.output))
    assert [i.id for i in listed[-len(third.output):]] == [o.id for o in third.output]


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_loop(matrix, api):
    """OpenAI's Agents SDK runs its loop on the checkpoint, over the Responses API and
    over chat completions: every turn must call the tool (tool_choice required, kept
    after a call), the SDK runs it and sends the output back, until max_turns: three
    calls, each with valid arguments, every request the SDK made served."""
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai.types.shared import Reasoning

    called: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """get_weather of a city"""
        called.append(city)
        return RESULT

    async def go():
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=matrix.client.app),
                                  base_url="http://testserver")
        client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="x",
                                    http_client=http, max_retries=0)
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="weather", tools=[get_weather], reset_tool_choice=False,
                      model=kind(model=matrix.model, openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                   parallel_tool_calls=False,
                                                   max_tokens=60,
                                                   reasoning=Reasoning(effort="none")))
        try:
            with pytest.raises(MaxTurnsExceeded):
                await Runner.run(agent, ASK, max_turns=3)
        finally:
            await http.aclose()

    set_tracing_disabled(True)
    asyncio.run(go())
    assert len(called) == 3 and set(called) <= {"Paris", "Rome"}


# Block order is output order in both modes: on the demo model max_tokens can cut a
# hermes call after a complete one, and the cut markup is a text block after the calls.
def test_parallel_calls(matrix):
    r = _both(matrix, tools=TOOLS, tool_choice="required", max_output_tokens=60,
              **RESPONSES_NO_REASONING)
    calls = _calls(r)
    assert calls and r.status in ("completed", "incomplete")
    for c in calls if r.status == "completed" else calls[:-1]:
        check_args(c.name, c.arguments)
    assert len({c.call_id for c in calls}) == len(calls)
    turn = [{"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
             "arguments": json.dumps({"city": city, "unit": "celsius"})}
            for i, city in enumerate(("Paris", "Rome"))]
    results = [{"type": "function_call_output", "call_id": f"call_{i}", "output": RESULT}
               for i in range(2)]
    _both(matrix, input=[*USER, *turn, *results], tools=TOOLS, tool_choice="none",
          max_output_tokens=8)


def test_json_schema(matrix):
    r = _both(matrix, max_output_tokens=60, **RESPONSES_NO_REASONING, text={"format": {
        "type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), ANSWER)


@pytest.mark.parametrize("matrix", VISION, indirect=True)  # the demo model has no tower
def test_image_input(matrix):
    content = [{"type": "input_text", "text": "What is in the picture?"},
               {"type": "input_image", "image_url": png_data_url()}]
    r = _both(matrix, input=[{"role": "user", "content": content}], max_output_tokens=6)
    text_only = ok(matrix.openai.responses.with_raw_response.create(
        model=matrix.model, input=[{"role": "user", "content": content[:1]}],
        max_output_tokens=1, temperature=0))
    assert r.usage.input_tokens > text_only.usage.input_tokens  # the image's tokens


def test_consecutive_user_items_are_one_turn(matrix):
    """Two user message items in a row (and a reasoning item between them, dropped) are
    one turn of their parts, served on every file set (the published template wants roles
    to alternate) and counted as that one turn."""
    again = {"role": "user", "content": "And Rome?"}
    joined = {"role": "user", "content": [{"type": "input_text", "text": ASK},
                                          {"type": "input_text", "text": "And Rome?"}]}
    reasoning = {"type": "reasoning", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Paris, then"}]}
    one = matrix.openai.responses.input_tokens.count(model=matrix.model, input=[joined])
    for items in ([*USER, again], [*USER, reasoning, again]):
        n = matrix.openai.responses.input_tokens.count(model=matrix.model, input=items)
        assert n.input_tokens == one.input_tokens
        _both(matrix, input=items, **RESPONSES_NO_REASONING)
