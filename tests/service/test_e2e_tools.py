"""Tool calls and structured outputs end to end with the openai SDK, on the real engine:
the demo model (ChatML, hermes calls) and a tiny random checkpoint with a v13 tekken.json
(Ministral-3's [TOOL_CALLS]name[ARGS]{json} calls through mistral-common). The grammar
makes even a random model's forced calls valid, so every assertion is about the server."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from engine.demo_model import ensure_demo_model
from engine.synth import SynthSpec, write_checkpoint
from service.app import create_app
from service.settings import Settings
from service.tool_calls.call_ids import is_call_id
from tests.service.conformance import CHAT_NO_REASONING, RESPONSES_NO_REASONING

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 12}},
                                          "required": ["city"],
                                          "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]


class Answer(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    sunny: bool
    note: str = Field(max_length=16)


def _sdk(model_dir):
    settings = Settings(model=model_dir, max_model_len=1024, max_num_seqs=4)
    client = TestClient(create_app(settings))
    client.__enter__()
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    return client, sdk, sdk.models.list().data[0].id


def e2e_model_dir(kind: str, tmp_path_factory):
    """"demo": the demo model (ChatML, hermes calls); "tekken": a tiny random checkpoint
    with a v13 tekken.json (mistral calls)."""
    if kind == "demo":
        return ensure_demo_model()
    model_dir = tmp_path_factory.mktemp("tiny-tekken")
    write_checkpoint(model_dir, SynthSpec.preset("tiny", tokenizer="tekken"))
    return model_dir


@pytest.fixture(scope="module", params=["demo", "tekken"])
def served(request, tmp_path_factory):
    client, sdk, name = _sdk(e2e_model_dir(request.param, tmp_path_factory))
    yield request.param, sdk, name
    client.__exit__(None, None, None)


def _create(served, **kw):
    _, sdk, name = served
    kw = {"messages": ASK, "temperature": 0, "max_tokens": 80, **CHAT_NO_REASONING, **kw}
    return sdk.chat.completions.create(model=name, **kw)


def _check_call(call, tools=TOOLS):
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.function.name in schema
    jsonschema.validate(json.loads(call.function.arguments), schema[call.function.name])


def test_required_gives_valid_calls(served):
    # one call: the grammar ends after it, so the request does
    choice = _create(served, tools=TOOLS, tool_choice="required",
                     parallel_tool_calls=False).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1
    _check_call(choice.message.tool_calls[0])
    assert is_call_id(choice.message.tool_calls[0].id)
    # parallel calls: as many as the model writes (a small model may go on to max_tokens)
    choice = _create(served, tools=TOOLS, tool_choice="required", max_tokens=120).choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    calls = choice.message.tool_calls
    assert calls
    # a length cut may end inside the last call's arguments (mistral: the call is kept)
    for call in calls if choice.finish_reason == "tool_calls" else calls[:-1]:
        _check_call(call)
    ids = [c.id for c in calls]
    assert len(set(ids)) == len(ids)


def test_named_and_single_call(served):
    r = _create(served, tools=TOOLS, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    _check_call(calls[0])


def test_stream_equals_non_streaming(served):
    # the SDK's stream helper refuses a length cut: one call, so the grammar ends it
    one = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    whole = _create(served, **one).choices[0]
    assert whole.message.tool_calls
    _, sdk, name = served
    with sdk.chat.completions.stream(model=name, messages=ASK, temperature=0, max_tokens=80,
                                     **CHAT_NO_REASONING, **one) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason
    # the stream opens with content "" (sent before anyone knows calls follow)
    assert (final.message.content or None) == whole.message.content
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_allowed_tools_narrow_the_calls_and_keep_the_prompt(served):
    """allowed_tools required with get_time only: every call is get_time, though the ask
    is about the weather and the prompt shows both tools (its token count equals the
    same request with tool_choice required); the Responses shape alike."""
    only = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}
    r = _create(served, tools=TOOLS, tool_choice=only, max_tokens=120)
    calls = r.choices[0].message.tool_calls
    assert calls and {c.function.name for c in calls} == {"get_time"}
    for call in calls if r.choices[0].finish_reason == "tool_calls" else calls[:-1]:
        _check_call(call)
    plain = _create(served, tools=TOOLS, tool_choice="required", max_tokens=1)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    _, sdk, name = served
    resp = sdk.responses.create(
        model=name, input=ASK[0]["content"], temperature=0, max_output_tokens=120,
        tools=[{"type": "function", "name": t["function"]["name"],
                "parameters": t["function"]["parameters"]} for t in TOOLS],
        tool_choice={"type": "allowed_tools", "mode": "required",
                     "tools": [{"type": "function", "name": "get_time"}]},
        **RESPONSES_NO_REASONING)
    names = {o.name for o in resp.output if o.type == "function_call"}
    assert names == {"get_time"}, resp.output
    assert resp.tool_choice.type == "allowed_tools"


def test_auto_is_text_or_valid_calls(served):
    choice = _create(served, tools=TOOLS).choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            _check_call(call)
    else:
        assert choice.finish_reason in ("stop", "length")


def test_tool_result_turn(served):
    first = _create(served, tools=TOOLS, tool_choice="required",
                    parallel_tool_calls=False).choices[0].message
    history = ASK + [first.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": "18 degrees, sunny"}
        for c in first.tool_calls]
    r = _create(served, messages=history, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # OpenAI-style ids in the history are accepted (mapped for Mistral tokenizers)
    history[1]["tool_calls"][0]["id"] = history[2]["tool_call_id"] = "call_" + "x1" * 12
    assert _create(served, messages=history[:3], tools=TOOLS, max_tokens=4).choices


def test_json_object(served):
    r = _create(served, response_format={"type": "json_object"}, max_tokens=120)
    choice = r.choices[0]
    if served[0] == "demo":  # a random model may still be writing at the cut
        assert choice.finish_reason == "stop"
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)


def test_parse_with_a_pydantic_model(served):
    _, sdk, name = served
    r = sdk.chat.completions.parse(model=name, messages=ASK, response_format=Answer,
                                   temperature=0, max_tokens=60)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Answer)


def test_bad_schema_is_a_bad_request(served):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}]
    with pytest.raises(openai.BadRequestError) as e:
        _create(served, tools=bad, tool_choice="required")
    assert e.value.body["param"] == "tools.0.function.parameters"
    # a strict tool's schema with a keyword strict mode refuses names that tool too (it
    # was blamed on "tools": the tool was checked leniently)
    strict = [TOOLS[0], {"type": "function", "function": {
        "name": "g", "strict": True, "parameters": {"type": "object", "properties": {
            "x": {"type": "array", "uniqueItems": True}}}}}]
    with pytest.raises(openai.BadRequestError) as e:
        _create(served, tools=strict, tool_choice="required")
    assert e.value.body["param"] == "tools.1.function.parameters"
