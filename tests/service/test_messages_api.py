"""/v1/messages (Anthropic's Messages API) on the scripted model
(tests/service/scripted_backend.py): exact event sequences for text, thinking and tool
calls, the translation of history (system, tool_use, tool_result), count_tokens, errors in
Anthropic's shape and keys as x-api-key; then the anthropic SDK over the same app."""

from __future__ import annotations

import base64
import json

import anthropic
import pytest

from tests.service.scripted_backend import ScriptTokenizer
from tests.service.test_chat_tools_api import (
    SCRIPTS,
    chat,
    make_client,
    reassemble,
    stream,
)

TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in ("get_weather", "get_time")]


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def ask(script: int, **body) -> dict:
    return {"max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": f"<script{script}>"}], **body}


def events(client, body: dict) -> list[tuple[str, dict]]:
    r = client.post("/v1/messages", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    out = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
    assert all(d["type"] == n for n, d in out)
    return out


def shape(evs: list[tuple[str, dict]]) -> list[str]:
    """Event names, consecutive deltas of one block folded into one."""
    out: list[str] = []
    for name, d in evs:
        label = name
        if name == "content_block_delta":
            label = f"delta {d['index']} {d['delta']['type']}"
        elif name == "content_block_start":
            label = f"start {d['index']} {d['content_block']['type']}"
        elif name == "content_block_stop":
            label = f"stop {d['index']}"
        if not out or out[-1] != label or not label.startswith("delta"):
            out.append(label)
    return out


def test_thinking_and_text(client):
    r = client.post("/v1/messages", json=ask(1))
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"].startswith("msg_") and (m["type"], m["role"]) == ("message", "assistant")
    signature = m["content"][0]["signature"]
    assert len(base64.b64decode(signature, validate=True)) == 32  # HMAC-SHA256
    assert m["content"] == [
        {"type": "thinking", "thinking": "Paris is in France", "signature": signature},
        {"type": "text", "text": "Hello world"}]
    assert (m["stop_reason"], m["stop_sequence"]) == ("end_turn", None)
    assert m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"] == 2
    evs = events(client, ask(1))
    assert shape(evs) == ["message_start", "ping", "start 0 thinking", "delta 0 thinking_delta",
                          "delta 0 signature_delta", "stop 0", "start 1 text",
                          "delta 1 text_delta", "stop 1", "message_delta", "message_stop"]
    text = "".join(d["delta"].get("text", "") for n, d in evs if n == "content_block_delta")
    thought = "".join(d["delta"].get("thinking", "") for n, d in evs
                      if n == "content_block_delta")
    assert (thought, text) == ("Paris is in France", "Hello world")
    assert [d["delta"]["signature"] for n, d in evs if n == "content_block_delta"
            and d["delta"]["type"] == "signature_delta"] == [signature]
    final = evs[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == m["usage"]["output_tokens"]


def test_tool_calls_as_tool_use_blocks(client):
    m = client.post("/v1/messages", json=ask(0, tools=TOOLS)).json()
    assert [b["type"] for b in m["content"]] == ["text", "tool_use", "tool_use"]
    assert m["content"][0]["text"] == "Let me check."
    assert [(b["name"], b["input"]) for b in m["content"][1:]] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert m["stop_reason"] == "tool_use"
    evs = events(client, ask(0, tools=TOOLS))
    assert shape(evs) == [
        "message_start", "ping", "start 0 text", "delta 0 text_delta", "stop 0",
        "start 1 tool_use", "delta 1 input_json_delta", "stop 1",
        "start 2 tool_use", "delta 2 input_json_delta", "stop 2",
        "message_delta", "message_stop"]
    args = ["".join(d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta"
                    and d["index"] == i) for i in (1, 2)]
    assert [json.loads(a) for a in args] == [{"city": "Paris"}, {"city": "Rome"}]
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_same_output_as_chat_completions(client):
    for script in (0, 1, 3):
        m = client.post("/v1/messages", json=ask(script, tools=TOOLS)).json()
        tools = [{"type": "function", "function": {"name": t["name"],
                                                   "parameters": t["input_schema"]}}
                 for t in TOOLS]
        msg, _ = reassemble(stream(client, script, tools=tools))
        text = "".join(b.get("text", "") for b in m["content"])
        calls = [(b["name"], b["input"]) for b in m["content"] if b["type"] == "tool_use"]
        assert text == msg["content"]
        assert calls == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                         for c in msg["tool_calls"]]


def test_stop_sequences_and_max_tokens(client):
    m = client.post("/v1/messages", json=ask(3, stop_sequences=[" wor"])).json()
    assert m["content"] == [{"type": "text", "text": "Hello"}]
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", " wor")
    m = client.post("/v1/messages", json=ask(3, max_tokens=1)).json()
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 1
    for body, delta in ((ask(3, stop_sequences=[" wor"]), {"stop_reason": "stop_sequence",
                                                           "stop_sequence": " wor"}),
                        (ask(3, max_tokens=1), {"stop_reason": "max_tokens",
                                                "stop_sequence": None})):
        name, last = events(client, body)[-2]
        assert name == "message_delta" and last["delta"] == delta


def test_history_with_system_tool_use_and_tool_result(client):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "<script0>", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "<script3>"}]}]}]
    body = {"max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
            "messages": messages, "tools": TOOLS}
    m = client.post("/v1/messages", json=body).json()
    # the thinking block is dropped from the prompt, so the tool result's script runs
    assert [b.get("text") or b["name"] for b in m["content"]] == ["Hello world", "get_time"]
    count = {k: v for k, v in body.items() if k != "max_tokens"}  # not a count's field
    r = client.post("/v1/messages/count_tokens", json=count)
    assert r.status_code == 200 and r.json() == {"input_tokens": m["usage"]["input_tokens"]
                                                 + m["usage"]["cache_read_input_tokens"]}
    bad = {**body, "messages": messages[:1] + messages[2:]}
    r = client.post("/v1/messages", json=bad)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "messages.1.content.0.tool_use_id: 'toolu_1' answers no tool_use block"), r.text


