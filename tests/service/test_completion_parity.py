"""/v1/completions as OpenAI's API and SDK and vLLM's clients read it (fake model: it
predicts (sum + len) % 50): ``max_tokens: 0`` with ``echo`` answers with the prompt alone
and its logprobs (OpenAI's and vLLM's prompt scoring), whole and streamed; the SDK parses
batched prompts whole and streamed; every body carries system_fingerprint, and with
include_usage every chunk a usage field."""

from __future__ import annotations

import openai
import pytest

from tests.service.test_api import client, sse_events

PROMPTS = ["2 3 5", "4 1"]
LOGPROB_FIELDS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def post(c, **body):
    r = c.post("/v1/completions", json={"temperature": 0, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_max_tokens_0_with_echo_answers_the_prompt_and_its_logprobs(c):
    scored = post(c, prompt=PROMPTS, echo=True, logprobs=2, max_tokens=0, n=2)
    longer = post(c, prompt=PROMPTS, echo=True, logprobs=2, max_tokens=3, n=2)
    assert scored["usage"] == {**longer["usage"], "completion_tokens": 0,
                               "total_tokens": longer["usage"]["prompt_tokens"]}
    for i, (got, more) in enumerate(zip(scored["choices"], longer["choices"], strict=True)):
        assert got["index"] == i and got["text"] == PROMPTS[i // 2]
        assert got["finish_reason"] == "length" and got["stop_reason"] is None
        lps = got["logprobs"]
        # the prompt's entries only, as the answer that goes on has them (the first null)
        assert lps == {f: more["logprobs"][f][:3 if i < 2 else 2] for f in LOGPROB_FIELDS}
        assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    plain = post(c, prompt=PROMPTS[0], echo=True, max_tokens=0, return_token_ids=True)
    assert plain["choices"][0]["text"] == PROMPTS[0]
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["token_ids"] == []


@pytest.mark.parametrize("logprobs", [None, 1])
def test_max_tokens_0_with_echo_streams_the_prompt_alone(c, logprobs):
    whole = post(c, prompt=PROMPTS, echo=True, logprobs=logprobs, max_tokens=0)
    events = sse_events(c.post("/v1/completions", json={
        "prompt": PROMPTS, "echo": True, "logprobs": logprobs, "max_tokens": 0,
        "stream": True, "stream_options": {"include_usage": True,
                                           "continuous_usage_stats": True}}))
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]
    for i, want in enumerate(whole["choices"]):
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert "".join(m["text"] for m in mine) == want["text"] == PROMPTS[i]
        assert [m["finish_reason"] for m in mine][-1] == "length"
        if logprobs is not None:
            assert [m["logprobs"] for m in mine if m["logprobs"]["tokens"]] == [
                want["logprobs"]]
    assert all(e["usage"]["completion_tokens"] == 0 for e in events)


@pytest.mark.parametrize("body,param,words", [
    ({}, "max_tokens", "needs echo"),
    ({"echo": True, "min_tokens": 1}, "min_tokens", "exceeds max_tokens 0"),
])
def test_max_tokens_0_without_echo_or_with_min_tokens_is_a_400(c, body, param, words):
    r = c.post("/v1/completions", json={"prompt": "2 3", "max_tokens": 0, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert words in r.json()["error"]["message"]


def sdk(c):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                         max_retries=0)


def test_the_sdk_reads_batched_prompts_whole_and_streamed(c):
    kw = {"model": "fake-model", "prompt": PROMPTS, "n": 2, "max_tokens": 3,
          "temperature": 0, "echo": True, "logprobs": 1,
          "extra_body": {"ignore_eos": True}}
    whole = sdk(c).completions.create(**kw)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert [ch.index for ch in whole.choices] == [0, 1, 2, 3]
    assert [ch.text[:len(PROMPTS[ch.index // 2])] for ch in whole.choices] == [
        p for p in PROMPTS for _ in range(2)]
    assert whole.usage.prompt_tokens == 5 and whole.usage.completion_tokens == 12
    texts, offsets = [""] * 4, [[] for _ in range(4)]
    usage = None
    for chunk in sdk(c).completions.create(**kw, stream=True,
                                           stream_options={"include_usage": True}):
        assert chunk.id.startswith("cmpl-") and chunk.object == "text_completion"
        if not chunk.choices:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        texts[choice.index] += choice.text
        offsets[choice.index] += choice.logprobs.text_offset
    assert texts == [ch.text for ch in whole.choices]
    assert offsets == [ch.logprobs.text_offset for ch in whole.choices]
    assert usage == whole.usage


def fingerprints(c, path, **body):
    whole = c.post(path, json={"max_tokens": 2, **body}).json()
    events = sse_events(c.post(path, json={
        "max_tokens": 2, **body, "stream": True, "stream_options": {"include_usage": True}}))
    return {whole["system_fingerprint"]} | {e["system_fingerprint"] for e in events}


def test_every_body_carries_the_servers_system_fingerprint(c):
    """OpenAI's system_fingerprint: one value for the server's setup, on whole answers and
    on every chunk of both routes; another setup (the logprobs mode, a kernel override)
    has another."""
    mine = fingerprints(c, "/v1/completions", prompt=PROMPTS) | fingerprints(
        c, "/v1/chat/completions", messages=[{"role": "user", "content": "3"}])
    assert len(mine) == 1 and next(iter(mine)).startswith("fp_")
    with client(logprobs_mode="raw_logprobs") as other:
        theirs = fingerprints(other, "/v1/completions", prompt=PROMPTS)
    assert len(theirs) == 1 and theirs != mine
    with client(kernel="torch_w8a16") as forced:
        assert fingerprints(forced, "/v1/completions", prompt=PROMPTS) not in (mine, theirs)
    assert sdk(c).completions.create(model="fake-model", prompt="2", max_tokens=1
                                     ).system_fingerprint in mine


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPTS, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "3"}], "n": 2}),
])
def test_with_include_usage_every_chunk_has_usage_null_but_the_last(c, path, body):
    """OpenAI's stream_options.include_usage: "All other chunks will also include a usage
    field, but with a null value" (vLLM's chunks too); without it, chunks have none."""
    events = sse_events(c.post(path, json={**body, "max_tokens": 3, "stream": True,
                                           "stream_options": {"include_usage": True}}))
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["usage"]["completion_tokens"] > 0
    bare = sse_events(c.post(path, json={**body, "max_tokens": 3, "stream": True}))
    assert all("usage" not in e for e in bare)


