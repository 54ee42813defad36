"""vLLM's prompt options on /v1/completions, on a tiny checkpoint with a v13 tekken.json
(whose encoder adds <s>): ``add_special_tokens`` (false: the text's ids alone) and
``truncate_prompt_tokens`` (the last N prompt ids; -1: the last max_model_len)."""

from __future__ import annotations

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


@pytest.mark.parametrize("value", [0, -2])
def test_truncate_prompt_tokens_outside_its_range_is_a_400(served, value):
    r = served[0].post("/v1/completions", json={"prompt": TEXT,
                                                "truncate_prompt_tokens": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "truncate_prompt_tokens"
