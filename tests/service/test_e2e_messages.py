"""/v1/messages with the anthropic SDK on the real engine: the demo model (ChatML, hermes
calls) and a tiny random v13-tekken checkpoint (mistral calls), as in test_e2e_tools.py.
Greedy, so Messages and Chat Completions must give the same tokens for one conversation."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conformance import MESSAGES_NO_THINKING
from tests.service.test_e2e_tools import TOOLS as CHAT_TOOLS
from tests.service.test_e2e_tools import WEATHER, e2e_model_dir

TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in CHAT_TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module", params=["demo", "tekken"])
def served(request, tmp_path_factory):
    model_dir = e2e_model_dir(request.param, tmp_path_factory)
    settings = Settings(model=model_dir, max_model_len=1024, max_num_seqs=4, api_keys=("k",))
    with TestClient(create_app(settings)) as client:
        sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k",
                                  http_client=client, max_retries=0)
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="k",
                             http_client=client, max_retries=0)
        yield sdk, chat, chat.models.list().data[0].id, client


def _create(served, **kw):
    sdk, _, name, _ = served
    # the SDK no longer takes temperature as an argument; the server still reads it
    return sdk.messages.create(**{"model": name, "max_tokens": 12, "messages": ASK,
                                  "extra_body": GREEDY, **kw})


def test_text_matches_chat_completions(served):
    sdk, chat, name, _ = served
    m = _create(served, system="Answer briefly.")
    c = chat.chat.completions.create(model=name, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, *ASK]).choices[0]
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == c.message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[c.finish_reason]
    assert m.usage.output_tokens <= 12
    n = sdk.messages.count_tokens(model=name, messages=ASK, system="Answer briefly.")
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_stream_equals_create(served):
    sdk, _, name, _ = served
    m = _create(served)
    with sdk.messages.stream(model=name, max_tokens=12, messages=ASK,
                             extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (m.stop_reason,
                                                              m.usage.output_tokens)


def test_forced_tool_use_and_a_tool_result_turn(served):
    sdk, chat, name, _ = served
    m = _create(served, tools=TOOLS, max_tokens=60, **MESSAGES_NO_THINKING,
                tool_choice={"type": "tool", "name": "get_weather"})
    calls = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(calls) == 1, m
    assert calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, WEATHER)
    m = _create(served, tools=TOOLS, max_tokens=60, **MESSAGES_NO_THINKING,
                tool_choice={"type": "any", "disable_parallel_tool_use": True})
    calls = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(calls) == 1, m
    history = [*ASK, {"role": "assistant", "content": [c.model_dump() for c in calls]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                             "content": "sunny, 21 C"}]}]
    r = _create(served, tools=TOOLS, messages=history, tool_choice={"type": "none"})
    assert r.content and r.content[0].type == "text"
    # the same turn through chat completions: the same tokens
    c = chat.chat.completions.create(model=name, max_tokens=12, temperature=0,
                                     tools=CHAT_TOOLS, tool_choice="none", messages=[
        *ASK, {"role": "assistant", "content": None, "tool_calls": [{
            "id": calls[0].id, "type": "function", "function": {
                "name": calls[0].name, "arguments": json.dumps(
                    calls[0].input)}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"}])
    assert r.content[0].text == c.choices[0].message.content


def test_errors_are_the_sdk_exceptions(served):
    sdk, _, name, client = served
    with pytest.raises(anthropic.NotFoundError):
        _create(served, model="no-such-model")
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        _create(served, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"})
    wrong = anthropic.Anthropic(base_url="http://testserver", api_key="wrong",
                                http_client=client, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=name, max_tokens=4, messages=ASK)


def test_a_format_the_grammar_refuses_names_output_config(served):
    """The chat run's refusal of the format names the Messages field, not chat's
    response_format."""
    sdk, _, name, _ = served
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}},
              "required": ["a"]}
    with pytest.raises(anthropic.BadRequestError) as exc:
        sdk.messages.create(model=name, max_tokens=8, messages=ASK, extra_body={
            "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert exc.value.body["error"]["message"].startswith(
        "output_config.format: cannot be enforced as a grammar"), exc.value.body


def test_a_turn_of_thinking_alone_is_dropped_with_its_thinking(served):
    """An assistant turn that holds only a thinking block (an answer cut while it
    reasoned, sent back as clients send it): the turn is dropped with its thinking, so
    the prompt is the history without it, on Mistral's encoding too (an empty assistant
    message was a 400 there)."""
    sdk, _, name, _ = served
    later = [{"role": "user", "content": "And in Rome?"}]
    thought = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user asks about", "signature": ""}]}
    n = sdk.messages.count_tokens(model=name, messages=[*ASK, thought, *later])
    alone = sdk.messages.count_tokens(model=name, messages=[*ASK, *later])
    assert n.input_tokens == alone.input_tokens
    m = _create(served, messages=[*ASK, thought, *later], **MESSAGES_NO_THINKING)
    assert m.content and m.usage.output_tokens > 0
