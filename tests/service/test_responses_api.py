"""/v1/responses on the scripted model (tests/service/scripted_backend.py): the exact
event sequences for text, reasoning and function calls, the non-streaming body equal to
the stream's final response, input items (function_call, function_call_output), the
refusals, and the openai SDK's stream helper reassembling the events."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conformance import final_response, response_items
from tests.service.scripted_backend import scripted_loader
from tests.service.test_chat_tools_api import SCRIPTS, make_client, reassemble, stream
from tests.service.test_messages_api import cut_in_second_call

TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}}
         for n in ("get_weather", "get_time")]


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def ask(script: int, **body) -> dict:
    return {"input": f"<script{script}>", "temperature": 0, **body}


def events(client, body: dict) -> list[dict]:
    r = client.post("/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    out = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append(json.loads(data[6:]))
        assert name == f"event: {out[-1]['type']}"
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def shape(evs: list[dict]) -> list[str]:
    """Event types without the response. prefix, runs of one delta type folded."""
    out: list[str] = []
    for e in evs:
        t = e["type"].removeprefix("response.")
        if not (out and out[-1] == t and t.endswith(".delta")):
            out.append(t)
    return out


def test_text_and_reasoning(client):
    body = client.post("/v1/responses", json=ask(1)).json()
    assert body["status"] == "completed" and body["object"] == "response"
    assert [o["type"] for o in body["output"]] == ["reasoning", "message"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text",
                                             "text": "Paris is in France"}]
    assert body["output"][1]["content"][0]["text"] == "Hello world"
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 14
    evs = events(client, ask(1))
    assert shape(evs) == [
        "created", "in_progress",
        "output_item.added", "content_part.added", "reasoning_text.delta",
        "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done", "completed"]
    final = evs[-1]["response"]
    assert [o["content"] for o in final["output"]] == [o["content"] for o in body["output"]]
    assert final["usage"] == body["usage"]
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") \
        == "Hello world"


def test_function_calls(client):
    body = client.post("/v1/responses", json=ask(0, tools=TOOLS)).json()
    assert [o["type"] for o in body["output"]] == ["message", "function_call", "function_call"]
    calls = body["output"][1:]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert all(c["call_id"] and c["id"].startswith("fc_") for c in calls)
    evs = events(client, ask(0, tools=TOOLS))
    call = ["output_item.added", "function_call_arguments.delta",
            "function_call_arguments.done", "output_item.done"]
    assert shape(evs) == ["created", "in_progress", "output_item.added",
                          "content_part.added", "output_text.delta", "output_text.done",
                          "content_part.done", "output_item.done", *call, *call, "completed"]
    done = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [{"city": "Paris"}, {"city": "Rome"}]


def test_same_output_as_chat_completions(client):
    chat_tools = [{"type": "function", "function": {"name": t["name"],
                                                    "parameters": t["parameters"]}}
                  for t in TOOLS]
    for script in (0, 1, 3):
        body = client.post("/v1/responses", json=ask(script, tools=TOOLS)).json()
        msg, _ = reassemble(stream(client, script, tools=chat_tools))
        text = "".join(o["content"][0]["text"] for o in body["output"]
                       if o["type"] == "message")
        calls = [(o["name"], o["arguments"]) for o in body["output"]
                 if o["type"] == "function_call"]
        assert text == msg["content"]
        assert calls == [(c["function"]["name"], c["function"]["arguments"])
                         for c in msg["tool_calls"]]


def test_max_output_tokens_is_incomplete(client):
    body = client.post("/v1/responses", json=ask(3, max_output_tokens=2)).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    evs = events(client, ask(3, max_output_tokens=2))
    # the stream ends with response.incomplete, as OpenAI's does
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["status"] == "incomplete"
    assert "response.completed" not in [e["type"] for e in evs]
    # the item the limit cut is incomplete too (OpenAI's), in both modes
    assert [o["status"] for o in body["output"]] == ["incomplete"]
    assert [o["status"] for o in evs[-1]["response"]["output"]] == ["incomplete"]
    done = [e["item"]["status"] for e in evs if e["type"] == "response.output_item.done"]
    assert done == ["incomplete"]
    whole = client.post("/v1/responses", json=ask(3)).json()
    assert whole["status"] == "completed"
    assert events(client, ask(3))[-1]["type"] == "response.completed"
    assert {o["status"] for o in whole["output"]} == {"completed"}


def test_input_items_with_a_call_and_its_output(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "reasoning", "summary": []},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "<script3>"}]
    body = client.post("/v1/responses", json={"input": items, "instructions": "Be brief.",
                                              "tools": TOOLS}).json()
    assert [o.get("name") or o["content"][0]["text"] for o in body["output"]] == [
        "Hello world", "get_time"]
    r = client.post("/v1/responses", json={"input": items[-1:], "tools": TOOLS})
    assert r.status_code == 400 and "answers no function_call" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "input.0.call_id"


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input"),
])
def test_refusals_name_the_field(client, extra, param):
    r = client.post("/v1/responses", json={**ask(3, tools=TOOLS), **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] is not None and err["param"].startswith(param), err


def test_the_openai_sdk(client):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    r = sdk.responses.create(model="scripted-model", input="<script0>", tools=TOOLS)
    assert r.output_text == "Let me check."
    assert [o.name for o in r.output if o.type == "function_call"] == ["get_weather"] * 2
    with sdk.responses.stream(model="scripted-model", input="<script0>", tools=TOOLS) as s:
        evs = list(s)
    deltas = [e.delta for e in evs if e.type == "response.function_call_arguments.delta"]
    final = final_response(evs)
    assert "".join(deltas) == '{"city": "Paris"}{"city": "Rome"}'
    assert [(o.type, getattr(o, "arguments", None)) for o in final.output] == [
        (o.type, getattr(o, "arguments", None)) for o in r.output]
    text = [e.delta for e in sdk.responses.create(model="scripted-model", input="<script1>",
                                                  stream=True)
            if e.type == "response.output_text.delta"]
    assert "".join(text) == "Hello world"
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="scripted-model", input="hi", previous_response_id="r")


def test_item_order_is_output_order_in_both_modes():
    """A call cut by max_output_tokens after a complete one is a message item after the
    call's item, in the body as in the SDK's reassembled stream."""
    with make_client(tool_call_parser="hermes") as c:
        body = ask(4, tools=TOOLS, max_output_tokens=cut_in_second_call(SCRIPTS[4]))
        r = c.post("/v1/responses", json=body).json()
        assert [o["type"] for o in r["output"]] == ["message", "function_call", "message"]
        assert r["status"] == "incomplete"
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                            max_retries=0)
        with sdk.responses.stream(model="scripted-model", **body) as s:
            final = final_response(s)
        whole = sdk.responses.create(model="scripted-model", **body)
        assert response_items(final) == response_items(whole)


def test_a_timeout_mid_stream_is_an_error_event_in_each_api_shape():
    # 1000 scripted tokens take far longer than the 20 ms deadline
    cfg = Settings(max_model_len=4096, request_timeout=0.02)
    with TestClient(create_app(cfg, load_backend=scripted_loader(["ab" * 600]))) as c:
        r = c.post("/v1/responses", json={"input": "<script0>", "stream": True})
        last = json.loads(r.text.strip().split("\n\n")[-1].split("\n")[1][6:])
        # the code the whole answer's error has (a 408's "timeout")
        assert last["type"] == "error" and last["code"] == "timeout", last
        r = c.post("/v1/messages", json={"max_tokens": 1000, "stream": True,
                                         "messages": [{"role": "user", "content": "<script0>"}]})
        assert r.status_code == 200, r.text
        name, data = r.text.strip().split("\n\n")[-1].split("\n")
        assert name == "event: error"
        assert json.loads(data[6:])["error"]["type"] == "timeout_error"


def test_output_text_logprobs_in_both_modes():
    """include message.output_text.logprobs: every generated token's entry (its own
    bytes, top_logprobs alternatives) on the message's part; the stream's deltas carry
    them as the text comes, and its final part equals the body's."""
    with make_client(reasoning_parser="none") as c:
        body = ask(5, include=["message.output_text.logprobs"], top_logprobs=2)
        r = c.post("/v1/responses", json=body).json()
        part = r["output"][0]["content"][0]
        assert part["text"] == "Hello world"
        entries = part["logprobs"]
        assert [e["token"] for e in entries] == ["Hello", " world", "</s>"]
        assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
        assert b"".join(bytes(e["bytes"]) for e in entries[:2]) == b"Hello world"
        evs = events(c, body)
        deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
        carried = [x["token"] for d in deltas for x in d["logprobs"]]
        assert carried == ["Hello", " world"]  # </s> has no text: the part takes it
        done = next(e for e in evs if e["type"] == "response.output_text.done")
        assert done["logprobs"] == entries
        final = evs[-1]["response"]["output"][0]["content"][0]
        assert final["logprobs"] == entries
        plain = c.post("/v1/responses", json=ask(5)).json()  # not asked: an empty list
        assert plain["output"][0]["content"][0]["logprobs"] == []


