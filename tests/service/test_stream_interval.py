"""vLLM's stream_interval (request field, and the server's --stream-interval default): a
choice's first token goes out at once, then a chunk each time N tokens have gathered,
and the rest when it ends; what the stream adds up to does not change."""

from __future__ import annotations

import pytest

from tests.service.test_api import client, error_of, sse_events

CMPL = {"prompt": "4 5", "max_tokens": 10, "temperature": 0, "ignore_eos": True,
        "stream": True, "return_token_ids": True}


def sizes(events: list[dict], index: int = 0) -> list[int]:
    return [len(e["choices"][0]["token_ids"]) for e in events
            if e["choices"] and e["choices"][0]["index"] == index
            and e["choices"][0]["token_ids"]]


def text(events: list[dict], index: int = 0) -> str:
    return "".join(e["choices"][0].get("text") or e["choices"][0].get("delta", {}).get(
        "content") or "" for e in events if e["choices"] and e["choices"][0]["index"] == index)


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def test_a_request_interval_paces_each_choice(c):
    every = sse_events(c.post("/v1/completions", json=CMPL))
    assert sizes(every) == [1] * 10
    paced = sse_events(c.post("/v1/completions", json={**CMPL, "n": 2, "stream_interval": 4}))
    for i in range(2):
        assert sizes(paced, i) == [1, 4, 4, 1]
        assert text(paced, i) == text(every)
    chat = {"messages": [{"role": "user", "content": "4 5"}], "max_tokens": 7,
            "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    assert sizes(sse_events(c.post("/v1/chat/completions", json={
        **chat, "stream_interval": 3}))) == [1, 3, 3]
    whole = c.post("/v1/chat/completions", json={**chat, "stream": False}).json()
    assert text(sse_events(c.post("/v1/chat/completions", json={
        **chat, "stream_interval": 3}))) == whole["choices"][0]["message"]["content"]


def test_the_server_interval_is_the_default():
    with client(stream_interval=5) as cl:
        assert sizes(sse_events(cl.post("/v1/completions", json=CMPL))) == [1, 5, 4]
        assert sizes(sse_events(cl.post("/v1/completions", json={
            **CMPL, "stream_interval": 1}))) == [1] * 10
        r = cl.post("/v1/completions", json={**CMPL, "stream": False})
        assert len(r.json()["choices"][0]["token_ids"]) == 10


def test_a_bad_interval_is_a_400(c):
    err = error_of(c.post("/v1/completions", json={**CMPL, "stream_interval": 0}), 400)
    assert err["param"] == "stream_interval"


def test_the_server_interval_paces_every_api():
    """--stream-interval paces the translated APIs' streams too (the pacing is the
    submission's, service/generation.py): the Responses stream here, fewer deltas, the
    same text."""
    from tests.service.test_chat_tools_api import make_client
    from tests.service.test_responses_api import ask, events

    def deltas(cl):  # the reasoning's and the message's
        return [e["delta"] for e in events(cl, ask(1)) if e["type"].endswith("text.delta")]

    with make_client() as every, make_client(stream_interval=4) as paced:
        a, b = deltas(every), deltas(paced)
        assert "".join(a) == "".join(b) == "Paris is in FranceHello world"
        assert len(b) < len(a)


def test_paced_greedy_streams_are_the_plain_answer_on_the_demo_model():
    """Through HTTP on a real model: a paced stream (and a paced completion) carries the
    same tokens and text as the plain answer, bit for bit."""
    from fastapi.testclient import TestClient

    from engine.demo_model import ensure_demo_model
    from service.app import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(model=ensure_demo_model(), max_model_len=256,
                                        kv_cache_gib=0.05))) as cl:
        chat = {"messages": [{"role": "user", "content": "Name three colours."}],
                "max_tokens": 24, "temperature": 0, "return_token_ids": True}
        whole = cl.post("/v1/chat/completions", json=chat).json()["choices"][0]
        events = sse_events(cl.post("/v1/chat/completions", json={
            **chat, "stream": True, "stream_interval": 5}))
        ids = [t for e in events if e["choices"] for t in e["choices"][0]["token_ids"]]
        assert ids == whole["token_ids"] and max(sizes(events)) == 5
        assert text(events) == whole["message"]["content"]


@pytest.mark.parametrize("interval", [1, 4])
@pytest.mark.parametrize("echo", [False, True])
def test_streamed_logprobs_offsets_equal_the_whole_answers(c, interval, echo):
    """text_offset runs on from the choice's text already sent: a stream's offsets, however
    its tokens were grouped into chunks, are the whole answer's (they restarted at 0 in
    every chunk)."""
    body = {**CMPL, "logprobs": 1, "echo": echo, "n": 2, "stream_interval": interval}
    whole = c.post("/v1/completions", json={**body, "stream": False}).json()
    events = sse_events(c.post("/v1/completions", json=body))
    for i in range(2):
        got = [o for e in events for ch in e["choices"] if ch["index"] == i
               and ch["logprobs"] for o in ch["logprobs"]["text_offset"]]
        want = whole["choices"][i]["logprobs"]["text_offset"]
        assert got == want and len(set(want)) == len(want), (got, want)
