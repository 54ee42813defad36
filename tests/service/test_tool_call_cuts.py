"""A Mistral call that max_tokens or a stop string cuts, through every API that speaks
chat (chat completions, Responses, Messages), whole and streamed, on the scripted model
(tests/service/scripted_backend.py): a call cut in its name is no call and none of its
text is content; one cut in its arguments is that call, with the arguments as cut."""

from __future__ import annotations

import json

import pytest

from service.app import create_app
from service.settings import Settings
from tests.service.scripted_backend import ScriptTokenizer, scripted_loader
from tests.service.test_chat_tools_api import reassemble

SCRIPT = 'Hi[TOOL_CALLS]lookup[ARGS]{"q": "Paris"}'
NAMES = ("lookup", "get_time")
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
              for n in NAMES]
RESPONSES_TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}}
                   for n in NAMES]
MESSAGES_TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in NAMES]


def tokens_to(text: str) -> int:
    """The max_tokens that ends SCRIPT right after ``text``."""
    assert SCRIPT.startswith(text)
    return len(ScriptTokenizer().encode(text))


IN_NAME = [tokens_to("Hi[TOOL_CALLS]" + "lookup"[:k]) for k in range(1, 7)]
IN_ARGS = [(tokens_to('Hi[TOOL_CALLS]lookup[ARGS]{"q": "'), '{"q": "'),
           (tokens_to('Hi[TOOL_CALLS]lookup[ARGS]'), "")]


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient
    cfg = Settings(max_model_len=512, tool_call_parser="mistral")
    with TestClient(create_app(cfg, load_backend=scripted_loader([SCRIPT]))) as c:
        yield c


def sse(text: str) -> list[dict]:
    return [json.loads(ln[6:]) for ln in text.splitlines()
            if ln.startswith("data: ") and ln != "data: [DONE]"]


def chat_both(client, **body) -> list[tuple[dict, str]]:
    """(message, finish_reason), whole then streamed."""
    body = {"messages": [{"role": "user", "content": "<script0>"}], "temperature": 0,
            "tools": CHAT_TOOLS, **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]
    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return [(whole["message"], whole["finish_reason"]), reassemble(sse(r.text))]


def responses_both(client, **body) -> list[dict]:
    """The response, whole and as the stream's last event holds it; the stream's deltas
    must rebuild its items."""
    body = {"input": "<script0>", "temperature": 0, "tools": RESPONSES_TOOLS, **body}
    whole = client.post("/v1/responses", json=body).json()
    evs = sse(client.post("/v1/responses", json={**body, "stream": True}).text)
    final = evs[-1]["response"]
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in evs
                   if e["type"] == "response.function_call_arguments.delta")
    assert text == "".join(o["content"][0]["text"] for o in final["output"]
                           if o["type"] == "message")
    assert args == "".join(o["arguments"] for o in final["output"]
                           if o["type"] == "function_call")
    return [whole, final]


def messages_both(client, **body) -> list[dict]:
    """The message, whole and as the stream's events build it (the SDK's accumulator)."""
    import anthropic
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    body = {"model": "scripted-model", "max_tokens": 200, "tools": MESSAGES_TOOLS,
            "messages": [{"role": "user", "content": "<script0>"}], **body}
    with sdk.messages.stream(**body) as s:
        streamed = s.get_final_message()
    whole = sdk.messages.create(**body)
    return [m.model_dump(exclude_none=True) for m in (whole, streamed)]


def blocks(message: dict) -> list[tuple]:
    return [(b["type"], b.get("text", b.get("name")), b.get("input")) for b in
            message["content"]]


@pytest.mark.parametrize("cut", IN_NAME)
def test_a_call_cut_in_its_name_is_neither_call_nor_content(client, cut):
    """max_tokens inside ``[TOOL_CALLS]lookup``: no call (its name may be cut), and its
    name is not content (it came back as "Hil", "Hilooku", glued to the text before)."""
    for msg, reason in chat_both(client, max_tokens=cut):
        assert (msg["content"], msg.get("tool_calls") or [], reason) == ("Hi", [], "length")
    for r in responses_both(client, max_output_tokens=cut):
        assert r["status"] == "incomplete"
        assert [(o["type"], o["content"][0]["text"]) for o in r["output"]] == [
            ("message", "Hi")]
    for m in messages_both(client, max_tokens=cut):
        assert (blocks(m), m["stop_reason"]) == ([("text", "Hi", None)], "max_tokens")


def test_a_stop_string_in_a_calls_name_leaves_no_name_in_content(client):
    for msg, reason in chat_both(client, stop=["oku"]):
        assert (msg["content"], msg.get("tool_calls") or [], reason) == ("Hi", [], "stop")
    for m in messages_both(client, stop_sequences=["oku"]):
        assert (blocks(m), m["stop_reason"]) == ([("text", "Hi", None)], "stop_sequence")


@pytest.mark.parametrize("cut,args", IN_ARGS)
def test_a_call_cut_in_its_arguments_is_that_call(client, cut, args):
    """max_tokens after ``[ARGS]``: the call with its arguments as cut, finish_reason
    length (OpenAI's and vLLM's answer); the Responses item incomplete; Anthropic's
    tool_use with the input's complete members."""
    for msg, reason in chat_both(client, max_tokens=cut):
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
        assert (msg["content"], calls, reason) == ("Hi", [("lookup", args)], "length")
    for r in responses_both(client, max_output_tokens=cut):
        assert r["status"] == "incomplete"
        assert [(o["type"], o["status"]) for o in r["output"]] == [
            ("message", "completed"), ("function_call", "incomplete")]
        assert (r["output"][1]["name"], r["output"][1]["arguments"]) == ("lookup", args)
    for m in messages_both(client, max_tokens=cut):
        assert (blocks(m), m["stop_reason"]) == (
            [("text", "Hi", None), ("tool_use", "lookup", {})], "max_tokens")
