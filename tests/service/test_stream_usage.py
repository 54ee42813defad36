"""vLLM's stream_options.continuous_usage_stats: with include_usage, every chunk carries the
usage so far: the prompt's tokens and its own choice's tokens generated up to that chunk
(counted against the token ids the chunks carry), and the closing usage chunk stays."""

from __future__ import annotations

import pytest

from tests.service.test_api import client, error_of, sse_events

CONTINUOUS = {"stream": True, "return_token_ids": True,
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def check_running_counts(events: list[dict], prompt_len) -> dict[int, int]:
    """Each choice's tokens at its last chunk; asserts every chunk's usage is the running
    count of the ids its choice's chunks carried."""
    seen: dict[int, int] = {}
    for e in events[:-1]:
        (choice,) = e["choices"]
        i = choice["index"]
        seen[i] = seen.get(i, 0) + len(choice.get("token_ids") or ())
        u = e["usage"]
        assert u["prompt_tokens"] == prompt_len(i), e
        assert u["completion_tokens"] == seen[i] and u["total_tokens"] == (
            u["prompt_tokens"] + u["completion_tokens"]), e
    assert events[-1]["choices"] == []  # the closing usage chunk, totals of all choices
    assert events[-1]["usage"]["completion_tokens"] == sum(seen.values())
    return seen


def test_completions_report_each_choices_running_usage(c):
    body = {"prompt": ["2 3", "4"], "n": 2, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}
    events = sse_events(c.post("/v1/completions", json={**body, **CONTINUOUS}))
    lens = [len(c.post("/tokenize", json={"prompt": p}).json()["tokens"])
            for p in body["prompt"]]
    seen = check_running_counts(events, lambda i: lens[i // 2])
    assert seen == {i: 5 for i in range(4)}
    assert events[-1]["usage"]["prompt_tokens"] == sum(lens)


def test_chat_reports_each_choices_running_usage(c):
    body = {"messages": [{"role": "user", "content": "5 6"}], "n": 2, "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    whole = c.post("/v1/chat/completions", json=body).json()
    events = sse_events(c.post("/v1/chat/completions", json={**body, **CONTINUOUS}))
    first = [e for e in events if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert len(first) == 2 and all(e["usage"]["completion_tokens"] == 0 for e in first)
    prompt = whole["usage"]["prompt_tokens"]
    seen = check_running_counts(events, lambda i: prompt)
    assert sum(seen.values()) == whole["usage"]["completion_tokens"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "2"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "2"}]})])
def test_continuous_usage_needs_include_usage(c, path, body):
    err = error_of(c.post(path, json={**body, "stream": True, "stream_options": {
        "continuous_usage_stats": True}}), 400)
    assert err["param"] == "stream_options.continuous_usage_stats", err
    assert "include_usage" in err["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "2"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "2"}]})])
@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_need_stream(c, path, body, stream):
    """OpenAI's and vLLM's rule: stream_options without stream true is a 400 naming it,
    not options silently dropped."""
    extra = {} if stream is None else {"stream": stream}
    err = error_of(c.post(path, json={**body, **extra, "stream_options": {
        "include_usage": True}}), 400)
    assert err["param"] == "stream_options", err
    assert "stream is true" in err["message"]


def test_chunks_held_back_are_counted_on_the_next_one_sent():
    """Tool-call names and reasoning markers are held back until they are whole: their
    tokens show in the usage of the next chunk that goes out, as their ids do."""
    from tests.service.test_chat_tools_api import TOOLS, make_client
    with make_client() as sc:
        for script, extra in ((0, {"tools": TOOLS}), (1, {})):
            body = {"messages": [{"role": "user", "content": f"<script{script}>"}],
                    "max_tokens": 200, "temperature": 0, **extra}
            whole = sc.post("/v1/chat/completions", json=body).json()["usage"]
            events = sse_events(sc.post("/v1/chat/completions", json={**body, **CONTINUOUS}))
            assert len(events) - 2 < whole["completion_tokens"]  # some were held back
            prompt = whole["prompt_tokens"]
            seen = check_running_counts(events, lambda i, p=prompt: p)
            assert seen == {0: whole["completion_tokens"]}