@pytest.mark.parametrize(("script", "parsers", "text"), [
    # the tokens of the text only: not the call's, its marker's or the end token's
    (3, {"reasoning_parser": "none"}, "Hello world"),
    (0, {"reasoning_parser": "none"}, "Let me check."),
    (2, {"reasoning_parser": "none", "tool_call_parser": "hermes"}, "Sure"),
    # nor the reasoning's
    (1, {}, "Hello world"),
])
def test_message_logprobs_beside_calls_and_reasoning(script, parsers, text):
    """With tools or a reasoning parser, the message's part carries the entries of the
    tokens its text is made of, alike in both modes; OpenAI's function_call and reasoning
    items carry none."""
    with make_client(**parsers) as c:
        tokens = c.post("/tokenize", json={"prompt": text, "add_special_tokens": False,
                                           "return_token_strs": True}).json()["token_strs"]
        body = ask(script, tools=TOOLS, include=["message.output_text.logprobs"],
                   top_logprobs=1)
        whole = c.post("/v1/responses", json=body).json()
        messages = [o for o in whole["output"] if o["type"] == "message"]
        assert len(messages) == 1 and len(whole["output"]) > 1, whole["output"]
        part = messages[0]["content"][0]
        assert part["text"] == text
        assert [e["token"] for e in part["logprobs"]] == tokens
        assert b"".join(bytes(e["bytes"]) for e in part["logprobs"]) == text.encode()
        evs = events(c, body)
        carried = [x["token"] for e in evs if e["type"] == "response.output_text.delta"
                   for x in e["logprobs"]]
        assert carried == tokens
        final = [o for o in evs[-1]["response"]["output"] if o["type"] == "message"]
        assert final[0]["content"][0]["logprobs"] == part["logprobs"]
        assert all("logprobs" not in o for o in whole["output"] if o["type"] != "message")


