"""/v1/messages as coding agents drive it (Claude Code, the Claude Agent SDK, the anthropic
SDK with ANTHROPIC_BASE_URL here): their request bodies and headers, on the scripted model
(tests/service/scripted_backend.py)."""

from __future__ import annotations

import anthropic
import pytest

from tests.service.test_chat_tools_api import make_client
from tests.service.test_messages_api import events

ASK = [{"role": "user", "content": "<script5>"}]  # "Hello world": 2 tokens, then </s>


@pytest.fixture(scope="module")
def small():
    """A window of 3 tokens: the 2-token prompt leaves room for 1."""
    with make_client(max_model_len=3) as c:
        yield c


def test_max_tokens_past_the_window_stops_at_the_window(small):
    """Claude Code asks for max_tokens 32000 (64000 with a larger model) whatever the
    server's window; a prompt that fits with room to generate was a 400 ("prompt + max_tokens
    exceeds max_model_len"), so no turn could run. Anthropic serves it: the answer stops at
    the window, stop_reason model_context_window_exceeded. max_tokens reached first is still
    max_tokens, and a prompt with no room is still a 400."""
    for max_tokens in (32000, 64000):
        r = small.post("/v1/messages", json={"max_tokens": max_tokens, "messages": ASK})
        assert r.status_code == 200, r.text
        m = r.json()
        assert m["content"] == [{"type": "text", "text": "Hello"}]
        assert m["stop_reason"] == "model_context_window_exceeded"
        assert m["usage"]["output_tokens"] == 1
    evs = events(small, {"max_tokens": 32000, "messages": ASK})
    delta = next(d for name, d in evs if name == "message_delta")
    assert delta["delta"]["stop_reason"] == "model_context_window_exceeded"
    r = small.post("/v1/messages", json={"max_tokens": 1, "messages": ASK})
    assert r.json()["stop_reason"] == "max_tokens"
    r = small.post("/v1/messages", json={"max_tokens": 32000, "messages": [
        {"role": "user", "content": "<script5>abc"}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("messages: prompt (5 tokens) leaves no room")
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=small,
                              max_retries=0)
    with sdk.messages.stream(model="scripted-model", max_tokens=32000, messages=ASK) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.content[0].text) == ("model_context_window_exceeded",
                                                          "Hello")


def test_a_key_in_either_header_is_accepted():
    """A client may send x-api-key and Authorization: Bearer both, one of them a token for
    another service (Claude Code with ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN both set);
    only the bearer was read, so the server's key in x-api-key beside another bearer was a
    401. Now either header's key passes; neither is still a 401."""
    with make_client(api_keys=("sekrit",)) as c:
        body = {"model": "scripted-model", "max_tokens": 20, "messages": ASK}
        for key, token in (("sekrit", "oauth-token"), ("other", "sekrit"), ("sekrit", ""),
                           ("", "sekrit")):
            headers = {"x-api-key": key, "authorization": f"Bearer {token}"}
            r = c.post("/v1/messages", json=body, headers=headers)
            assert r.status_code == 200, (headers, r.text)
            r = c.post("/v1/messages/count_tokens", json={"messages": ASK}, headers=headers)
            assert r.json() == {"input_tokens": 2}
        r = c.post("/v1/messages", json=body,
                   headers={"x-api-key": "other", "authorization": "Bearer oauth-token"})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
