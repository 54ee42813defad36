"""Chat tool calls, reasoning content and their errors through the real app and engine,
on a scripted model (tests/service/scripted_backend.py): exact token streams in, OpenAI
messages and stream chunks out."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.tool_calls.call_ids import is_call_id
from tests.service.scripted_backend import scripted_loader

SCRIPTS = [
    'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
    "[THINK]Paris is in France[/THINK]Hello world",
    'Sure<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "Hello world[TOOL_CALLS]get_time[ARGS]{}",
    'Sure<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    "Hello world",
    # the scripted vocabulary has no "\n": a space stands for the grammar's separator
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> '
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    # a reasoning section, then the gap a tool grammar allows before the calls
    '[THINK]Paris is in France[/THINK]  [TOOL_CALLS]get_time[ARGS]{}',
    "  ",
    # text between and after Hermes calls, each run ending in a space
    'A <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> B '
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> C ',
]
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "get_time")]


def make_client(**settings) -> TestClient:
    cfg = Settings(**{"max_model_len": 512, **settings})
    return TestClient(create_app(cfg, load_backend=scripted_loader(SCRIPTS)))


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def chat(client, script: int, **body):
    body = {"messages": [{"role": "user", "content": f"<script{script}>"}],
            "max_tokens": 200, "temperature": 0, **body}
    return client.post("/v1/chat/completions", json=body)


def stream(client, script: int, **body) -> list[dict]:
    r = chat(client, script, stream=True, **body)
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def reassemble(chunks: list[dict]) -> tuple[dict, str]:
    """The stream's choice 0 as one message, and its finish_reason."""
    msg: dict = {"content": "", "reasoning_content": "", "tool_calls": []}
    reason = None
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            msg["content"] += d.get("content") or ""
            msg["reasoning_content"] += d.get("reasoning_content") or ""
            indexes = [t["index"] for t in d.get("tool_calls", [])]
            assert len(indexes) == len(set(indexes)), d  # one entry per call, as OpenAI's
            for t in d.get("tool_calls", []):
                if "id" in t:
                    assert t["type"] == "function"
                    assert t["index"] == len(msg["tool_calls"])
                    msg["tool_calls"].append({"id": t["id"], "type": "function", "function": {
                        "name": t["function"]["name"], "arguments": ""}})
                else:
                    assert set(t) == {"index", "function"}
                msg["tool_calls"][t["index"]]["function"]["arguments"] += \
                    t["function"]["arguments"]
            reason = ch["finish_reason"] or reason
    return msg, reason


def test_mistral_calls_non_streaming(client):
    r = chat(client, 0, tools=TOOLS)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    msg = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert msg["content"] == "Let me check."
    calls = msg["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"},
                                                                       {"city": "Rome"}]
    assert all(is_call_id(c["id"]) and c["type"] == "function" for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_stream_reassembles_to_the_non_streaming_message(client):
    whole = chat(client, 0, tools=TOOLS).json()["choices"][0]["message"]
    chunks = stream(client, 0, tools=TOOLS)
    msg, reason = reassemble(chunks)
    assert reason == "tool_calls"
    assert msg["content"] == whole["content"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] \
        == [(c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]]
    texts = [d.get("content") or "" for c in chunks for d in
             (ch["delta"] for ch in c["choices"])]
    assert not any("TOOL" in t or "[" in t for t in texts)


def test_tool_choice_none_and_no_tools_leave_the_output_as_text(client):
    for body in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        choice = chat(client, 0, **body).json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert "tool_calls" not in choice["message"]
        assert choice["message"]["content"].startswith("Let me check.get_weather{")


def test_reasoning_content_split_and_counted(client):
    body = chat(client, 1, stream_options=None).json()
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] == "Paris is in France"
    assert msg["content"] == "Hello world"
    # one token per character of the reasoning text in this vocabulary, but "Paris"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1 + len(
        " is in France")
    chunks = stream(client, 1, stream_options={"include_usage": True})
    streamed, reason = reassemble(chunks)
    assert (streamed["reasoning_content"], streamed["content"], reason) == (
        "Paris is in France", "Hello world", "stop")
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 14


def test_stop_string_cuts_before_a_call(client):
    for s in (False, True):
        if s:
            msg, reason = reassemble(stream(client, 3, tools=TOOLS, stop=[" wor"]))
        else:
            choice = chat(client, 3, tools=TOOLS, stop=[" wor"]).json()["choices"][0]
            msg, reason = choice["message"], choice["finish_reason"]
        assert (msg["content"], reason) == ("Hello", "stop")
        assert not msg.get("tool_calls")


