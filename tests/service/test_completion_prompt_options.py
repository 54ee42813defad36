"""vLLM's prompt and logprob options on /v1/completions and /v1/chat/completions, on a
tiny checkpoint with a v13 tekken.json (whose encoder adds <s>): ``add_special_tokens``
(false: the text's ids alone), ``truncate_prompt_tokens`` (the last N prompt ids; -1: the
last max_model_len) and ``return_tokens_as_token_ids`` (logprobs name tokens
"token_id:<id>")."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings

TEXT = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    model = tiny_checkpoint(tokenizer="tekken")
    with TestClient(create_app(Settings(model=model, max_model_len=128,
                                        kv_cache_gib=0.02))) as c:
        yield c, Tokenizer.from_dir(model)


def complete(c, **kw):
    body = {"prompt": TEXT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, **kw}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_add_special_tokens_false_leaves_out_bos(served):
    c, tok = served
    with_bos, without = tok.encode(TEXT), tok.encode(TEXT, add_special_tokens=False)
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == without
    assert complete(c)["usage"]["prompt_tokens"] == len(with_bos)
    plain = complete(c, add_special_tokens=False)
    assert plain["usage"]["prompt_tokens"] == len(without)
    # the answer is the one the same ids get when sent as ids
    assert plain["choices"][0]["text"] == complete(c, prompt=without)["choices"][0]["text"]


def test_truncate_prompt_tokens_keeps_the_last_ids(served):
    c, tok = served
    ids = tok.encode(TEXT)
    got = complete(c, truncate_prompt_tokens=4, echo=True)
    assert got["usage"]["prompt_tokens"] == 4
    kept = tok.decode(ids[-4:], skip_special_tokens=False)
    assert got["choices"][0]["text"].startswith(kept)  # echo shows what was kept
    assert got["choices"][0]["text"][len(kept):] == complete(
        c, prompt=ids[-4:])["choices"][0]["text"]
    # a bound the prompt does not reach changes nothing, echo included
    loose = complete(c, truncate_prompt_tokens=-1, echo=True)
    assert loose["choices"][0]["text"].startswith(TEXT)
    assert loose["usage"]["prompt_tokens"] == len(ids)
    assert complete(c, prompt=[ids, ids[:3]], truncate_prompt_tokens=2)[
        "usage"]["prompt_tokens"] == 4


def chat(c, **kw):
    body = {"messages": [{"role": "user", "content": TEXT}], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, **kw}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_truncate_prompt_tokens_keeps_the_rendered_prompts_last_ids(served):
    c, _ = served
    whole = chat(c)["prompt_token_ids"]
    assert len(whole) > 6
    got = chat(c, truncate_prompt_tokens=5)
    assert got["prompt_token_ids"] == whole[-5:]
    assert got["usage"]["prompt_tokens"] == 5
    # the answer is the one the kept ids get as a completion prompt
    assert got["choices"][0]["token_ids"] == complete(
        c, prompt=whole[-5:], return_token_ids=True)["choices"][0]["token_ids"]
    assert chat(c, truncate_prompt_tokens=-1)["prompt_token_ids"] == whole


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value", [0, -2])
def test_truncate_prompt_tokens_outside_its_range_is_a_400(served, route, value):
    body = ({"prompt": TEXT} if route == "/v1/completions"
            else {"messages": [{"role": "user", "content": TEXT}]})
    r = served[0].post(route, json={**body, "truncate_prompt_tokens": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "truncate_prompt_tokens"


def named(ids):
    return [f"token_id:{i}" for i in ids]


def test_completion_logprobs_name_tokens_by_id(served):
    c, _ = served
    kw = {"logprobs": 2, "echo": True, "return_token_ids": True, "prompt_logprobs": 1}
    plain = complete(c, **kw)["choices"][0]
    by_id = complete(c, return_tokens_as_token_ids=True, **kw)["choices"][0]
    assert by_id["text"] == plain["text"]
    lp, base = by_id["logprobs"], plain["logprobs"]
    assert lp["tokens"] == named(by_id["prompt_token_ids"] + by_id["token_ids"])
    assert lp["tokens"] != base["tokens"]
    assert lp["token_logprobs"] == base["token_logprobs"]
    # text_offset still indexes the text
    assert lp["text_offset"] == base["text_offset"]
    for got, want in zip(lp["top_logprobs"][1:], base["top_logprobs"][1:], strict=True):
        assert all(k.startswith("token_id:") for k in got)
        assert sorted(got.values()) == sorted(want.values())
    # prompt_logprobs keep each token's decoded text
    assert by_id["prompt_logprobs"] == plain["prompt_logprobs"]
    streamed = c.post("/v1/completions", json={
        "prompt": TEXT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "logprobs": 0, "return_tokens_as_token_ids": True, "stream": True})
    tokens = [t for line in streamed.text.splitlines()
              if line.startswith("data: {")
              for t in json.loads(line[6:])["choices"][0]["logprobs"]["tokens"]]
    assert tokens == named(by_id["token_ids"])


def test_chat_logprobs_name_tokens_by_id(served):
    c, tok = served
    plain = chat(c, logprobs=True, top_logprobs=2)["choices"][0]
    by_id = chat(c, logprobs=True, top_logprobs=2,
                 return_tokens_as_token_ids=True)["choices"][0]
    content = by_id["logprobs"]["content"]
    assert [e["token"] for e in content] == named(by_id["token_ids"])
    for e, base in zip(content, plain["logprobs"]["content"], strict=True):
        assert e["bytes"] == list(e["token"].encode())  # the name's bytes, as vLLM's
        assert e["logprob"] == base["logprob"]
        # the same alternatives, each named by the id whose text the plain answer shows
        ids = [int(t["token"].removeprefix("token_id:")) for t in e["top_logprobs"]]
        assert [tok.token_to_text(i) for i in ids] == [
            t["token"] for t in base["top_logprobs"]]
    assert by_id["message"] == plain["message"]