@pytest.mark.parametrize("prompt,words", [
    ([[4, 9], 3], "item 1 is a token id where item 0 is a list"),
    (["2 3", 5], "item 1 is a token id where item 0 is a string"),
    ([7, "2"], "item 1 is a string where item 0 is a token id"),
    ([1.5], "item 0 is a number"),
    ([None], "item 0 is null"),
    ({"text": "2"}, "got an object"),
])
def test_a_prompt_of_no_one_form_is_a_400_saying_which_item(c, prompt, words):
    """A prompt mixing OpenAI's forms (or of none) is a 400 naming the item that breaks
    it; it said "Input should be a valid string" of a token id or a list."""
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt" and words in error["message"]
    assert "a list of token-id lists" in error["message"]


def test_the_fingerprint_tells_rows_by_role_apart():
    """On an AMX host a server that decodes generated rows on AVX-512 (--rows-by-role on)
    answers with other bits than one that runs every row on the tiles: another
    system_fingerprint."""
    from types import SimpleNamespace

    from service.fingerprint import system_fingerprint
    from service.settings import Settings
    from tests.ext.support import AMX_HOST, fake_hw

    def fp(split: bool) -> str:
        backend = SimpleNamespace(model_name="m", hardware=fake_hw(*AMX_HOST, amx=True),
                                  runner=SimpleNamespace(rows_by_role=split))
        return system_fingerprint(SimpleNamespace(settings=Settings(), backend=backend))

    assert fp(True) != fp(False) and fp(True) == fp(True)