def test_a_stop_string_inside_a_calls_arguments_ends_with_stop(client):
    """A stop string that cut a call's arguments short ended with "tool_calls" and the
    arguments '{"city": "' (no call a client can run): "stop", as vLLM's, whole and
    streamed (a stop string that cuts no call: the test below)."""
    whole = chat(client, 0, tools=TOOLS, stop=["Paris"]).json()["choices"][0]
    assert whole["finish_reason"] == "stop", whole
    _, reason = reassemble(stream(client, 0, tools=TOOLS, stop=["Paris"]))
    assert reason == "stop"
    # the first call whole, the second cut: the answer still holds a cut call
    whole = chat(client, 0, tools=TOOLS, stop=["Rome"]).json()["choices"][0]
    assert whole["finish_reason"] == "stop", whole
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_stop_string_after_the_text_keeps_the_call(client):
    choice = chat(client, 3, tools=TOOLS, stop=["zzz"]).json()["choices"][0]
    assert choice["message"]["content"] == "Hello world"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_time",
                                                              "arguments": "{}"}


def test_n_choices_are_parsed_each(client):
    body = chat(client, 0, tools=TOOLS, n=2).json()
    assert [len(c["message"]["tool_calls"]) for c in body["choices"]] == [2, 2]


def test_hermes_parser():
    with make_client(tool_call_parser="hermes") as c:
        assert c.get("/version").json()["tool_call_parser"] == "hermes"
        choice = chat(c, 2, tools=TOOLS).json()["choices"][0]
        assert choice["message"]["content"] == "Sure"
        assert choice["message"]["tool_calls"][0]["function"] == {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}
        msg, reason = reassemble(stream(c, 2, tools=TOOLS))
        assert (msg["content"], reason) == ("Sure", "tool_calls")


def test_a_hermes_block_cut_before_its_name_is_whole_is_content():
    """max_tokens or a stop string cut a <tool_call> block before its name is whole: no
    call, the text as written, tags included (vLLM's non-streaming answer; its stream
    drops the text), whole and streamed alike."""
    from tests.service.scripted_backend import ScriptTokenizer
    tok, script = ScriptTokenizer(), SCRIPTS[2]
    ids = tok.encode(script)
    at = script.index("<tool_call>")
    cuts = [({"stop": ["get_"]}, script[:script.index("get_")])]
    cuts += [({"max_tokens": n}, tok.decode(ids[:n])) for n in range(len(ids))
             if at < len(tok.decode(ids[:n])) < script.index("get_")]
    with make_client(tool_call_parser="hermes") as c:
        for body, text in cuts:
            whole = chat(c, 2, tools=TOOLS, **body).json()["choices"][0]["message"]
            msg, _ = reassemble(stream(c, 2, tools=TOOLS, **body))
            assert (whole["content"], whole.get("tool_calls")) == (text, None), body
            assert (msg["content"], msg["tool_calls"]) == (text, []), body


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_weather"}}])
def test_forced_calls_have_no_content_between_them(choice):
    """tool_choice required / named: the grammar's "\n" between Hermes blocks is no
    content (it came back as content "\n" beside the calls; OpenAI's is null)."""
    with make_client(tool_call_parser="hermes") as c:
        whole = chat(c, 6, tools=TOOLS, tool_choice=choice).json()["choices"][0]
        msg = whole["message"]
        assert msg["content"] is None, msg
        assert [t["function"]["name"] for t in msg["tool_calls"]] == ["get_weather", "get_time"]
        streamed, reason = reassemble(stream(c, 6, tools=TOOLS, tool_choice=choice))
        assert streamed["content"] == "" and len(streamed["tool_calls"]) == 2
        # a named function's call ends with "stop", as OpenAI's and vLLM's (it was asked
        # for); required and auto calls with "tool_calls"
        assert whole["finish_reason"] == reason == ("tool_calls" if choice == "required"
                                                    else "stop")
        # auto: whitespace between calls is no content either (vLLM's hermes content is
        # the text before the first call: null here; it was " ")
        msg = chat(c, 6, tools=TOOLS).json()["choices"][0]["message"]
        assert msg["content"] is None, msg
        streamed, _ = reassemble(stream(c, 6, tools=TOOLS))
        assert streamed["content"] == "" and len(streamed["tool_calls"]) == 2


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("cut", [2, 5, 9])
def test_a_forced_call_cut_short_leaves_no_call_syntax_in_content(choice, cut):
    """max_tokens cutting a forced call left its start as content ("<tool_", a half
    name); the grammar writes calls only, so there is none, whole or streamed."""
    with make_client(tool_call_parser="hermes") as c:
        whole = chat(c, 6, tools=TOOLS, tool_choice=choice, max_tokens=cut).json()
        msg = whole["choices"][0]["message"]
        assert msg["content"] is None, msg
        assert whole["choices"][0]["finish_reason"] == "length"
        streamed, reason = reassemble(stream(c, 6, tools=TOOLS, tool_choice=choice,
                                             max_tokens=cut))
        assert streamed["content"] == "" and reason == "length"