@pytest.mark.parametrize(("settings", "extra", "param", "words"), [
    ({"reasoning_parser": "none"}, {"include": ["file_search_call.results"]}, "include",
     "is not supported"),
    ({"reasoning_parser": "none"}, {"top_logprobs": 3}, "top_logprobs", "needs include"),
])
def test_logprobs_refusals_name_the_field(settings, extra, param, words):
    with make_client(**settings) as c:
        r = c.post("/v1/responses", json=ask(3, **extra))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert words in r.json()["error"]["message"]


def test_max_tool_calls_caps_built_in_tools_only(client):
    """OpenAI's max_tool_calls counts calls to built-in tools; this server runs none (a
    built-in tool is a 400), so function calls are all answered and the cap is echoed."""
    plain = client.post("/v1/responses", json=ask(0, tools=TOOLS)).json()
    capped = client.post("/v1/responses", json=ask(0, tools=TOOLS, max_tool_calls=1)).json()
    assert capped["max_tool_calls"] == 1 and plain["max_tool_calls"] is None
    assert [o.get("arguments") for o in capped["output"]] == [
        o.get("arguments") for o in plain["output"]]
    assert sum(o["type"] == "function_call" for o in capped["output"]) == 2
    final = events(client, ask(0, tools=TOOLS, max_tool_calls=1))[-1]["response"]
    assert final["max_tool_calls"] == 1
    for bad, param in (({"max_tool_calls": -1}, "max_tool_calls"),
                       ({"tools": [*TOOLS, {"type": "web_search"}]}, "tools")):
        r = client.post("/v1/responses", json={**ask(0, tools=TOOLS, max_tool_calls=1),
                                               **bad})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith(param), r.json()