@pytest.mark.parametrize("extra, words", [
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "not among the tools"),
    ({"tool_choice": {"type": "tool"}}, "needs a name"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"thinking": {"type": "enabled", "budget_tokens": 500}}, "budget_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"max_tokens": None}, "max_tokens"),
    ({"output_config": {"effort": "high"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "schema"),
    # a tool's input is an object (Anthropic's rule): a string schema's call had lost its
    # input ({}) and broke the SDK's stream helper
    ({"tools": [{"name": "pick", "input_schema": {"type": "string", "enum": ["a"]}}]},
     "tools.0.input_schema: input_schema.type must be 'object'"),
    ({"tools": [{"name": "pick", "input_schema": {}}]}, "tools.0.input_schema"),
    # tool fields this server does not serve are named, not dropped
    ({"tools": [{**TOOLS[0], "defer_loading": True}]}, "tools.0.defer_loading"),
    ({"tools": [{**TOOLS[0], "input_examples": [{"city": "Paris"}]}]},
     "tools.0.input_examples"),
    ({"tools": [{**TOOLS[0], "allowed_callers": ["code_execution_20250825"]}]},
     "tools.0.allowed_callers"),
    ({"tools": [{**TOOLS[0], "eager_input_streaming": False}]},
     "tools.0.eager_input_streaming"),
])
def test_errors_in_anthropic_shape(client, extra, words):
    r = client.post("/v1/messages", json=ask(0, **{"tools": TOOLS, **extra}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]


@pytest.mark.parametrize("content", ["", [{"type": "text", "text": ""}]])
def test_messages_left_with_nothing_to_answer_are_a_400_naming_them(client, content):
    """An assistant turn of empty text is dropped from the prompt, as one of thinking
    alone: a request of nothing else answers a documented 400 naming messages (it was
    chat's "List should have at least 1 item", or an empty prefill)."""
    messages = [{"role": "assistant", "content": content}]
    for path, body in (("/v1/messages", {**ask(0), "messages": messages}),
                       ("/v1/messages/count_tokens", {"messages": messages})):
        r = client.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("messages: no message to answer")


def test_image_blocks_become_image_url_parts(client):
    image = {"type": "image", "source": {"type": "url", "url": "http://x/cat.png"}}
    r = client.post("/v1/messages", json={"max_tokens": 5, "messages": [
        {"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]})
    # the chat path's answer for an image part until images are served
    assert r.status_code == 400 and "images" in r.json()["error"]["message"]


def test_thinking_needs_a_reasoning_parser():
    with make_client(reasoning_parser="none") as c:
        r = c.post("/v1/messages", json=ask(3, thinking={"type": "enabled",
                                                         "budget_tokens": 10}))
        assert r.status_code == 400 and "thinking" in r.json()["error"]["message"]
        assert c.post("/v1/messages", json=ask(3)).status_code == 200


def test_keys_as_x_api_key_and_not_found_in_anthropic_shape():
    with make_client(api_keys=("k1",)) as c:
        r = c.post("/v1/messages", json=ask(3))
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.post("/v1/messages", json=ask(3), headers={"x-api-key": "k1"}).status_code == 200
        r = c.post("/v1/chat/completions", headers={"x-api-key": "k1"},
                   json={"messages": [{"role": "user", "content": "<script3>"}]})
        assert r.status_code == 200
        r = c.post("/v1/messages", json=ask(3, model="other"), headers={"x-api-key": "k1"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        # the OpenAI routes keep OpenAI's shape
        assert "type" not in chat(c, 3).json()


def test_the_anthropic_sdk(client):
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    m = sdk.messages.create(model="scripted-model", max_tokens=100,
                            messages=[{"role": "user", "content": "<script0>"}], tools=TOOLS)
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"]
    assert m.content[1].input == {"city": "Paris"} and m.stop_reason == "tool_use"
    with sdk.messages.stream(model="scripted-model", max_tokens=100, tools=TOOLS,
                             messages=[{"role": "user", "content": "<script1>"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello world"
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Paris is in France"
    with sdk.messages.stream(model="scripted-model", max_tokens=100, tools=TOOLS,
                             messages=[{"role": "user", "content": "<script0>"}]) as s:
        final = s.get_final_message()
    assert final.model_dump()["content"] == m.model_dump()["content"][:1] + [
        {**b, "id": f.id} for b, f in zip(m.model_dump()["content"][1:], final.content[1:],
                                            strict=True)]
    with pytest.raises(anthropic.NotFoundError):
        sdk.messages.create(model="other", max_tokens=5,
                            messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model="scripted-model", max_tokens=5, messages=[])
    n = sdk.messages.count_tokens(model="scripted-model",
                                  messages=[{"role": "user", "content": "<script0>"}])
    assert n.input_tokens == 2


def test_the_sdk_tool_runner_goes_on_without_a_thread(client):
    """anthropic's beta tool runner asks for a server-side thread by default; the 400's
    error.details (thread_unsupported_request) make it send the whole conversation."""
    from anthropic import beta_tool

    seen = []

    @beta_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        seen.append(city)
        return "18C"

    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    runner = sdk.beta.messages.tool_runner(
        model="scripted-model", max_tokens=100, tools=[get_weather], max_iterations=2,
        messages=[{"role": "user", "content": "<script0>"}])
    replies = list(runner)
    assert seen and seen[0] == "Paris" and len(replies) == 2
    r = client.post("/v1/messages", json={**ask(0), "thread": {"type": "create"}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith("thread: ")
    assert err["details"] == {"error_code": "thread_unsupported_request", "unsupported": []}


def cut_in_second_call(script: str) -> int:
    """A max_tokens that ends ``script`` inside its second hermes call."""
    second = script.index("<tool_call>", script.index("</tool_call>"))
    return len(ScriptTokenizer().encode(script[:second + len('<tool_call>{"name"')]))


def test_block_order_is_output_order_in_both_modes():
    """A call cut by max_tokens after a complete one is text after the call's block, in
    the body as in the stream (the SDK's accumulator)."""
    with make_client(tool_call_parser="hermes") as c:
        body = ask(4, tools=TOOLS, max_tokens=cut_in_second_call(SCRIPTS[4]))
        m = c.post("/v1/messages", json=body).json()
        assert [b["type"] for b in m["content"]] == ["text", "tool_use", "text"]
        assert m["content"][2]["text"].startswith('<tool_call>{"name"')
        sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=c,
                                  max_retries=0)
        kw = {k: v for k, v in body.items() if k != "temperature"}
        with sdk.messages.stream(model="scripted-model", **kw) as s:
            final = s.get_final_message()
        whole = sdk.messages.create(model="scripted-model", **kw)
        assert [b.model_dump(exclude={"id"}) for b in final.content] == [
            b.model_dump(exclude={"id"}) for b in whole.content]
        assert m["stop_reason"] == "max_tokens"


def _success(client, api: str) -> float:
    text = client.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith(
        f'fp8serve_request_success_total{{api="{api}",finished_reason="stop"'))
    return float(line.rsplit(" ", 1)[1])


def test_metrics_carry_the_api(client):
    before = {api: _success(client, api) for api in ("chat", "messages", "responses")}
    assert client.post("/v1/messages", json=ask(3)).status_code == 200
    assert client.post("/v1/messages", json=ask(3)).status_code == 200
    assert client.post("/v1/responses", json={"input": "<script3>"}).status_code == 200
    assert chat(client, 3).status_code == 200
    after = {api: _success(client, api) for api in before}
    assert {api: after[api] - before[api] for api in before} == {
        "chat": 1, "messages": 2, "responses": 1}


def test_a_stop_sequence_after_a_tool_call_is_the_stop_reason():
    """A stop sequence that cut the output after a whole tool call (the chat answer's
    finish_reason tool_calls, stop_reason the string): Anthropic's stop_reason is
    stop_sequence with the string, as without a call; tool_use otherwise."""
    from engine.request import FinishReason
    from service.translate.anthropic import stop_reason

    class Calls:  # a ChoiceReader whose output ended on a call
        def finish_reason(self, reason):
            return "tool_calls" if reason is FinishReason.STOP else reason.value

    assert stop_reason(Calls(), FinishReason.STOP, "get_time") == ("stop_sequence", "get_time")
    assert stop_reason(Calls(), FinishReason.STOP, 2) == ("tool_use", None)
    assert stop_reason(Calls(), FinishReason.LENGTH, None) == ("max_tokens", None)


def test_an_image_in_a_tool_result_is_a_400_naming_it(client):
    """Not chat's 'image parts are accepted in user messages only (messages[3] is
    'tool')', which names a message the request does not have."""
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "iVBORw0KGgo="}}
    body = {"model": "m", "max_tokens": 4, "system": "sys", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "sun"}, img]}]}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(
        "messages.2.content.0.content.1: an image in a tool_result"), r.text


def test_tool_fields_served_as_they_are_sent(client):
    """strict goes to the chat function's strict (its schema enforced as chat enforces
    it); the no-op values of the other tool fields and cache_control are accepted."""
    from service.translate.anthropic import _tool_fields
    from service.translate.schemas import MessagesRequest

    body = MessagesRequest.model_validate(ask(0, tools=[{**TOOLS[0], "strict": True},
                                                        TOOLS[1]]))
    fns = [t["function"] for t in _tool_fields(body)["tools"]]
    assert fns[0]["strict"] is True and "strict" not in fns[1]
    noop = {**TOOLS[0], "defer_loading": False, "allowed_callers": ["direct"],
            "input_examples": [], "eager_input_streaming": True,
            "cache_control": {"type": "ephemeral"}}
    r = client.post("/v1/messages", json=ask(0, tools=[noop]))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_thinking_with_a_forced_tool_choice_is_a_400(client, choice):
    """Anthropic's rule: thinking may not be enabled when tool_choice forces tool use; a
    forced choice goes with thinking disabled (or left out), and auto with thinking."""
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    kw = {"model": "scripted-model", "max_tokens": 100, "tools": TOOLS,
          "messages": [{"role": "user", "content": "<script7>"}]}
    enabled = {"type": "enabled", "budget_tokens": 50}
    with pytest.raises(anthropic.BadRequestError) as err:
        sdk.messages.create(**kw, tool_choice=choice, thinking=enabled)
    message = err.value.body["error"]["message"]
    assert message.startswith("thinking: ") and "tool_choice" in message, message
    assert choice["type"] in message
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.count_tokens(model="scripted-model", messages=kw["messages"],
                                  tools=TOOLS, tool_choice=choice, thinking=enabled)
    for thinking in ({"type": "disabled"}, None):
        m = sdk.messages.create(**kw, tool_choice=choice,
                                **({"thinking": thinking} if thinking else {}))
        assert m.content[-1].type == "tool_use" and m.stop_reason == "tool_use"
    m = sdk.messages.create(**kw, tool_choice={"type": "auto"}, thinking=enabled)
    assert [b.type for b in m.content] == ["thinking", "tool_use"]


def test_thinking_with_a_prefill_needs_the_prefill_to_start_with_thinking(client):
    """Anthropic's rule: with thinking enabled a final assistant message starts with a
    thinking block (the answer cannot reason after a text prefill); with one first, or
    thinking disabled, the prefill is continued."""
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    enabled = {"type": "enabled", "budget_tokens": 10}
    ask_ = {"role": "user", "content": "<script5>"}  # "Hello world"
    for prefill, field in (("Hello", "messages.1.content"),
                           ([{"type": "text", "text": "Hello"}], "messages.1.content.0.type")):
        kw = {"model": "scripted-model", "max_tokens": 100,
              "messages": [ask_, {"role": "assistant", "content": prefill}]}
        with pytest.raises(anthropic.BadRequestError) as err:
            sdk.messages.create(**kw, thinking=enabled)
        message = err.value.body["error"]["message"]
        assert message.startswith(f"{field}: ") and "thinking block" in message, message
        with pytest.raises(anthropic.BadRequestError):
            sdk.messages.count_tokens(model="scripted-model", messages=kw["messages"],
                                      thinking=enabled)
        m = sdk.messages.create(**kw, thinking={"type": "disabled"})
        assert [(b.type, b.text) for b in m.content] == [("text", " world")]
    thought = [{"type": "thinking", "thinking": "hm", "signature": ""},
               {"type": "text", "text": "Hello"}]
    for first in (thought, [{"type": "redacted_thinking", "data": "x"}, thought[1]]):
        m = sdk.messages.create(model="scripted-model", max_tokens=100, thinking=enabled,
                                messages=[ask_, {"role": "assistant", "content": first}])
        assert [(b.type, b.text) for b in m.content] == [("text", " world")]


def test_adaptive_thinking_lets_the_model_reason_as_it_does(client):
    """thinking {type: adaptive} (the model decides whether and how much to think), as
    the anthropic SDK sends it: no budget; on a model that cannot reason, no thinking."""
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                              max_retries=0)
    kw = {"model": "scripted-model", "max_tokens": 100,
          "messages": [{"role": "user", "content": "<script1>"}]}
    m = sdk.messages.create(**kw, thinking={"type": "adaptive"})
    assert [(b.type, getattr(b, "thinking", None)) for b in m.content] == [
        ("thinking", "Paris is in France"), ("text", None)]
    m = sdk.messages.create(**kw, thinking={"type": "adaptive", "display": "omitted"})
    assert m.content[0].thinking == "" and m.content[0].signature
    n = sdk.messages.count_tokens(model="scripted-model", messages=kw["messages"],
                                  thinking={"type": "adaptive"})
    assert n.input_tokens == 2
    with make_client(reasoning_parser="none") as c:
        sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=c,
                                  max_retries=0)
        kw["messages"] = [{"role": "user", "content": "<script5>"}]
        m = sdk.messages.create(**kw, thinking={"type": "adaptive"})
        assert [(b.type, b.text) for b in m.content] == [("text", "Hello world")]


@pytest.mark.parametrize("script,arguments,input_", [
    ('[TOOL_CALLS]get_time[ARGS] {"a": 1}', ' {"a": 1}', {"a": 1}),  # a space first
    ('[TOOL_CALLS]get_weather[ARGS]{"a": 1, "city": Paris}', '{"a": 1, "city": Paris}',
     {"a": 1}),  # no JSON: the members before the fault
    ("[TOOL_CALLS]get_time[ARGS]now", "now", {}),
])
def test_every_input_json_delta_reads_as_an_object(script, arguments, input_):
    """The anthropic SDK parses a tool_use's accumulated input_json_delta text after each
    delta and raises where it is no JSON object so far: a Mistral call whose arguments
    start with a space, or are no JSON (no grammar kept the model to it), made the SDK's
    stream raise, while the body held the input {}. Now the deltas carry the longest
    prefix that reads as an object (a space waits for the object) and both modes give the
    input that prefix holds; chat keeps the arguments as generated."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from tests.service.scripted_backend import scripted_loader
    cfg = Settings(max_model_len=512, tool_call_parser="mistral")
    with TestClient(create_app(cfg, load_backend=scripted_loader([script]))) as c:
        sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=c,
                                  max_retries=0)
        body = {"model": "scripted-model", **ask(0, tools=TOOLS)}
        del body["temperature"]
        with sdk.messages.stream(**body) as s:
            deltas = [e.partial_json for e in s if e.type == "input_json"]
            streamed = s.get_final_message()
        whole = sdk.messages.create(**body)
        for m in (streamed, whole):
            assert [(b.type, b.input) for b in m.content] == [("tool_use", input_)]
            assert m.stop_reason == "tool_use"
        assert arguments.startswith("".join(deltas)) and (not deltas or deltas[0].strip())
        msg = chat(c, 0, tools=[{"type": "function", "function": {
            "name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS]).json()
        assert msg["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == \
            arguments
