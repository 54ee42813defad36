"""vLLM's token filters on /v1/completions and /v1/chat/completions (fake model: greedy
after [2, 3] gives 7, 15, 31, 13, ...; each word of a text is one token):
``allowed_token_ids`` (only those ids are sampled) and ``bad_words`` (a word's last token
is never sampled where it would complete the word)."""

from __future__ import annotations

import pytest

from engine.sampler import _bad_word_ends
from tests.engine.fake_runner import VOCAB, expected_tokens
from tests.service.test_api import client

BASE = {"prompt": "2 3", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True}


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def ids(c, **kw):
    r = c.post("/v1/completions", json={**BASE, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_allowed_token_ids_are_the_only_ones_sampled(c):
    assert ids(c) == expected_tokens([2, 3], 6)
    got = ids(c, allowed_token_ids=[10, 11, 12])
    assert set(got) <= {10, 11, 12}
    # seeded sampling keeps to them too
    assert set(ids(c, allowed_token_ids=[4, 9], temperature=1.0, seed=3)) <= {4, 9}
    # a list holding the greedy tokens changes nothing
    assert ids(c, allowed_token_ids=sorted(set(expected_tokens([2, 3], 6)))) == \
        expected_tokens([2, 3], 6)


def test_bad_words_block_the_word_not_its_start(c):
    plain = expected_tokens([2, 3], 6)  # 7, 15, 31, ...
    assert 7 not in ids(c, bad_words=["7"])  # a one-token word: never
    got = ids(c, bad_words=["7 15"])  # two tokens: 7 may come, 15 not right after it
    assert got[0] == 7 and got[1] != 15
    assert ids(c, bad_words=["15 7"]) == plain  # never completed: nothing changes


def test_the_filters_hold_on_chat_and_are_checked(c):
    r = c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "3 4"}], "max_tokens": 5,
        "temperature": 0, "ignore_eos": True, "allowed_token_ids": [20, 21],
        "return_token_ids": True})
    assert set(r.json()["choices"][0]["token_ids"]) <= {20, 21}
    bad = c.post("/v1/completions", json={**BASE, "allowed_token_ids": [VOCAB + 3]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "allowed_token_ids"
    assert c.post("/v1/completions", json={**BASE, "allowed_token_ids": []}).status_code == 400


def test_bad_word_ends():
    assert _bad_word_ends([(5,), (1, 2), (3, 4, 6)], [9, 3, 4], 50) == [5, 6]
    assert _bad_word_ends([(1, 2)], [1], 50) == [2]
    assert _bad_word_ends([(1, 2)], [], 50) == []
    assert _bad_word_ends([(70,)], [], 50) == []  # past the model's rows


def test_allowed_token_ids_with_a_grammar_is_a_400_naming_it(monkeypatch):
    """docs/api.md: allowed_token_ids goes without a grammar, whose mask could leave no
    token. The scripted model's compiler answers a grammar object (it compiles none), so
    each constraint reaches the check: structured_outputs, response_format and tools on
    chat, a guided_* field on completions."""
    from tests.service import scripted_backend
    from tests.service.test_chat_tools_api import TOOLS, make_client

    monkeypatch.setattr(scripted_backend._NoGrammar, "compile", lambda self, spec: object())
    user = [{"role": "user", "content": "<script5>"}]
    with make_client() as cl:
        for path, body in (
                ("/v1/chat/completions", {"messages": user, "structured_outputs": {
                    "regex": "a+"}}),
                ("/v1/chat/completions", {"messages": user,
                                          "response_format": {"type": "json_object"}}),
                ("/v1/chat/completions", {"messages": user, "tools": TOOLS}),
                ("/v1/completions", {"prompt": "<script5>", "guided_regex": "a+"})):
            r = cl.post(path, json={**body, "max_tokens": 3, "allowed_token_ids": [1, 2]})
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == "allowed_token_ids", r.text