@pytest.mark.parametrize("fmt, field", [
    ({"type": "json_object", "schema": {"type": "object", "required": ["a"]}}, "schema"),
    ({"type": "text", "strict": True}, "strict"),
    ({"type": "json_object", "name": "answer"}, "name")])
def test_json_schema_fields_on_another_format_are_400s(client, fmt, field):
    """A schema sent with type json_object would go unenforced (and be echoed as if it
    were): a 400 naming it."""
    r = client.post("/v1/responses", json=ask(0, text={"format": fmt}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"text.format.{field}" and "json_schema" in err["message"]


@pytest.mark.parametrize("kind", ["json_object", "text"])
def test_chat_response_format_takes_no_unused_schema(client, kind):
    """A json_schema beside type text / json_object would go unused: a 400 naming it;
    null there (vLLM's ResponseFormat model sends it) is accepted."""
    body = {"messages": [{"role": "user", "content": "<script5>"}]}
    r = client.post("/v1/chat/completions", json={**body, "response_format": {
        "type": kind, "json_schema": {"name": "a"}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].endswith("json_schema")
    if kind == "text":  # the scripted model's tokenizer compiles no json_object grammar
        r = client.post("/v1/chat/completions", json={**body, "response_format": {
            "type": kind, "json_schema": None}})
        assert r.status_code == 200, r.text


def test_a_call_cut_by_max_output_tokens_can_be_continued(client):
    """A function_call max_output_tokens cut (status incomplete, as this server returns
    and stores it; its arguments may be cut JSON) goes back into the prompt with its
    complete members: the next turn is served (it was a 400 naming chat's messages, on
    every later turn, previous_response_id included)."""
    def history(arguments: str, status: str | None) -> list[dict]:
        call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                "arguments": arguments, **({"status": status} if status else {})}
        return [{"role": "user", "content": "<script0>"}, call,
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"role": "user", "content": "<script5>"}]

    def count(items: list[dict]) -> int:
        r = client.post("/v1/responses/input_tokens", json={"input": items, "tools": TOOLS})
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    cut = '{"city": "Paris", "unit": "cel'
    r = client.post("/v1/responses", json={**ask(5, tools=TOOLS),
                                           "input": history(cut, "incomplete")})
    assert r.status_code == 200, r.text
    assert count(history(cut, "incomplete")) == count(history('{"city": "Paris"}', None))
    # what a chat template reads: valid JSON (Jinja templates parse it: cut JSON was a
    # 400); a call sent as whole reads as the text it was (a JSON string of it)
    from service.translate.responses import _call
    from service.translate.schemas import FunctionCallItem

    def arguments(status):
        item = FunctionCallItem(type="function_call", call_id="c", name="f", arguments=cut,
                                status=status)
        return _call(item)["function"]["arguments"]

    assert json.loads(arguments("incomplete")) == {"city": "Paris"}
    assert json.loads(arguments("completed")) == json.loads(arguments(None)) == cut


@pytest.mark.parametrize("fmt", ["published", "hf", "tekken"])
def test_a_call_whose_arguments_are_no_json_can_be_continued(tiny_checkpoint, fmt):
    """A completed function_call whose arguments the model wrote as no valid JSON (a
    Mistral call's arguments are returned as generated) goes back into the prompt as the
    text it was: the turn after it renders (a Jinja template's was a 400 on every later
    turn, previous_response_id included); mistral-common's encoding, which took it
    already, writes it as before."""
    from engine.text.tokenizer import Tokenizer
    from service.prompts import message_dicts
    from service.tool_calls.select import ParserChoice
    from service.translate.responses import to_chat
    from service.translate.schemas import ResponsesRequest

    tok = Tokenizer.from_dir(tiny_checkpoint(tokenizer=fmt))
    broken = '{"city": Paris'

    def ids(arguments: str) -> list[int]:
        call = {"type": "function_call", "call_id": "abcDEF123", "name": "get_weather",
                "arguments": arguments, "status": "completed"}
        body = ResponsesRequest.model_validate({"model": "m", "tools": TOOLS, "input": [
            {"role": "user", "content": "Weather?"}, call,
            {"type": "function_call_output", "call_id": "abcDEF123", "output": "sunny"}]})
        chat = to_chat(body, ParserChoice("mistral", None, ""), tok)
        tools = [t.model_dump(exclude_none=True) for t in chat.tools or ()]
        return tok.encode_chat(message_dicts(chat.messages), tools=tools)

    text = tok.decode(ids(broken), skip_special_tokens=False)
    if fmt == "tekken":  # a JSON string of the text, as mistral-common writes such text
        assert f"[ARGS]{json.dumps(broken)}" in text
    else:  # both Jinja templates write string arguments as they are
        assert f"[ARGS]{broken}[TOOL_RESULTS]" in text.replace("</s>", "")
    assert ids('{"city": "Paris"}') != ids(broken)


def test_message_tokens_skip_silent_tokens_and_read_a_cut_character():
    """MessageTokens: a special token inside the text (decoded to nothing) carries no
    entry, and a U+FFFD standing for a character cut at the end takes its tokens; the
    text fed whole or piece by piece gives the same entries."""
    from service.tool_calls.deltas import CallArgs, CallStart, Content
    from service.translate.message_tokens import MessageTokens
    pieces = [(1, b"Hi"), (9, b"<s9>"), (2, b" th"), (3, b"ere"), (7, b"[C]"), (4, b"f"),
              (5, b"{}"), (6, b" \xe4"), (8, b"\xb8")]
    ids = [i for i, _ in pieces]
    entries = [{"token": str(i), "bytes": list(b)} for i, b in pieces]

    def run(events):
        m = MessageTokens(lambda i: i == 9)
        m.add(ids, entries)
        return [e["token"] for ev in events for e in m.take(ev)]

    calls = [CallStart(0, "x", "f"), CallArgs(0, "{}")]
    whole = run([Content("Hi there"), *calls, Content(" \ufffd")])
    assert whole == ["1", "2", "3", "6", "8"]
    assert run([Content("Hi"), Content(" there"), *calls, Content(" \ufffd")]) == whole
    assert run([Content("elsewhere")]) == []  # a text the parser wrote: no entries


def test_message_tokens_never_take_a_parsers_text_marker():
    """A text marker (</think>, </tool_call>) is no event's text: a short message text
    ("k") is found after it, not inside it, alike whole and streamed."""
    from service.tool_calls.deltas import Content, Reasoning
    from service.translate.message_tokens import MessageTokens
    pieces = [b"<think>", b"ok", b"</think>", b"k"]
    entries = [{"token": str(i), "bytes": list(b)} for i, b in enumerate(pieces)]
    m = MessageTokens(lambda _: False, ("<think>", "</think>"))
    m.add(range(4), entries)
    assert [e["token"] for ev in (Reasoning("ok"), Content("k")) for e in m.take(ev)] == ["3"]