def test_version_names_the_parsers(client):
    v = client.get("/version").json()
    assert (v["tool_call_parser"], v["reasoning_parser"]) == ("mistral", "mistral")


BAD = [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools.0.function.name"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools.0.type"),
    # pydantic's loc through the discriminated union: field, tag, missing field
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
]


@pytest.mark.parametrize(("extra", "param"), BAD)
def test_bad_tool_requests_are_400_naming_the_parameter(client, extra, param):
    r = chat(client, 0, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


CALL = {"id": "call_abc", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# the first and last break the schema's role rules (a validation error's dotted location);
# the second a rule across messages (service/rejections.py)
BAD_TURNS = [
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "18C"}],
     "messages.1.tool_call_id"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_other", "content": "18C"}],
     "messages.2.tool_call_id"),
    ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "messages.0.tool_calls"),
]


@pytest.mark.parametrize(("messages", "param"), BAD_TURNS)
def test_bad_tool_turns_are_400(client, messages, param):
    r = client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_tool_round_trip_is_accepted(client):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "<script3>"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello world"


def test_tools_without_a_parser_are_400():
    with make_client(tool_call_parser="none") as c:
        r = chat(c, 0, tools=TOOLS)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert chat(c, 0, tools=TOOLS, tool_choice="none").status_code == 200


def test_return_token_ids_keeps_the_ids_of_held_back_outputs():
    """vLLM's return_token_ids while a call's tags are held back: no id is lost or sent
    twice, so the chunks' ids join into the whole answer's."""
    with make_client() as c:
        whole = chat(c, 0, tools=TOOLS, return_token_ids=True).json()
        chunks = stream(c, 0, tools=TOOLS, return_token_ids=True)
    ids = sum((ch["choices"][0].get("token_ids", []) for ch in chunks if ch["choices"]), [])
    assert ids == whole["choices"][0]["token_ids"] and len(ids) > 5
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    sent = [ch for ch in chunks if ch["choices"]]
    assert len(sent) - 1 < len(ids)  # some outputs were held back (a tag in progress)


@pytest.mark.parametrize("path, tool, param", [
    ("/v1/chat/completions", {"type": "function", "function": {
        "name": "pick", "parameters": {"type": "string", "enum": ["a"]}}},
     "tools.0.function.parameters"),
    ("/v1/responses", {"type": "function", "name": "pick", "parameters": {"type": "array"}},
     "tools.0.parameters")])
def test_parameters_that_describe_no_object_are_400s(path, tool, param):
    """OpenAI's rule: a call's arguments are a JSON object, so a parameters schema of
    another type is a 400 naming it (it was served: arguments a client cannot unpack)."""
    body = ({"messages": [{"role": "user", "content": "<script0>"}]}
            if path.endswith("completions") else {"input": "<script0>"})
    with make_client() as c:
        r = c.post(path, json={**body, "tools": [tool]})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "object" in err["message"]
        ok = {**tool, "parameters": {"type": "object"}} if "parameters" in tool else {
            **tool, "function": {**tool["function"], "parameters": {"type": "object"}}}
        assert c.post(path, json={**body, "tools": [ok]}).status_code == 200


def test_whitespace_before_the_first_call_is_no_content():
    """Whitespace between a reasoning section and the calls (a tool grammar allows up to 8
    characters there) came back as content "  " beside the calls: content is null, whole
    and streamed; whitespace that no call follows is still the answer."""
    with make_client() as c:
        msg = chat(c, 7, tools=TOOLS).json()["choices"][0]["message"]
        assert (msg["content"], msg["reasoning_content"]) == (None, "Paris is in France")
        assert [t["function"]["name"] for t in msg["tool_calls"]] == ["get_time"]
        streamed, reason = reassemble(stream(c, 7, tools=TOOLS))
        assert (streamed["content"], reason) == ("", "tool_calls")
        assert chat(c, 8, tools=TOOLS).json()["choices"][0]["message"]["content"] == "  "
        assert reassemble(stream(c, 8, tools=TOOLS))[0]["content"] == "  "


