"""vLLM's /tokenize and /detokenize on the demo model: a chat request's messages count as
many tokens as that chat request reports as prompt_tokens (plain, a system prompt, text
parts, tools, a whole tool turn), the chat options are refused beside a text prompt
(they were ignored), and /detokenize refuses ids outside the vocabulary."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

TOOL = {"type": "function", "function": {"name": "capital", "description": "a capital",
                                         "parameters": {"type": "object", "properties": {
                                             "country": {"type": "string"}}}}}
ASK = {"role": "user", "content": "What is the capital of France?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "capital", "arguments": '{"country": "France"}'}}]}
ANSWER = {"role": "tool", "tool_call_id": "call_1", "content": "Paris"}


@pytest.fixture(scope="module")
def c():
    with TestClient(create_app(Settings(model=ensure_demo_model(), max_model_len=1024,
                                        kv_cache_gib=0.1))) as client:
        yield client


@pytest.mark.parametrize("body", [
    {"messages": [ASK]},
    {"messages": [{"role": "system", "content": "Be short."}, ASK]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}]},
    {"messages": [ASK], "tools": [TOOL]},
    {"messages": [ASK, CALL, ANSWER], "tools": [TOOL]},
    {"messages": [ASK, CALL, ANSWER], "tools": [TOOL], "add_special_tokens": True},
], ids=["plain", "system", "parts", "tools", "tool-turn", "special-tokens"])
def test_the_count_is_the_chat_requests_prompt_tokens(c, body):
    counted = c.post("/tokenize", json=body)
    assert counted.status_code == 200, counted.text
    got = counted.json()
    assert got["count"] == len(got["tokens"]) > 0 and got["max_model_len"] == 1024
    r = c.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == got["count"]


@pytest.mark.parametrize("name,value", [
    ("tools", [TOOL]), ("add_generation_prompt", False), ("continue_final_message", True),
    ("chat_template_kwargs", {"enable_thinking": False}),
    ("chat_template", "{{ messages }}")])
def test_chat_options_beside_a_text_prompt_are_refused(c, name, value):
    """They render messages: beside a prompt they changed nothing, and were answered 200
    with the prompt's tokens alone."""
    r = c.post("/tokenize", json={"prompt": "Paris", name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name and "messages" in r.json()["error"]["message"]


def test_a_text_prompt_takes_its_own_options(c):
    """Its options, and a chat option at its default or null, are served."""
    plain = c.post("/tokenize", json={"prompt": "Paris", "add_special_tokens": False})
    assert plain.status_code == 200, plain.text
    for extra in ({"add_generation_prompt": True}, {"tools": None},
                  {"continue_final_message": False}):
        r = c.post("/tokenize", json={"prompt": "Paris", "add_special_tokens": False,
                                      **extra})
        assert r.status_code == 200 and r.json()["tokens"] == plain.json()["tokens"], r.text
    assert c.post("/tokenize", json={"prompt": ""}).json()["count"] == 0


def test_detokenize_refuses_ids_outside_the_vocabulary(c):
    vocab = 49152
    assert c.post("/detokenize", json={"tokens": [vocab - 1]}).status_code == 200
    for ids in ([vocab], [2**63], [2**64 + 1], [-1]):
        r = c.post("/detokenize", json={"tokens": ids})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("tokens"), ids
    assert c.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}
