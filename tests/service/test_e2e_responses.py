"""/v1/responses with the openai SDK on the real engine (demo model and tiny v13-tekken
checkpoint, see test_e2e_messages.py): text equal to Chat Completions (greedy), the stream
helper's final response equal to create, a forced function call and a json_schema format
(grammar-constrained), a function_call_output turn."""

from __future__ import annotations

import json

import jsonschema

from tests.service.conformance import RESPONSES_NO_REASONING, final_response
from tests.service.test_e2e_messages import ASK, served  # noqa: F401 (fixture)
from tests.service.test_e2e_tools import TOOLS as CHAT_TOOLS
from tests.service.test_e2e_tools import WEATHER

TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
ANSWER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                           "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}


def _create(served, **kw):  # noqa: F811
    _, chat, name, _ = served
    return chat.responses.create(**{"model": name, "input": ASK[0]["content"],
                                    "max_output_tokens": 12, "temperature": 0, **kw})


def test_text_matches_chat_and_the_stream(served):  # noqa: F811
    _, chat, name, _ = served
    r = _create(served, instructions="Answer briefly.")
    c = chat.chat.completions.create(model=name, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, *ASK]).choices[0]
    assert r.output_text == c.message.content
    assert r.status == ("incomplete" if c.finish_reason == "length" else "completed")
    with chat.responses.stream(model=name, input=ASK[0]["content"], max_output_tokens=12,
                               temperature=0, instructions="Answer briefly.") as s:
        evs = list(s)
    text = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    final = final_response(evs)
    assert text == final.output_text == r.output_text
    assert final.usage.output_tokens == r.usage.output_tokens


def test_forced_call_and_its_output(served):  # noqa: F811
    r = _create(served, tools=TOOLS, max_output_tokens=60, **RESPONSES_NO_REASONING,
                tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    history = [ASK[0], {"type": "function_call", "call_id": calls[0].call_id,
                        "name": calls[0].name, "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny, 21 C"}]
    r = _create(served, input=history, tools=TOOLS, tool_choice="none")
    assert r.output and r.output[-1].type == "message"


def test_json_schema_format(served):  # noqa: F811
    r = _create(served, max_output_tokens=60, **RESPONSES_NO_REASONING, text={"format": {
        "type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), ANSWER)


def test_message_logprobs_with_tools(served):  # noqa: F811
    """include message.output_text.logprobs with tools: a message's entries are its text's
    tokens (their bytes join into the text), the same streamed; a call carries none."""
    _, chat, name, _ = served
    kw = {"tools": TOOLS, "include": ["message.output_text.logprobs"], "top_logprobs": 1,
          "max_output_tokens": 24, **RESPONSES_NO_REASONING}
    for choice in ("auto", "required"):
        r = _create(served, tool_choice=choice, **kw)
        texts = [p for o in r.output if o.type == "message" for p in o.content]
        for part in texts:
            raw = b"".join(bytes(e.bytes) for e in part.logprobs)  # cut: U+FFFD
            assert raw.decode("utf-8", "replace") == part.text
        if choice == "required":
            assert not texts and r.output[0].type == "function_call"
        with chat.responses.stream(model=name, input=ASK[0]["content"], temperature=0,
                                   tool_choice=choice, **kw) as s:
            evs = list(s)
        deltas = [e for e in evs if e.type == "response.output_text.delta"]
        final = final_response(evs)
        assert [p.logprobs for o in final.output if o.type == "message"
                for p in o.content] == [p.logprobs for p in texts]
        assert [x.model_dump() for d in deltas for x in d.logprobs] == [
            x.model_dump() for p in texts for x in p.logprobs]