def test_a_message_that_spells_think_opens_no_section():
    """A message's text that spells <think> (a question about the tag) is no reasoning
    section: the answer is content, as when the text holds no tag."""
    with make_client(reasoning_parser="think") as c:
        for system in ("What does <think> do?", "Hello"):
            r = c.post("/v1/chat/completions", json={"max_tokens": 20, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "<script5>"}]})
            msg = r.json()["choices"][0]["message"]
            assert (msg["content"], msg.get("reasoning_content")) == ("Hello world", None)


def _allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


def test_allowed_tools_read_as_their_mode(client):
    """allowed_tools auto reads text and calls as auto does, required only the calls (the
    grammar narrows the names: tests/engine/structured/test_grammar_language.py); the
    prompt shows every tool, as with tool_choice auto."""
    auto = chat(client, 3, tools=TOOLS, tool_choice=_allowed("auto", "get_time")).json()
    assert auto["choices"][0]["message"]["content"] == "Hello world"
    assert [c["function"]["name"] for c in auto["choices"][0]["message"]["tool_calls"]] \
        == ["get_time"]
    plain = chat(client, 3, tools=TOOLS).json()
    assert auto["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    req = chat(client, 5, tools=TOOLS, tool_choice=_allowed("required", "get_time")).json()
    assert req["choices"][0]["message"]["content"] is None  # calls only, as required


@pytest.mark.parametrize("tool_choice, param", [
    (_allowed("auto", "get_time", "nope"), "tool_choice.allowed_tools.tools.1.function.name"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
     "tool_choice.allowed_tools.tools"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "none", "tools": [
        {"type": "function", "function": {"name": "get_time"}}]}},
     "tool_choice.allowed_tools.mode"),
])
def test_allowed_tools_refusals_name_the_field(client, tool_choice, param):
    r = chat(client, 3, tools=TOOLS, tool_choice=tool_choice)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_allowed_tools_in_the_responses_shape(client):
    tools = [{"type": "function", "name": t["function"]["name"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    only = {"type": "allowed_tools", "mode": "auto",
            "tools": [{"type": "function", "name": "get_time"}]}
    body = {"model": "scripted-model", "input": "<script3>", "tools": tools,
            "tool_choice": only}
    r = client.post("/v1/responses", json=body).json()
    assert [o["type"] for o in r["output"]] == ["message", "function_call"]
    assert r["tool_choice"] == only
    bad = {**only, "tools": [{"type": "function", "name": "nope"}]}
    r = client.post("/v1/responses", json={**body, "tool_choice": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice.tools.0.name"


def test_text_between_calls_keeps_its_trailing_whitespace_in_both_modes():
    """Text between two calls that ended in whitespace (" B " before a call, " C " at the
    end) lost that whitespace in streams only: it came as its own step, was held as if the
    run were whitespace alone, then dropped when the call (or the end) came. Whitespace is
    dropped only where the whole run between calls is whitespace; chat, Responses and
    Messages, whole and streamed, give the same text."""
    with make_client(tool_call_parser="hermes") as c:
        whole = chat(c, 9, tools=TOOLS).json()["choices"][0]["message"]
        streamed, _ = reassemble(stream(c, 9, tools=TOOLS))
        assert whole["content"] == streamed["content"] == "A  B  C ", (whole, streamed)
        assert len(whole["tool_calls"]) == len(streamed["tool_calls"]) == 2
        tools = [{"type": "function", "name": n, "parameters": {"type": "object"}}
                 for n in ("get_weather", "get_time")]
        body = {"input": "<script9>", "tools": tools}
        texts = []
        for r in (c.post("/v1/responses", json=body).json(), json.loads(c.post(
                "/v1/responses", json={**body, "stream": True}).text.strip().split(
                "\n")[-1][6:])["response"]):
            texts.append([o["content"][0]["text"] for o in r["output"]
                          if o["type"] == "message"])
        assert texts == [["A ", " B ", " C "]] * 2
        body = {"max_tokens": 200, "messages": [{"role": "user", "content": "<script9>"}],
                "tools": [{"name": t["name"], "input_schema": t["parameters"]}
                          for t in tools]}
        whole = c.post("/v1/messages", json=body).json()["content"]
        deltas = [json.loads(ln[6:]) for ln in c.post("/v1/messages", json={
            **body, "stream": True}).text.splitlines() if ln.startswith("data: ")]
        text = {}
        for d in deltas:
            if d["type"] == "content_block_delta" and d["delta"]["type"] == "text_delta":
                text[d["index"]] = text.get(d["index"], "") + d["delta"]["text"]
        assert [b["text"] for b in whole if b["type"] == "text"] == list(text.values()) \
            == ["A ", " B ", " C "]
