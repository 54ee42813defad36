"""The openai SDK reads what the server sends for tool calls and reasoning (scripted model,
tests/service/scripted_backend.py): message.tool_calls, streamed call deltas accumulated by
the SDK's own stream helper, reasoning_content, a tool-result turn."""

from __future__ import annotations

import json

import openai
import pytest

from tests.service.test_chat_tools_api import TOOLS, make_client


@pytest.fixture(scope="module")
def sdk():
    with make_client() as c:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                            max_retries=0)


def ask(script: int) -> list[dict]:
    return [{"role": "user", "content": f"<script{script}>"}]


def test_tool_calls_and_the_next_turn(sdk):
    r = sdk.chat.completions.create(model="scripted-model", messages=ask(0), tools=TOOLS,
                                    temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    # the last tool result names the script the model answers with
    history = ask(0) + [choice.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": f"18C<script{1 + i}>"}
        for i, c in enumerate(calls)]
    nxt = sdk.chat.completions.create(model="scripted-model", messages=history, tools=TOOLS)
    assert nxt.choices[0].message.content == 'Sure<tool_call>{"name": "get_weather", ' \
        '"arguments": {"city": "Paris"}}</tool_call>'  # a mistral model's text, not a call


def test_stream_helper_accumulates_the_calls(sdk):
    whole = sdk.chat.completions.create(model="scripted-model", messages=ask(0), tools=TOOLS)
    with sdk.chat.completions.stream(model="scripted-model", messages=ask(0),
                                     tools=TOOLS) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    got = final.choices[0].message
    assert got.content == whole.choices[0].message.content == "Let me check."
    assert [(c.function.name, c.function.arguments) for c in got.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert final.choices[0].finish_reason == "tool_calls"


def test_reasoning_content_reaches_the_client(sdk):
    r = sdk.chat.completions.create(model="scripted-model", messages=ask(1))
    msg = r.choices[0].message
    assert (msg.model_extra["reasoning_content"], msg.content) == ("Paris is in France",
                                                                  "Hello world")
    assert r.usage.completion_tokens_details.reasoning_tokens == 14


def test_bad_tool_choice_is_the_sdks_bad_request(sdk):
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        sdk.chat.completions.create(model="scripted-model", messages=ask(0),
                                    tool_choice="required")
