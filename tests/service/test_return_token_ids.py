"""vLLM's ``return_token_ids`` on /v1/completions and /v1/chat/completions (fake model:
greedy ids are known): the prompt's ids and each choice's generated ids, whole in an
answer and split over a stream's chunks (the joined chunks equal the whole)."""

from __future__ import annotations

import pytest

from tests.engine.fake_runner import expected_tokens
from tests.service.test_api import client, sse_events

BASE = {"max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
MSGS = [{"role": "user", "content": "3 4"}]


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def test_completions_carry_prompt_and_output_ids(c):
    r = c.post("/v1/completions", json={**BASE, "prompt": ["3 4", "7"], "n": 2}).json()
    got = sorted(r["choices"], key=lambda ch: ch["index"])
    assert [ch["prompt_token_ids"] for ch in got] == [[3, 4], [3, 4], [7], [7]]
    assert [ch["token_ids"] for ch in got] == [expected_tokens([3, 4], 5)] * 2 + [
        expected_tokens([7], 5)] * 2
    plain = c.post("/v1/completions", json={**BASE, "prompt": "3 4",
                                            "return_token_ids": False}).json()
    assert "token_ids" not in plain["choices"][0]  # only when asked


@pytest.mark.parametrize("echo", [False, True])
def test_a_completions_stream_splits_the_ids_over_its_chunks(c, echo):
    events = sse_events(c.post("/v1/completions", json={
        **BASE, "prompt": "3 4", "stream": True, "echo": echo}))
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [ch["prompt_token_ids"] for ch in choices if "prompt_token_ids" in ch] == [[3, 4]]
    assert "prompt_token_ids" in choices[0]
    assert sum((ch["token_ids"] for ch in choices), []) == expected_tokens([3, 4], 5)


def test_chat_carries_prompt_and_output_ids(c):
    r = c.post("/v1/chat/completions", json={**BASE, "messages": MSGS, "n": 2}).json()
    prompt = [1, 3, 4]  # the fake chat encoding: 1, then the words
    assert r["prompt_token_ids"] == prompt
    assert [ch["token_ids"] for ch in r["choices"]] == [expected_tokens(prompt, 5)] * 2
    events = sse_events(c.post("/v1/chat/completions", json={
        **BASE, "messages": MSGS, "stream": True}))
    assert events[0]["prompt_token_ids"] == prompt
    ids = sum((e["choices"][0].get("token_ids", []) for e in events if e["choices"]), [])
    assert ids == expected_tokens(prompt, 5)
