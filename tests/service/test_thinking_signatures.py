"""Signed thinking blocks on /v1/messages (service/translate/signature.py), through the
official anthropic client and its stream helpers: a block comes back with a signature (the
non-streaming block's, and a signature_delta right before the block's stop in streams), the
client's own history with it is accepted, an edited or foreign one is a 400 naming the
field; unsigned blocks are accepted; a configured key keeps signatures across servers."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.service.test_chat_tools_api import make_client

MODEL = "scripted-model"
THINKING = [{"role": "user", "content": "<script1>"}]  # [THINK]Paris is in France[/THINK]..


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def _sdk(client) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client,
                               max_retries=0)


def _next_turn(blocks: list) -> list[dict]:
    """The conversation continued: the model's blocks as the assistant turn."""
    return [*THINKING, {"role": "assistant", "content": blocks},
            {"role": "user", "content": "<script3>"}]


def test_stream_helpers_carry_the_signature_of_the_thinking_block(client):
    sdk = _sdk(client)
    m = sdk.messages.create(model=MODEL, max_tokens=100, messages=THINKING)
    assert m.content[0].type == "thinking" and m.content[0].signature
    with sdk.messages.stream(model=MODEL, max_tokens=100, messages=THINKING) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s]
        final = s.get_final_message()
    # the signature arrives last in the block, right before its content_block_stop (the
    # helper follows each signature_delta with its own "signature" event)
    stop = kinds.index(("content_block_stop", None))
    assert kinds[stop - 2:stop] == [("content_block_delta", "signature_delta"),
                                    ("signature", None)]
    assert [k for k in kinds if k[1] == "signature_delta"] == [kinds[stop - 2]]
    assert final.content[0].signature == m.content[0].signature
    assert final.content[0].thinking == "Paris is in France"


def test_the_clients_own_history_verifies_and_an_edited_block_is_a_400(client):
    sdk = _sdk(client)
    with sdk.messages.stream(model=MODEL, max_tokens=100, messages=THINKING) as s:
        final = s.get_final_message()
    blocks = [b.model_dump() for b in final.content]
    again = sdk.messages.create(model=MODEL, max_tokens=100, messages=_next_turn(blocks))
    assert again.content[0].text.startswith("Hello world")  # script 3 ran
    edited = [{**blocks[0], "thinking": "Paris is in Spain"}, blocks[1]]
    for body in (_next_turn(edited),
                 _next_turn([{**blocks[0], "signature": "bm90IG91cnM="}, blocks[1]])):
        with pytest.raises(anthropic.BadRequestError) as exc:
            sdk.messages.create(model=MODEL, max_tokens=100, messages=body)
        assert "messages.1.content.0.signature" in str(exc.value)
        with pytest.raises(anthropic.BadRequestError):
            sdk.messages.count_tokens(model=MODEL, messages=body)


def test_unsigned_blocks_are_accepted(client):
    for block in ({"type": "thinking", "thinking": "from elsewhere", "signature": ""},
                  {"type": "thinking", "thinking": "from elsewhere"}):
        r = client.post("/v1/messages", json={"max_tokens": 50, "messages": _next_turn(
            [block, {"type": "text", "text": "ok"}])})
        assert r.status_code == 200, r.text


def test_a_configured_key_signs_alike_across_servers_and_a_random_one_does_not(client):
    key = "a-key-of-sixteen-chars"
    made = []
    for settings in ({"thinking_signature_key": key}, {"thinking_signature_key": key}, {}):
        with make_client(**settings) as c:
            made.append(_sdk(c).messages.create(model=MODEL, max_tokens=100,
                                                messages=THINKING).content[0].signature)
    assert made[0] == made[1] != made[2]
    with make_client(thinking_signature_key=key) as c:  # a restart with the same key
        block = {"type": "thinking", "thinking": "Paris is in France", "signature": made[0]}
        r = c.post("/v1/messages", json={"max_tokens": 50, "messages": _next_turn(
            [block, {"type": "text", "text": "Hello world"}])})
        assert r.status_code == 200, r.text
    r = client.post("/v1/messages", json={"max_tokens": 50, "messages": _next_turn(
        [block, {"type": "text", "text": "Hello world"}])})  # another key: not ours
    assert r.status_code == 400 and "signature" in r.json()["error"]["message"]


def test_a_short_key_is_refused_at_startup():
    with pytest.raises(ValueError, match="16 characters"):
        make_client(thinking_signature_key="short")


def test_any_json_string_is_checked_without_failing(client):
    for thinking, signature in (("é \ud800", "é"), ("x", "\ud800"), ("\U0001f600", "===")):
        block = {"type": "thinking", "thinking": thinking, "signature": signature}
        body = {"max_tokens": 5, "messages": _next_turn([block, {"type": "text", "text": "ok"}])}
        r = client.post("/v1/messages", content=json.dumps(body),  # \ud800 escaped as JSON has it
                        headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_display_omitted_returns_signed_empty_thinking_blocks(client):
    """thinking.display "omitted": the thinking block comes without its text (no
    thinking_delta in a stream) but with a signature, and goes back into the history."""
    sdk = _sdk(client)
    shown = sdk.messages.create(model=MODEL, max_tokens=100, messages=THINKING)
    kw = {"model": MODEL, "max_tokens": 100, "messages": THINKING,
          "thinking": {"type": "enabled", "budget_tokens": 50, "display": "omitted"}}
    m = sdk.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "" and m.content[0].signature
    assert m.content[1].text == shown.content[1].text
    assert m.usage.output_tokens == shown.usage.output_tokens  # the thinking was generated
    with sdk.messages.stream(**kw) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "thinking_delta" not in deltas and "signature_delta" in deltas
    assert final.model_dump() == {**m.model_dump(), "id": final.id}
    again = sdk.messages.create(model=MODEL, max_tokens=100, messages=_next_turn(
        [b.model_dump() for b in m.content]))
    assert again.content[0].text.startswith("Hello world")
    summarized = {**kw["thinking"], "display": "summarized"}
    m = sdk.messages.create(**{**kw, "thinking": summarized})
    assert m.content[0].thinking == shown.content[0].thinking


def test_an_empty_key_from_the_environment_is_no_key(monkeypatch):
    """compose passes ${FP8SERVE_THINKING_SIGNATURE_KEY:-}: empty when the shell sets none,
    which starts with a random key as without the variable."""
    from service.settings import Settings

    monkeypatch.setenv("FP8SERVE_THINKING_SIGNATURE_KEY", "")
    assert Settings().thinking_signature_key is None
    monkeypatch.setenv("FP8SERVE_THINKING_SIGNATURE_KEY", "a-key-of-sixteen-chars")
    assert Settings().thinking_signature_key.get_secret_value() == "a-key-of-sixteen-chars"
