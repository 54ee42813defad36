"""Parallel calls in streams, on the scripted model (tests/service/scripted_backend.py):
reasoning, text, then two Mistral calls whose arguments nest and escape, streamed a token
at a time. Each API's events must name every call the same way from its first event to
its last, and rebuild the non-streamed answer."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.scripted_backend import scripted_loader

ARGS = '{"city": "Pa\\"ris", "at": {"days": [1, {"x": null}]}}'
SCRIPT = f"[THINK]hm[/THINK]Hi [TOOL_CALLS]get_weather[ARGS]{ARGS}[TOOL_CALLS]get_time[ARGS]{{}}"
CALLS = [("get_weather", ARGS), ("get_time", "{}")]
NAMES = ("get_weather", "get_time")


@pytest.fixture(scope="module")
def client():
    cfg = Settings(max_model_len=512, tool_call_parser="mistral", reasoning_parser="mistral")
    with TestClient(create_app(cfg, load_backend=scripted_loader([SCRIPT]))) as c:
        yield c


def sse(text: str) -> list[dict]:
    return [json.loads(ln[6:]) for ln in text.splitlines()
            if ln.startswith("data: ") and ln != "data: [DONE]"]


def test_chat_call_deltas(client):
    body = {"messages": [{"role": "user", "content": "<script0>"}], "n": 2, "tools": [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in NAMES]}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"]
    chunks = sse(client.post("/v1/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}).text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    for i in range(2):
        calls: dict[int, dict] = {}
        for d in (ch["delta"] for c in chunks for ch in c["choices"] if ch["index"] == i):
            for t in d.get("tool_calls", ()):
                if "id" in t:  # the first delta: index, id, type, name, arguments
                    assert t["index"] == len(calls) and t["type"] == "function"
                    calls[t["index"]] = {"id": t["id"], "name": t["function"]["name"],
                                         "arguments": t["function"]["arguments"]}
                else:
                    assert set(t) == {"index", "function"}
                    calls[t["index"]]["arguments"] += t["function"]["arguments"]
        assert [(c["name"], c["arguments"]) for c in calls.values()] == CALLS
        assert len({c["id"] for c in calls.values()}) == 2
        msg = whole[i]["message"]
        assert [(t["function"]["name"], t["function"]["arguments"])
                for t in msg["tool_calls"]] == CALLS
        assert (msg["content"], msg["reasoning_content"]) == ("Hi ", "hm")


def test_responses_call_events(client):
    body = {"input": "<script0>", "tools": [
        {"type": "function", "name": n, "parameters": {"type": "object"}} for n in NAMES]}
    evs = sse(client.post("/v1/responses", json={**body, "stream": True}).text)
    added = {e["output_index"]: e["item"] for e in evs
             if e["type"] == "response.output_item.added"}
    assert [i["type"] for i in added.values()] == [
        "reasoning", "message", "function_call", "function_call"]
    args: dict[int, str] = {}
    for e in evs:
        if "item_id" in e:
            assert e["item_id"] == added[e["output_index"]]["id"], e
        if e["type"] == "response.function_call_arguments.delta":
            args[e["output_index"]] = args.get(e["output_index"], "") + e["delta"]
        if e["type"] == "response.function_call_arguments.done":
            assert e["arguments"] == args[e["output_index"]]
        if e["type"] == "response.output_item.done":
            assert e["item"]["id"] == added[e["output_index"]]["id"]
    final = evs[-1]["response"]["output"]
    assert [(o["name"], o["arguments"]) for o in final[2:]] == CALLS == [
        (added[k]["name"], args[k]) for k in (2, 3)]
    assert len({o["call_id"] for o in final[2:]}) == 2
    whole = client.post("/v1/responses", json=body).json()["output"]
    drop = ("id", "call_id")
    assert [{k: v for k, v in o.items() if k not in drop} for o in whole] == [
        {k: v for k, v in o.items() if k not in drop} for o in final]


def test_messages_call_blocks(client):
    body = {"max_tokens": 200, "messages": [{"role": "user", "content": "<script0>"}],
            "tools": [{"name": n, "input_schema": {"type": "object"}} for n in NAMES]}
    evs = sse(client.post("/v1/messages", json={**body, "stream": True}).text)
    starts = [e for e in evs if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [
        (0, "thinking"), (1, "text"), (2, "tool_use"), (3, "tool_use")]
    assert [e["index"] for e in evs if e["type"] == "content_block_stop"] == [0, 1, 2, 3]
    json_text: dict[int, str] = {}
    open_block = None  # every delta goes to the block open at that point
    for e in evs:
        if e["type"] in ("content_block_start", "content_block_stop"):
            open_block = e["index"] if e["type"] == "content_block_start" else None
        if e["type"] == "content_block_delta":
            assert e["index"] == open_block, e
            if e["delta"]["type"] == "input_json_delta":
                json_text[e["index"]] = json_text.get(e["index"], "") + \
                    e["delta"]["partial_json"]
    assert json_text == {2: ARGS, 3: "{}"}
    whole = client.post("/v1/messages", json=body).json()["content"]
    assert [(b["name"], b["input"]) for b in whole[2:]] == [
        (n, json.loads(a)) for n, a in CALLS]
    assert len({b["id"] for b in whole[2:]}) == len({s["content_block"]["id"]
                                                     for s in starts[2:]}) == 2
